"""A scenario is a seed: `make_plan(seed, engine)` is the same plan every time, so a failing seed replays exactly."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

# Simulator faults an action may switch on for a while (each is switched off again before the final run).
FAULTS: dict[str, dict[str, Any]] = {
    "429s": {"fail_next": [429] * 6},
    "529s": {"fail_next": [529] * 6},
    "500s": {"error_rate": 0.2, "error_status": 500},
    "drops": {"drop_rate": 0.15},
    "outage": {"outage_for": 1.5},
    "spend_cap": {"error_rate": 1.0, "error_status": "enforced_spend_limit_reached"},
    "slow": {"latency": 0.3},
}


# What each kind does (actions.py): run, kill (-9 after `delay`) and sigint start `runs` apply_llm processes;
# fault runs them under a simulator fault; flag_redo and reset re-ask `ids`; restart_db and crash_db restart
# PostgreSQL under running processes; skew runs processes whose clocks are `skew` seconds off (each its own);
# batch sends Message Batches, the API losing the answer to `lost` creates, and the process dying before it
# creates or confirms one (`die`); budget runs them with one step budget of what is spent plus `extra_usd`;
# workers starts `llmledger worker` processes (PostgreSQL; each a machine of its own), one killed after `delay`.
# Runs that end by themselves or by Ctrl-C may `lose_commits`: the store loses some of their chunks' commits, as
# DuckDB 2.0.1 did (never two in a row, nor before a kill -9: README: Not guaranteed), and on DuckDB some claims.
KINDS = (
    "run",
    "kill",
    "sigint",
    "fault",
    "flag_redo",
    "reset",
    "restart_db",
    "crash_db",
    "skew",
    "batch",
    "budget",
    "workers",
)
LOSING = ("run", "sigint", "fault", "skew", "budget")  # kinds whose processes may lose commits
PROCESSES = ("run", "kill", "sigint", "fault", "restart_db", "crash_db", "skew", "batch", "budget", "workers")


@dataclass(frozen=True)
class Action:
    kind: str  # one of KINDS
    runs: int = 1  # processes started at once
    delay: float = 0.0  # seconds before the kill / Ctrl-C / restart
    concurrency: int = 4
    chunk_size: int = 20
    fault: str = ""
    ids: tuple[int, ...] = ()
    skew: tuple[float, ...] = ()  # skew: each process's clock offset, seconds
    lost: int = 0  # batch: creates whose answer the API loses
    die: str = ""  # batch: "create" or "confirm", where the (first) process dies; "" lives
    extra_usd: float = 0.0  # budget: the budget is what the step has spent plus this
    lose_commits: bool = False  # the store loses some of the processes' chunk commits

    def describe(self) -> str:
        parts = [self.kind]
        if self.kind in PROCESSES:
            parts.append(f"x{self.runs} c={self.concurrency} chunk={self.chunk_size}")
        if self.delay and self.kind not in ("run", "fault", "skew", "batch", "budget"):
            parts.append(f"after {self.delay:.2f}s")
        for label, value in (
            ("fault", self.fault),
            ("ids", list(self.ids)),
            ("skew", list(self.skew)),
            ("lost", self.lost),
            ("die before", self.die),
            ("extra $", self.extra_usd),
            ("losing commits", self.lose_commits),
        ):
            if value:
                parts.append(f"{label}={value}")
        return " ".join(parts)


@dataclass(frozen=True)
class Plan:
    seed: int
    engine: str
    rows: int
    actions: list[Action] = field(default_factory=list)
    distinct: int = 0  # row i's text is row (i % distinct)'s: duplicate texts, each to be paid once; 0: all differ
    provider: str = "anthropic"  # whose API the step's model speaks: "anthropic", or "openai" (model="openai:...")
    rows_per_request: int = 1  # rows packed into one request; above 1 the simulator also gets packs wrong at times

    def text_of(self, row: int) -> str:
        return f"hello message number {row % self.distinct if self.distinct else row}"

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: {self.engine}, {self.provider}, {self.rows} rows"
            + (f", {self.distinct} distinct texts" if self.distinct else "")
            + (f", {self.rows_per_request} rows a request" if self.rows_per_request > 1 else "")
        ]
        lines += [f"  {i + 1}. {a.describe()}" for i, a in enumerate(self.actions)]
        return "\n".join(lines)


def make_plan(seed: int, engine: str) -> Plan:
    rng = random.Random(seed)
    rows = rng.randrange(40, 220)
    distinct = rng.choice([0, 0, rows // 2, rows // 5])
    actions: list[Action] = []
    # a third of the scenarios run an OpenAI model (drawn apart, so the other seeds' plans stay as they were)
    provider = random.Random(f"provider {seed}").choice(["anthropic", "anthropic", "openai"])
    # a quarter pack rows into requests (drawn apart too); half of those also end with a batch action (drawn apart
    # again)
    packing = random.Random(f"packing {seed}").choice([1, 1, 1, 1, 1, 1, 5, 20])
    kinds = ["run", "kill", "kill", "sigint", "fault", "flag_redo", "reset", "skew", "batch", "budget"]
    if engine == "postgresql":
        kinds += ["restart_db", "crash_db", "workers", "workers"]
    for _ in range(rng.randrange(2, 7)):
        kind = rng.choice(kinds)
        runs = rng.choice([1, 1, 2, 3]) if kind in PROCESSES else 1
        if engine == "duckdb" and kind not in ("run", "skew", "budget"):
            runs = min(runs, 2)
        if kind == "workers":
            runs = rng.choice([2, 3])
        ids = tuple(sorted(rng.sample(range(rows), rng.randrange(1, 6)))) if kind in ("flag_redo", "reset") else ()
        concurrency = rng.choice([1, 2, 4] if kind == "budget" else [1, 2, 4, 8, 16])
        actions.append(
            Action(
                kind=kind,
                runs=runs,
                delay=round(rng.uniform(0.2, 2.0), 2),
                concurrency=concurrency,
                chunk_size=rng.choice([1, 5, 20, 200]),
                fault=rng.choice(sorted(FAULTS)) if kind == "fault" else "",
                ids=ids,
                skew=tuple(rng.choice([-2400.0, -90.0, 0.0, 90.0, 2400.0]) for _ in range(runs))
                if kind == "skew"
                else (),
                lost=rng.choice([0, 1, 2]) if kind == "batch" else 0,
                die=rng.choice(["", "", "create", "confirm"]) if kind == "batch" else "",
                extra_usd=round(rng.uniform(0.05, 0.6), 2) if kind == "budget" else 0.0,
            )
        )
    # a third of the runs that may lose commits do (drawn apart: the other seeds' plans stay as they were)
    losing = random.Random(f"lost commits {seed}")
    actions = [
        dataclasses.replace(a, lose_commits=True) if a.kind in LOSING and losing.random() < 0.33 else a for a in actions
    ]
    late = random.Random(f"packed batch {seed}")
    if packing > 1 and late.random() < 0.5:
        actions.append(Action(kind="batch", runs=late.choice([1, 2]), delay=round(late.uniform(0.2, 2.0), 2),
                              concurrency=late.choice([1, 4, 16]), chunk_size=late.choice([5, 20, 200]),
                              lost=late.choice([0, 1]), die=late.choice(["", "", "create", "confirm"])))  # fmt: skip
    return Plan(
        seed=seed, engine=engine, rows=rows, actions=actions, distinct=distinct, provider=provider,
        rows_per_request=packing,
    )  # fmt: skip
