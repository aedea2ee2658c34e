"""The CLI: `llmledger status` and `llmledger demo`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmledger import Simulator, StaleAnswersWarning

from .conftest import frame, subprocess_env


def _cli(*args: str, timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`llmledger ARGS` as a shell runs it (`env=`, `cwd=` as subprocess.run takes them)."""
    return subprocess.run(
        [sys.executable, "-m", "llmledger", *args], capture_output=True, text=True, timeout=timeout, **kwargs
    )


def test_status_draws_each_step_with_its_counts_and_errors_by_kind(run, sim: Simulator, store: Path) -> None:
    sim.configure(poison="number 4")
    run(frame(9), "summary", prompt="Summarize: {text}")
    run(frame(12), "title", prompt="Title: {text}", where="id < 3")
    result = _cli("status", str(store))  # not a terminal: no colour
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "\x1b[" not in result.stdout and "messages (12 rows)" in lines
    summary_row = next(line for line in lines if line.strip().startswith("summary"))
    title_row = next(line for line in lines if line.strip().startswith("title"))
    assert "DONE 8 · FAILED 1 · NOT_STARTED 3" in summary_row
    assert "DONE 3 · NOT_STARTED 9" in title_row
    bar = summary_row.split()[1]  # 30 characters: 8/12 DONE (20), 1/12 FAILED (2.5), 3/12 not started (7.5)
    assert len(bar) == 30 and bar.count("#") == 20 and bar.count("x") in (2, 3) and bar.count(".") in (7, 8)
    assert any('1 rows: 400 BadRequestError (invalid_request_error), e.g. {"id":4}: ' in line for line in lines)

    coloured = _cli("status", str(store), "--color", "always")
    assert "\x1b[31m" in coloured.stdout and "DONE\x1b[0m 8" in coloured.stdout

    typo = _cli("status", str(store), "--table", "mesages")
    assert typo.returncode == 2 and "no table 'mesages'; its tables: ['messages']" in typo.stderr


