"""Carrying out a plan against a live simulator and a real store, keeping the books the invariants need:
how many requests could have been in flight at each kill or Ctrl-C, and how many rows were re-asked on purpose."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import polars as pl

import llmledger
from llmledger import Simulator, apply_llm
from llmledger._ledger import open_ledger

from ..conftest import helper_cmd, sigint_as_a_terminal_sends_it, subprocess_env
from .plan import FAULTS, Action, Plan

TABLE, STEP, PROMPT = "messages", "summary", "Summarize: {text}"
CLEAR = {
    "fail_next": [],
    "error_rate": 0.0,
    "drop_rate": 0.0,
    "outage_until": 0.0,
    "latency": 0.02,
    "batch_lose_response": 0,
}
PACK_FAULTS = {"pack_drop": 0.2, "pack_duplicate": 0.2, "pack_swap": 0.2, "pack_invalid": 0.2}  # on all along
OPENAI_MODEL = "openai:gpt-6.1-terra"
WORKER_STALE_AFTER = 3.0  # seconds: a killed worker's rows come back this soon (each worker is its own machine)


@dataclass
class Books:
    """What a scenario did that the invariants must allow for."""

    in_flight_at_stops: int = 0  # Σ over kills and Ctrl-Cs of the requests the stopped process could have had out
    stops: int = 0
    reasked: int = 0  # DONE rows reset or flagged and redone, rows a pack did not answer well: each billed again
    log: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # broken promises seen during an action (a budget overrun)


class Scenario:
    def __init__(self, plan: Plan, sim: Simulator, store: Any, pg_server: Any = None) -> None:
        self.plan, self.sim, self.store, self.pg_server = plan, sim, store, pg_server
        self.books = Books()
        self.model: dict[str, str] = {}  # the default model, or an OpenAI one (model="openai:...")
        self.client: Any = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")
        if plan.provider == "openai":
            import openai

            self.model = {"model": OPENAI_MODEL}
            self.client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="test-key")

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _start(self, action: Action, *extra: str, each: list[list[str]] | None = None) -> list[subprocess.Popen[bytes]]:
        """`action.runs` apply_llm processes; `each[i]`: more arguments for process i."""
        cmd = helper_cmd(
            str(self.store),
            str(self.plan.rows),
            "--concurrency",
            str(action.concurrency),
            "--chunk-size",
            str(action.chunk_size),
            "--commit-every",
            "0.2",
            "--distinct",
            str(self.plan.distinct),
            *(["--model", self.model["model"]] if self.model else []),
            "--rows-per-request",
            str(self.plan.rows_per_request),
            *extra,
        )
        losing = [f"{self.plan.seed}-{len(self.books.log)}"] if action.lose_commits else []
        return [
            subprocess.Popen(
                cmd
                + (each[i] if each else [])
                + ([f"--lose-commits={losing[0]}-{i}", f"--lose-claims={losing[0]}-{i}"] if losing else []),
                env=subprocess_env(self.sim.base_url),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=sigint_as_a_terminal_sends_it,
            )
            for i in range(action.runs)
        ]

    def _workers(self, action: Action) -> list[subprocess.Popen[bytes]]:
        """`llmledger worker` processes, each a machine of its own (none can see another's processes)."""
        env = subprocess_env(self.sim.base_url) | {"ANTHROPIC_API_KEY": "test-key"}
        return [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "llmledger",
                    "worker",
                    str(self.store),
                    "--table",
                    TABLE,
                    "--step",
                    STEP,
                    "--concurrency",
                    str(action.concurrency),
                    "--chunk-size",
                    str(action.chunk_size),
                    "--poll",
                    "0.3",
                    "--stale-after",
                    str(WORKER_STALE_AFTER),
                    "--quiet",
                ],
                env=env | {"LLMLEDGER_HOSTNAME": f"machine-{i}"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(action.runs)
        ]

    @staticmethod
    def _wait(procs: list[subprocess.Popen[bytes]], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError("a run did not end in time (stuck?)") from None

    def _stop(self, action: Action, sig: int) -> None:
        procs = self._start(action)
        time.sleep(action.delay)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(sig)
                self.books.in_flight_at_stops += action.concurrency * self.plan.rows_per_request
                self.books.stops += 1
        self._wait(procs)

    def _exists(self) -> bool:
        return bool(llmledger._ledger.known_steps(self.store, TABLE))

    def _done_among(self, ids: tuple[int, ...]) -> int:
        found = llmledger.sql(
            self.store,
            f"SELECT count(*) AS n FROM {TABLE} WHERE {STEP}_status = 'DONE' AND id IN ({', '.join(map(str, ids))})",
        )
        return int(found["n"][0])

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(
            {"id": list(range(self.plan.rows)), "text": [self.plan.text_of(i) for i in range(self.plan.rows)]}
        )

    def _in_process(self, **options: Any) -> None:
        apply_llm(
            self.frame(),
            STEP,
            prompt=PROMPT,
            store=self.store,
            table=TABLE,
            client=self.client,
            progress=False,
            rows_per_request=self.plan.rows_per_request,
            **self.model,
            **options,
        )

    def _spent(self) -> float:
        return open_ledger(self.store).spent(TABLE, STEP) if self._exists() else 0.0

    def _budget(self, action: Action) -> None:
        """Runs sharing one step budget: what the step spent after them is within the budget, give or take, per
        run, its first request and what answers cost above the average they were reserved at (README: A budget);
        bounded here by (concurrency + 1) of the dearest answer per run."""
        budget = self._spent() + action.extra_usd
        self._wait(self._start(action, "--max-cost", f"{budget:.6f}"))
        if not self._exists():
            return
        spent = self._spent()
        dearest = llmledger.sql(self.store, f"SELECT coalesce(max({STEP}_cost_usd), 0) AS c FROM {TABLE}")["c"][0]
        slack = action.runs * (action.concurrency + 1) * float(dearest) * self.plan.rows_per_request
        if spent > budget + slack + 1e-9:
            self.books.problems.append(
                f"{action.describe()}: the step spent ${spent:.4f}, over its budget "
                f"${budget:.4f} by more than the bound ${slack:.4f}"
            )

    def _kill_a_worker(self, action: Action) -> None:
        """Workers share the step; one is killed -9 after `delay` (its journal is on a machine that never comes
        back: what it answered and had not committed is paid again, README: Not guaranteed)."""
        if not self._exists():
            self._in_process(where="false")  # workers need the step recorded
        procs = self._workers(action)
        time.sleep(action.delay)
        if procs[0].poll() is None:
            procs[0].kill()
            self.books.in_flight_at_stops += action.concurrency * self.plan.rows_per_request + action.chunk_size
            self.books.stops += 1
        self._wait(procs[1:])
        procs[0].wait()

    # -- actions ---------------------------------------------------------------------------------------------------
    def do(self, action: Action) -> None:
        self.books.log.append(action.describe())
        if action.kind == "run":
            self._wait(self._start(action))
        elif action.kind == "kill":
            self._stop(action, signal.SIGKILL)
        elif action.kind == "sigint":
            self._stop(action, signal.SIGINT)
        elif action.kind == "fault":
            fault = FAULTS[action.fault]
            if action.fault == "spend_cap" and self.plan.provider == "openai":  # OpenAI says it its own way
                fault = {**fault, "error_status": "insufficient_quota"}
            self.sim.configure(**fault)
            try:
                self._wait(self._start(action))
            finally:
                self.sim.configure(**CLEAR)
        elif action.kind in ("flag_redo", "reset") and self._exists():
            where = f"id IN ({', '.join(map(str, action.ids))})"
            done = self._done_among(action.ids)
            if action.kind == "reset":
                llmledger.reset(self.store, TABLE, STEP, where=where)
            else:
                llmledger.flag(self.store, TABLE, STEP, where=where, reason="explorer")
                with contextlib.suppress(llmledger.LedgerError):  # whatever stops it, the final run finishes the step
                    self._in_process(redo="flagged")
            self.books.reasked += done
        elif action.kind == "skew":
            self._wait(self._start(action, each=[["--clock-skew", str(skew)] for skew in action.skew]))
        elif action.kind == "batch":
            self.sim.configure(batch_lose_response=action.lost)
            try:
                die = [["--die-before", action.die]] if action.die else []
                self._wait(self._start(action, "--mode", "batch", each=die + [[]] * (action.runs - len(die))))
            finally:
                self.sim.configure(**CLEAR)
        elif action.kind == "budget":
            self._budget(action)
        elif action.kind == "workers" and self.pg_server is not None:
            self._kill_a_worker(action)
        elif action.kind in ("restart_db", "crash_db") and self.pg_server is not None:
            procs = self._start(action)
            time.sleep(action.delay)
            if action.kind == "restart_db":
                self.pg_server.restart()
            else:
                self.pg_server._run("pg_ctl", "-D", str(self.pg_server.data), "-m", "immediate", "-w", "stop")
                self.pg_server.start()
            self._wait(procs)

    def run(self) -> Books:
        self.sim.configure(**CLEAR, **(PACK_FAULTS if self.plan.rows_per_request > 1 else {}))
        for action in self.plan.actions:
            self.do(action)
        self.sim.configure(**CLEAR)
        self._in_process()  # the clean final run: every row must end DONE
        if self.plan.rows_per_request > 1:  # rows a pack did not answer well were asked again alone, paid again
            found = llmledger.sql(
                self.store,
                "SELECT coalesce(sum(rows - kept), 0)::BIGINT AS n FROM llmledger_packs WHERE answer IS NOT NULL",
            )  # a batch's pack the API did not answer (expired, cancelled) was not paid
            self.books.reasked += int(found["n"][0])
        return self.books


def store_for(engine: str, folder: Path, pg_server: Any) -> Any:
    """A fresh store: a DuckDB file, or a new database keeping PostgreSQL's default synchronous_commit (the test
    server turns it off for speed, which forgets acknowledged commits at a crash)."""
    if engine == "duckdb":
        return folder / "ledger.duckdb"
    import psycopg

    url = pg_server.new_database()
    with psycopg.connect(pg_server.url(), autocommit=True) as con:
        con.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET synchronous_commit = on')
    return url
