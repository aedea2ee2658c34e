"""How claimed rows get answers.

`scheduler.py` claims ahead, queues, journals, commits in chunks and keeps the
run's accounting (what it may spend under a budget: `spending.py`); it hands
each claimed row to a sender. `online.py` is the
sender that calls the Messages API in real time (dedupe, retries, circuit
breaker, pacing from `pacing.py`; one call and its error classes in `client.py`;
the options a run sends with in `config.py`).
`batch.py` is the sender beside it for Message Batches (half price, answers
within 24 h): it claims like the scheduler and sends batches through the
ledger's intent and confirm transactions; `collect.py` settles and collects
the step's batches, in whatever process looks next, and `merge.py` merges what
an ended batch brings back. `recorder.py` turns an answer,
online or from a batch, into a result row, counted and priced the same way.
"""
