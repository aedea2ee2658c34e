"""How claimed rows get answers.

`scheduler.py` claims ahead, queues, journals, commits in chunks and keeps the
run's accounting; it hands each claimed row to a sender. `online.py` is the
sender that calls the Messages API in real time (dedupe, retries, circuit
breaker, pacing from `pacing.py`; one call and its error classes in `api.py`).
A batch sender will sit beside it and reuse the scheduler.
"""
