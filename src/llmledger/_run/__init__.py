"""One call from arguments to answers: `api.py` checks the arguments and records the frame, `run.py` drives the
senders and reports to whatever watcher it is handed, `pipeline.py`, `worker.py` and `estimate.py` are built on
them."""
