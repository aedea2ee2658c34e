"""A scenario is a seed: `make_plan(seed, engine)` is the same plan every time, so a failing seed replays exactly."""

from __future__ import annotations

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


@dataclass(frozen=True)
class Action:
    kind: str  # run | kill | sigint | fault | flag_redo | reset | restart_db | crash_db | wait
    runs: int = 1  # processes started at once (run, kill, sigint)
    delay: float = 0.0  # seconds before the kill / Ctrl-C / restart
    concurrency: int = 4
    chunk_size: int = 20
    fault: str = ""
    ids: tuple[int, ...] = ()

    def describe(self) -> str:
        parts = [self.kind]
        if self.kind in ("run", "kill", "sigint"):
            parts.append(f"x{self.runs} c={self.concurrency} chunk={self.chunk_size}")
        if self.delay:
            parts.append(f"after {self.delay:.2f}s")
        if self.fault:
            parts.append(self.fault)
        if self.ids:
            parts.append(f"ids={list(self.ids)}")
        return " ".join(parts)


@dataclass(frozen=True)
class Plan:
    seed: int
    engine: str
    rows: int
    actions: list[Action] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"seed {self.seed}: {self.engine}, {self.rows} rows"]
        lines += [f"  {i + 1}. {a.describe()}" for i, a in enumerate(self.actions)]
        return "\n".join(lines)


def make_plan(seed: int, engine: str) -> Plan:
    rng = random.Random(seed)
    rows = rng.randrange(40, 220)
    actions: list[Action] = []
    kinds = ["run", "kill", "kill", "sigint", "fault", "flag_redo", "reset"]
    if engine == "postgresql":
        kinds += ["restart_db", "crash_db"]
    for _ in range(rng.randrange(2, 7)):
        kind = rng.choice(kinds)
        runs = rng.choice([1, 1, 2, 3]) if kind in ("run", "kill", "sigint") else 1
        if engine == "duckdb" and kind != "run":
            runs = min(runs, 2)
        ids = tuple(sorted(rng.sample(range(rows), rng.randrange(1, 6)))) if kind in ("flag_redo", "reset") else ()
        actions.append(Action(kind=kind, runs=runs, delay=round(rng.uniform(0.2, 2.0), 2),
                              concurrency=rng.choice([1, 2, 4, 8, 16]), chunk_size=rng.choice([1, 5, 20, 200]),
                              fault=rng.choice(sorted(FAULTS)) if kind == "fault" else "", ids=ids))
    return Plan(seed=seed, engine=engine, rows=rows, actions=actions)
