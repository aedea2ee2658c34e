"""`python -m tests.explorer`: replay one seed, or explore many, and print the figures (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmledger import Simulator

from .actions import Scenario, store_for
from .invariants import repaid, violations
from .plan import make_plan


@dataclass
class Figures:
    scenarios: int = 0
    stops: int = 0
    billed: int = 0
    distinct: int = 0
    reasked: int = 0
    repaid: int = 0
    worst_per_stop: float = 0.0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.scenarios} scenarios, {self.stops} kills/Ctrl-Cs; billed {self.billed:,} for {self.distinct:,} "
            f"distinct prompts ({self.reasked} re-asked on purpose); re-paid {self.repaid} "
            f"(at most {self.worst_per_stop:.1f} per stop in one scenario); {len(self.failures)} failed"
        )


def run_one(seed: int, engine: str, pg_server: Any = None) -> tuple[list[str], Any, Any]:
    """Run scenario `seed` on `engine`; return (violations, books, simulator stats)."""
    plan = make_plan(seed, engine)
    with tempfile.TemporaryDirectory() as folder, Simulator(latency=0.02, seed=seed) as sim:
        store = store_for(engine, Path(folder), pg_server)
        books = Scenario(plan, sim, store, pg_server).run()
        return violations(store, sim, plan, books), books, sim


def explore(
    seeds: list[int],
    engines: list[str],
    *,
    pg_server: Any = None,
    budget_seconds: float | None = None,
    out: Any = sys.stdout,
) -> Figures:
    figures = Figures()
    started = time.monotonic()
    for seed in seeds:
        for engine in engines:
            if budget_seconds is not None and time.monotonic() - started > budget_seconds:
                return figures
            plan = make_plan(seed, engine)
            try:
                problems, books, sim = run_one(seed, engine, pg_server)
            except Exception as exc:  # a scenario that crashes is a failure to replay too
                problems, books, sim = [f"{type(exc).__name__}: {exc}"], None, None
            figures.scenarios += 1
            if books is not None and sim is not None:
                paid = sim.paid_prompts()
                figures.stops += books.stops
                figures.billed += sum(paid.values())
                figures.distinct += len(paid)
                figures.reasked += books.reasked
                again = repaid(sim, books)
                figures.repaid += again
                if books.stops:
                    figures.worst_per_stop = max(figures.worst_per_stop, again / books.stops)
            if problems:
                report = (
                    f"FAILED {plan.describe()}\n"
                    + "\n".join(f"  - {p}" for p in problems[:10])
                    + f"\n  replay: python -m tests.explorer --seed {seed} --engine {engine}"
                )
                figures.failures.append(report)
                print(report, file=out, flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.explorer", description=__doc__)
    p.add_argument("--seed", type=int, help="replay this one seed")
    p.add_argument("--seeds", type=int, default=20, help="how many seeds to explore (from --start)")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--engine", choices=["duckdb", "postgresql", "both"], default="both")
    p.add_argument("--budget-seconds", type=float, default=None, help="stop starting scenarios after this long")
    p.add_argument("--provider", choices=["anthropic", "openai"], help="only the seeds whose step runs on it")
    a = p.parse_args(argv)
    engines = ["duckdb", "postgresql"] if a.engine == "both" else [a.engine]
    seeds = [a.seed] if a.seed is not None else list(range(a.start, a.start + a.seeds))
    if a.provider is not None and a.seed is None:
        seeds = [s for s in seeds if make_plan(s, engines[0]).provider == a.provider]
    server = None
    if "postgresql" in engines:
        from ..helpers.postgres import Server, find_bindir

        bindir = find_bindir()
        if bindir is None:
            sys.exit("PostgreSQL's server is not installed (apt-get install -y postgresql), or pass --engine duckdb")
        server = Server(bindir)
        server.start()
    try:
        if a.seed is not None:
            print(make_plan(a.seed, engines[0]).describe())
        figures = explore(seeds, engines, pg_server=server, budget_seconds=a.budget_seconds)
    finally:
        if server is not None:
            server.close()
    print(figures.line())
    return 1 if figures.failures else 0


if __name__ == "__main__":
    sys.exit(main())
