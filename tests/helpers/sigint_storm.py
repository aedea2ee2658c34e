"""Bursts of Ctrl-C at foreground apply_llm calls, then one more apply_llm in the same process.

usage: sigint_storm.py STORE ROWS ROUNDS SEED DEADLINE
Talks to ANTHROPIC_BASE_URL with the key in LLMLEDGER_TEST_KEY. Each round runs apply_llm on ROWS new rows while a
thread sends SIGINT to this process many times at random short intervals, from a random moment on: so they land
as the call starts, mid-run, during the wind-down after the first one, and as it finishes. The handler raises
KeyboardInterrupt (as Python's own does) only while llmledger's code is on the main thread's stack: a Ctrl-C
between the script's own lines is the script's business, not what is tested. Then a last apply_llm over every
round's rows, with no interrupts, must finish within DEADLINE seconds (else every thread's stack is printed and
the process exits); it prints how long it took and the rows' statuses.
"""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import sys
import threading
import time
from types import FrameType

import anthropic
import polars as pl

from llmledger import apply_llm

store, rows, rounds, seed, deadline = (
    sys.argv[1],
    int(sys.argv[2]),
    int(sys.argv[3]),
    int(sys.argv[4]),
    float(sys.argv[5]),
)
rng = random.Random(seed)
SOURCE = os.path.dirname(os.path.abspath(sys.modules["llmledger"].__file__ or ""))


def in_llmledger(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(SOURCE):
            return True
        frame = frame.f_back
    return False


def on_sigint(signum: int, frame: FrameType | None) -> None:
    if in_llmledger(frame):
        raise KeyboardInterrupt


def storm(count: int, delay: float, spread: float) -> None:
    time.sleep(delay)
    for _ in range(count):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(rng.uniform(0, spread))


def call(start: int, n: int) -> pl.DataFrame:
    ids = list(range(start, start + n))
    return apply_llm(
        pl.DataFrame({"id": ids, "text": [f"hello message number {i}" for i in ids]}),
        "summary",
        prompt="Summarize: {text}",
        store=store,
        table="messages",
        client=anthropic.AsyncAnthropic(api_key=os.environ["LLMLEDGER_TEST_KEY"]),
        concurrency=4,
        commit_every=0.1,
        progress=False,
    )


signal.signal(signal.SIGINT, on_sigint)
for i in range(rounds):
    thread = threading.Thread(target=storm, args=(rng.randint(50, 300), rng.uniform(0, 0.6), rng.uniform(0.0002, 0.01)))
    thread.start()
    began = time.monotonic()
    try:
        call(i * rows, rows)
        ended = "finished"
    except KeyboardInterrupt:
        ended = "interrupted"
    print("round", i, ended, f"{time.monotonic() - began:.2f}s", flush=True)
    thread.join()
faulthandler.dump_traceback_later(deadline, exit=True)
began = time.monotonic()
out = call(0, rounds * rows)
print(f"last run {time.monotonic() - began:.1f}s", flush=True)
print("statuses", dict(out["summary_status"].value_counts().iter_rows()), flush=True)
