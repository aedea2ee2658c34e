"""The promise, checked against what the simulator billed after a scenario."""

from __future__ import annotations

from typing import Any

import llmledger
from llmledger import Simulator
from llmledger.simulator import default_reply

from .actions import STEP, TABLE, Books
from .plan import Plan


def violations(store: Any, sim: Simulator, plan: Plan, books: Books) -> list[str]:
    """What is wrong with the store after a scenario (empty: the promise held).

    - every row is DONE (the final run had no faults), none RUNNING;
    - every row holds the answer to its own request (the simulator's answer is a function of the prompt), and its
      stored request is its own row's;
    - requests billed more than once, less the rows re-asked on purpose, are at most what could have been in
      flight at the kills and Ctrl-Cs (each process: its concurrency; a worker's machine that never comes back: its
      uncommitted answers too), identical texts included: rows with one request are paid once;
    - what an action saw break (`books.problems`: a step budget overrun).
    """
    problems = list(books.problems)
    rows = plan.rows
    found = llmledger.sql(
        store, f"SELECT id, {STEP} AS answer, {STEP}_status AS status, {STEP}_prompt AS prompt FROM {TABLE} ORDER BY id"
    )
    if found.height != rows:
        problems.append(f"the table has {found.height} rows, the frame {rows}")
    for row_id, answer, status, prompt in found.rows():
        if status != "DONE":
            problems.append(f"row {row_id} is {status} after the clean final run")
        if prompt != f"Summarize: {plan.text_of(row_id)}":
            problems.append(f"row {row_id} holds another row's request: {prompt!r}")
        elif answer != default_reply(prompt):
            problems.append(f"row {row_id} shows an answer that is not to its own request: {answer!r}")
    paid = sim.paid_prompts()
    extra = sum(n - 1 for n in paid.values() if n > 1) - books.reasked
    if extra > books.in_flight_at_stops:
        worst = sorted(paid.items(), key=lambda kv: -kv[1])[:3]
        problems.append(
            f"{extra} requests paid again beyond those re-asked on purpose ({books.reasked}), more than "
            f"could have been in flight at the stops ({books.in_flight_at_stops}); most paid: {worst}"
        )
    return problems


def repaid(sim: Simulator, books: Books) -> int:
    """Requests paid more than once, less those re-asked on purpose."""
    return max(0, sum(n - 1 for n in sim.paid_prompts().values() if n > 1) - books.reasked)