def test_import_and_the_clis_readers_never_load_an_sdk(run, store: Path) -> None:
    """`import llmledger` took 1.6 s here, three quarters of it importing the anthropic SDK: `llmledger status`,
    `sql` and `export` from a shell send nothing, so they load no SDK (a run imports its own as it sends)."""
    run(frame(3), "summary", prompt="Summarize: {text}")
    reads = [["status", str(store)], ["sql", str(store), "SELECT count(*) FROM messages"]]
    reads.append(["export", str(store), str(store.with_suffix(".csv"))])
    code = (
        "import contextlib, io, sys\n"
        "from llmledger.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    codes = [main(argv) for argv in {reads!r}]\n"
        "print(codes, sorted(m for m in ('anthropic', 'openai') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 0, 0] []", result.stdout + result.stderr


def test_status_of_a_missing_or_foreign_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = _cli("status", str(tmp_path / "nope.duckdb"))
    assert missing.returncode == 2 and "no store at" in missing.stderr
    (tmp_path / "x.txt").write_text("hello")
    foreign = _cli("status", str(tmp_path / "x.txt"))
    assert foreign.returncode == 2 and "not a DuckDB database file" in foreign.stderr


def test_demo_runs_offline_and_shows_the_second_run_paying_nothing(tmp_path: Path) -> None:
    env = subprocess_env("http://127.0.0.1:9")  # never used: the demo starts its own simulator
    env.pop("ANTHROPIC_BASE_URL")
    result = _cli("demo", "--rows", "300", "--store", str(tmp_path / "demo.duckdb"), env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ANTHROPIC_API_KEY is not set: using llmledger's offline simulator" in out
    runs = [
        tuple(int(n.replace(",", "")) for n in re.findall(r"paid ([\d,]+) calls; ([\d,]+) rows? reused", line)[0])
        for line in out.splitlines()
        if line.startswith("-> this run paid")
    ]
    first, second, third = runs
    assert sum(first) == 297 and first[1] > 0, "297 good rows; duplicate reviews reuse one answer"
    assert second == (0, 0)
    assert sum(third) == 3
    assert "nothing was paid twice" in out
    assert "First run: every row is new" in out


def test_demo_run_again_on_its_store_says_what_that_run_did(tmp_path: Path) -> None:
    """0.7 crashed the second time (`max()` of no paid prompts) after calling it a "first run: every row is new"."""
    env = subprocess_env("http://127.0.0.1:9")
    env.pop("ANTHROPIC_BASE_URL")
    store = str(tmp_path / "demo.duckdb")
    assert _cli("demo", "--rows", "100", "--store", store, env=env).returncode == 0
    again = _cli("demo", "--rows", "100", "--store", store, env=env)
    assert again.returncode == 0, again.stderr
    assert "every row is new" not in again.stdout
    assert "a store that already holds this step" in again.stdout
    assert next(line for line in again.stdout.splitlines() if line.startswith("-> this run paid")).startswith(
        "-> this run paid 0 calls"
    )
    assert "answered 0 paid calls" in again.stdout and "nothing was paid twice" in again.stdout


def test_the_simulator_command_takes_every_fault_and_refuses_unknown_models_as_the_api_does() -> None:
    """`llmledger simulator` took only --latency and --rate-limit; now every fault simulate() has, and --model for
    invented ids. A model it does not know gets the API's 404."""
    import socket

    import anthropic

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmledger",
            "simulator",
            "--port",
            str(port),
            "--model",
            "my-model",
            "--refuse",
            "NO",
            "--latency",
            "0.01",
            "--fail-next",
            "529,529",
            "--outage-for",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and "listening" in proc.stdout.readline()
        api = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}/llmledger-simulator", api_key="k", max_retries=0)
        ask = dict(max_tokens=20, messages=[{"role": "user", "content": "hello"}])
        for _ in range(2):
            try:
                api.messages.create(model="my-model", **ask)  # type: ignore[arg-type]
                raise AssertionError("--fail-next was ignored")
            except anthropic.InternalServerError as exc:
                assert exc.status_code == 529
        assert api.messages.create(model="my-model", **ask).stop_reason == "end_turn"  # type: ignore[arg-type]
        assert api.messages.create(model="claude-haiku-4-5", **ask).stop_reason == "end_turn"  # type: ignore[arg-type]
        refused = api.messages.create(model="my-model", max_tokens=20, messages=[{"role": "user", "content": "NO"}])
        assert refused.stop_reason == "refusal"
        try:
            api.messages.create(model="claude-haiku-4-55", **ask)  # type: ignore[arg-type]
            raise AssertionError("a typo of a model was answered")
        except anthropic.NotFoundError as exc:
            assert "model: claude-haiku-4-55" in str(exc)
    finally:
        proc.terminate()
        proc.wait()


def test_table_and_step_are_inferred_and_a_shell_user_without_a_key_is_told_what_to_do(
    tmp_path: Path, sim: Simulator
) -> None:
    """`run`, `flag`, ... needed --table and --step even when the store has one of each; with no key, the error
    named a Python function (llmledger.simulate) to a shell user."""
    import anthropic

    from llmledger import apply_llm

    store = tmp_path / "one.duckdb"
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k")
    apply_llm(frame(3), "summary", prompt="S: {text}", store=store, table="notes", client=client, progress=False)
    flagged = _cli("flag", str(store), "--where", "id = 1", "--reason", "wrong")
    assert flagged.returncode == 0 and "flag: 1 row of notes.summary" in flagged.stdout, flagged.stdout + flagged.stderr
    env = subprocess_env(sim.base_url)
    env.pop("ANTHROPIC_BASE_URL")
    env.pop("ANTHROPIC_API_KEY", None)
    nokey = _cli("run", str(store), env=env)
    assert (
        nokey.returncode == 2
        and "export ANTHROPIC_API_KEY" in nokey.stderr
        and "llmledger simulator" in nokey.stderr
        and "ANTHROPIC_API_KEY=simulated" in nokey.stderr  # the recipe `llmledger simulator` prints, which works
        and "simulate()" not in nokey.stderr
    )
    apply_llm(frame(2), "title", prompt="T: {text}", store=store, table="notes", client=client, progress=False)
    ambiguous = _cli("run", str(store), env=subprocess_env(sim.base_url))
    assert ambiguous.returncode == 2 and "pass --step: table 'notes' has steps ['summary', 'title']" in ambiguous.stderr


def test_odd_arguments_exit_2_with_one_line_naming_them(tmp_path: Path) -> None:
    """Found in a trial: `simulator --port 99999` printed a traceback, `demo --rows -5` ran 2,995 rows, and
    `history --key notanint` on an integer key exited 0 saying nothing."""
    for args, said in [
        (["simulator", "--port", "99999"], "a port is 0 (any free one) to 65535"),
        (["demo", "--rows", "-5"], "'-5': must be more than 0"),
        (["run", "x.duckdb", "--concurrency", "0"], "'0': must be more than 0"),
        (["simulator", "--compatible", "maybe"], "pass true or false"),
    ]:
        done = _cli(*args, cwd=tmp_path)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []
    version = _cli("--version")
    assert version.returncode == 0 and re.fullmatch(r"llmledger \d+\.\d+\.\d+\S*\n", version.stdout)


def test_history_of_a_key_of_another_type_and_a_closed_pipe_say_so_quietly(
    tmp_path: Path, sim: Simulator, client: object
) -> None:
    from llmledger import apply_llm

    store = tmp_path / "s.duckdb"
    apply_llm(frame(30), "summary", prompt="Summarize: {text}", store=store, table="t", client=client, progress=False)
    done = _cli("history", str(store), "--key", "notanint")
    assert done.returncode == 2 and "'notanint' is not an integer" in done.stderr, done.stderr
    import os

    read, write = os.pipe()
    os.close(read)  # `llmledger status | head -1` once head has left: every write fails (EPIPE)
    piped = subprocess.run([sys.executable, "-m", "llmledger", "status", str(store)], stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    os.close(write)
    assert "Traceback" not in piped.stderr and "BrokenPipeError" not in piped.stderr, piped.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_simulator_option_says_in_words_what_it_does_and_its_default() -> None:
    """Found in a trial: `llmledger simulator --help` read "Simulator(latency=...); default 0.0" for most options."""
    import argparse
    import dataclasses

    from llmledger._cli_parser import _FAULT_OPTIONS, _FAULTS, parser
    from llmledger.simulator import Faults

    missing = sorted(set(_FAULTS) - set(_FAULT_OPTIONS) - {"models"})
    assert not missing, f"add these Faults fields to _cli_parser._FAULT_OPTIONS: {missing}"
    assert set(_FAULTS) | {"fail_next", "outage_until", "accuracy", "shutdowns"} == {
        f.name for f in dataclasses.fields(Faults)
    }
    done = _cli("simulator", "--help")
    assert done.returncode == 0 and "Simulator(" not in done.stdout and "default None" not in done.stdout
    simulator = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["simulator"]
    options = [a for a in simulator._actions if a.option_strings and a.dest != "help"]
    assert len(options) == len(_FAULTS) + 3  # --port, --outage-for, --fail-next
    for action in options:
        assert action.help and "default" in action.help and len(action.help) > 30, f"say what it does: {action}"
        assert action.type is not None or action.dest == "models", f"check its value: {action.option_strings}"


def test_odd_faults_and_durations_exit_2_with_one_line_naming_them(tmp_path: Path) -> None:
    """The simulator took `--latency -1`, `--error-rate 5` and `--fail-next bogus` (failing at the first request);
    `status --every inf` and `reset --stale-after 1e300` ended in an OverflowError; `demo --rows 5000` ran 3,000."""
    for args, said in [
        (["simulator", "--port", "0", "--latency", "-1"], "--latency: '-1': must be 0 or more"),
        (["simulator", "--port", "0", "--error-rate", "5"], "--error-rate: '5': must be a share from 0 to 1"),
        (["simulator", "--port", "0", "--fail-next", "529,bogus"], "'bogus': must be an HTTP error status 400..599"),
        (["simulator", "--port", "0", "--today", "tomorrow"], "'tomorrow': must be a day as YYYY-MM-DD"),
        (["simulator", "--port", "0", "--drop-rate", "nan"], "--drop-rate: 'nan': must be a share from 0 to 1"),
        (["status", "s.duckdb", "--every", "inf"], "--every: 'inf': must be more than 0 and at most 86,400"),
        (["reset", "s.duckdb", "--where", "true", "--running", "--stale-after", "1e300"], "'1e300': must be more"),
        (["worker", "s.duckdb", "--chunk-size", "0"], "--chunk-size: '0': must be more than 0"),
        (["run", "s.duckdb", "--concurrency", "5000"], "'5000': must be more than 0 and at most 1,000"),
        (["demo", "--rows", "5000"], "--rows 5000: the bundled reviews have 3,000 rows; pass 1 to 3,000"),
    ]:
        done = _cli(*args, cwd=tmp_path, timeout=60)  # an option taken as it is starts a simulator that never ends
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert list(tmp_path.iterdir()) == [], "nothing was written"


def test_a_port_out_of_range_or_taken_is_one_line_from_the_cli_and_a_valueerror_from_python() -> None:
    """`Simulator(port=99999)` raised OverflowError from the socket; a port in use printed OSError's traceback."""
    import socket

    with pytest.raises(ValueError, match=r"port must be 0 \(any free port\) to 65535, got 99999"):
        Simulator(port=99999)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _cli("simulator", "--port", str(port), timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port 0 for any free one" in done.stderr


@pytest.mark.parametrize("engine", ["duckdb", "postgresql"])
def test_export_says_overwrite_as_each_caller_passes_it_and_writes_one_text_file(
    engine: str, request: Any, client: Any, tmp_path: Path
) -> None:
    """Found in a trial: `llmledger export` told a shell user to "pass overwrite=True"; the Python function says
    overwrite=True and the command line --overwrite (and --step). A CSV or JSON lines file is written chunk by chunk
    from either engine, a structured answer as JSON."""
    import json

    import polars as pl

    import llmledger
    from llmledger import apply_llm

    store: Any = request.getfixturevalue("pg_url") if engine == "postgresql" else str(tmp_path / "s.duckdb")
    common: dict[str, Any] = {"store": store, "table": "t", "client": client, "progress": False}
    apply_llm(frame(3), "s", prompt="Summarize: {text}", **common)
    apply_llm(frame(3), "v", prompt="Judge: {text}", output={"label": str}, **common)
    out = tmp_path / "out.csv"
    first = _cli("export", store, str(out))
    assert first.returncode == 0 and first.stdout.strip() == f"wrote {out}", first.stderr
    read = pl.read_csv(out).sort("id")
    assert read["s"].to_list() == [f"Summary: hello message number {i}" for i in range(3)]
    assert all(isinstance(json.loads(cell)["label"], str) for cell in read["v"])
    again = _cli("export", store, str(out))
    assert again.returncode == 2 and "pass --overwrite to replace it" in again.stderr, again.stderr
    assert "overwrite=True" not in again.stderr
    with pytest.raises(llmledger.InvalidInputError, match="pass overwrite=True to replace it") as raised:
        llmledger.export(store, "t", out)
    assert "--overwrite" not in str(raised.value)
    assert _cli("export", store, str(out), "--overwrite").returncode == 0
    step = _cli("export", store, str(tmp_path / "folder"), "--step", "s")
    assert step.returncode == 2 and "--step writes one file" in step.stderr and "step=" not in step.stderr
    lines = _cli("export", store, str(tmp_path / "out.jsonl"), "--step", "v")
    assert lines.returncode == 0, lines.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(row["v_status"] == "DONE" for row in rows)


def test_the_simulators_printed_recipe_works_exactly_as_printed(tmp_path: Path, sim: Simulator, client: Any) -> None:
    """Found in a trial: `llmledger simulator` said to set ANTHROPIC_BASE_URL, and `llmledger run` then refused
    with "no API key". Its printed export lines, run as printed in a shell, finish a step with `llmledger run` (a
    Claude step and an 'openai:' one) and run `llmledger demo` on that simulator, without saying it costs money."""
    import os
    import shlex

    import openai

    from llmledger import apply_llm

    store = tmp_path / "s.duckdb"
    common: dict[str, Any] = {"store": store, "table": "t", "progress": False, "where": "id < 1"}
    apply_llm(frame(4), "summary", prompt="Summarize: {text}", client=client, **common)
    gpt = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="k")
    apply_llm(frame(4), "gist", prompt="Gist: {text}", model="openai:gpt-6.1-terra", client=gpt, **common)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmledger", "simulator", "--port", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        printed = [proc.stdout.readline() for _ in range(5)]
        exports = [line.strip() for line in printed if line.startswith("export ")]
        assert len(exports) == 2, printed
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
        script = "; ".join([*exports, 'exec "$@"'])  # the lines as a shell runs them, then the command
        shell = ["sh", "-c", script, "sh", sys.executable, "-m", "llmledger"]
        for step in ("summary", "gist"):
            done = subprocess.run(
                [*shell, "run", str(store), "--step", step, "--quiet"], env=env, capture_output=True, text=True
            )
            assert done.returncode == 0, done.stderr
        status = _cli("status", str(store), env=env)
        assert status.stdout.count("DONE 4") == 2, status.stdout
        for name, value in (part.split("=", 1) for line in exports for part in shlex.split(line)[1:]):
            assert name.endswith(("_BASE_URL", "_API_KEY")) and (str(port) in value or value == "simulated")
        demo = subprocess.run(
            [*shell, "demo", "--rows", "10", "--store", str(tmp_path / "demo.duckdb")],
            env=env,
            capture_output=True,
            text=True,
        )
        assert demo.returncode == 0, demo.stderr
        assert f"simulator at http://127.0.0.1:{port}" in demo.stdout and "costs money" not in demo.stdout
    finally:
        proc.terminate()
        proc.wait()


def test_a_worker_says_what_all_its_passes_did_once_at_the_end(run, sim: Simulator, store: Path) -> None:
    """`llmledger worker` printed each pass's summary (every pass of `work()` is a `resume()` that prints its own),
    and each pass's hints again: a worker that ran two passes printed two report lines and the stale hint twice."""
    run(frame(6), "summary", prompt="Summarize: {text}", where="id < 3")
    with pytest.warns(StaleAnswersWarning):  # the 3 answers are stale now; nothing is sent
        run(frame(6), "summary", prompt="Sum up: {text}", where="false")
    env = subprocess_env(sim.base_url) | {"ANTHROPIC_API_KEY": "test-key"}
    done = _cli("worker", str(store), "--poll", "0.2", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert not [line for line in lines if re.match(r"(\[\w+\] )?messages\.summary: ", line)], done.stdout
    assert [line for line in lines if line.startswith("worker done")] == [
        "worker done (completed), all its passes together: 3 rows DONE, 3 paid calls, 0 FAILED, 0 NEEDS_REVIEW"
    ]
    assert lines[0].startswith("worker done"), "the summary comes first, then what to do next"
    assert sum("stale" in line for line in lines[1:]) == 1, done.stdout


def test_history_of_a_key_the_table_lacks_or_of_another_type_says_what_to_pass(
    tmp_path: Path, sim: Simulator, client: object
) -> None:
    """`history --key 999` printed an empty table and exited 0, as for a row without history; `--key notanint` on
    an integer key named Python's key= to a shell user."""
    from llmledger import apply_llm

    store = tmp_path / "s.duckdb"
    apply_llm(frame(30), "summary", prompt="Summarize: {text}", store=store, table="t", client=client, progress=False)
    for key, said in [
        ("999", "--key 999: table 't' has no row whose id is 999 (its id values run from 0 to 29); pass one it has"),
        ("-3", "--key -3: table 't' has no row whose id is -3"),
        ("notanint", "--key 'notanint' is not an integer, and the key of table 't' (id) is one"),
        ("1.5", "pass a row's id, e.g. --key 0"),
    ]:
        done = _cli("history", str(store), "--key", key)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (key, done.stderr)
        assert said in done.stderr and "key=" not in done.stderr, (key, done.stderr)
    there = _cli("history", str(store), "--key", "7")  # a row without history: an empty table, as before
    assert there.returncode == 0 and "replaced_at" in there.stdout, there.stderr


def test_sigterm_stops_a_command_started_with_ctrl_c_ignored() -> None:
    """Found in a CI run: `llmledger simulator` started by a worker that ignores SIGINT (a script's background job
    does) turned SIGTERM into a SIGINT that went nowhere, and never exited (300 s to a timeout, twice)."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "llmledger", "simulator", "--port", str(_free_port())],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert proc.stdout is not None and "listening" in proc.stdout.readline()
        proc.terminate()
        assert proc.wait(timeout=20) is not None
    finally:
        proc.kill()
        proc.wait()
