"""The command line's argument parser (`parser()`): every verb, its aliases, its options and their help, and the
usage text `llmledger --help` shows (`USAGE`); `--FAULT` options are made from the simulator's `Faults`.

Its own module because it only describes the command line: `cli.py` runs the verbs it parses, and
`docs/gen_reference.py` writes the CLI reference from this parser's `--help` without running anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from datetime import date
from typing import Any, NoReturn

from llmledger._run.options import MAX_CHUNK, MAX_CONCURRENCY, MAX_STALE_AFTER
from llmledger.simulator.faults import ERRORS, Faults

# What `llmledger --help` shows above the verbs.
USAGE = """The command line: each verb is a thin twin of a Python function.

    llmledger status STORE [--table T]          llmledger.show(): every step as a bar of rows by status
                  [--color auto|always|never] [--every N]
    llmledger run STORE --table T --step S      llmledger.resume(): finish a step from the store alone
                  [--mode batch [--no-wait]]    (and collect its Message Batches)
    llmledger worker STORE --table T --step S   llmledger.work(): drain a step with any number of other workers
                  [--concurrency N]             (on PostgreSQL, from many machines)
    llmledger sql STORE "SELECT ..." [--write]  llmledger.sql() (reads unless --write)
    llmledger compare STORE --table T --steps S1 S2 ...               llmledger.compare(): steps side by side
    llmledger models [--provider P]                                   llmledger.models(): prices and lifecycles
    llmledger flag STORE --table T --step S --where W --reason R      llmledger.flag(): mark answers for redo
    llmledger reset STORE --table T --step S --where W                llmledger.reset(): rows back to NOT_STARTED
    llmledger history STORE --table T --step S [--key K]              llmledger.history(): replaced answers
    llmledger export STORE --table T PATH [--step S] [--overwrite]    llmledger.export(): Parquet, CSV or JSON lines
    llmledger restore PATH STORE                                      llmledger.restore(): a store from an export
    llmledger copy SOURCE TARGET                                      llmledger.copy(): DuckDB <-> PostgreSQL
    llmledger demo [--rows N] [--store PATH]    the demo on the bundled reviews
    llmledger simulator [--port P] [--FAULT X]  the offline Messages API, for your own tests

`show`, `resume` and `work` are the same verbs as `status`, `run` and `worker`, named like their Python twins.
--table and --step may be left out when the store has only one.
STORE is a DuckDB file, or a PostgreSQL URL (postgresql://user@host:5432/db; pip install 'llmledger[postgresql]').
"""

# Verbs also reachable by their Python twin's name: `llmledger show` is `llmledger status`, and so on.
_ALIASES = {"status": "show", "run": "resume", "worker": "work"}


class _Parser(argparse.ArgumentParser):
    """A bad argument exits 2 with one line naming it, as the Python twin's error would (not the whole usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def positive(kind: type[int] | type[float], *, zero: bool = False, most: float | None = None) -> Any:
    """An argparse type: a number of `kind` above 0 (or 0 too), and at most `most`: what the Python twin accepts, so a
    bad value exits 2 with one line naming it (`demo --rows -5` ran 2,995 rows). Infinity and NaN are refused too:
    `status --every inf` and `reset --stale-after 1e300` ended in an OverflowError's traceback."""
    allowed = f"{'0 or more' if zero else 'more than 0'}" + (f" and at most {most:,g}" if most is not None else "")

    def convert(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value) or not (value >= 0 if zero else value > 0) or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {allowed}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its message
    return convert


def port(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535 (`simulator --port 99999` printed a traceback)."""
    value = positive(int, zero=True)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 0 (any free one) to 65535")
    return int(value)


def parser() -> argparse.ArgumentParser:
    """The whole command line (docs/gen_reference.py writes the CLI reference from its `--help`)."""
    top = _Parser(prog="llmledger", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    from llmledger._version import __version__

    top.add_argument("--version", action="version", version=f"llmledger {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    def verb(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        aliases = [_ALIASES[name]] if name in _ALIASES else []
        made = sub.add_parser(name, aliases=aliases, **kwargs)
        made.set_defaults(verb=name)
        return made

    p_status = verb(
        "status", help="llmledger.show(): every step as a bar of rows by status, its cost, claims and errors"
    )
    p_status.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_status.add_argument("--table", default=None, help="only this table")
    p_status.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the bars (auto: when the terminal shows colour and NO_COLOR is unset)",
    )
    p_status.add_argument(
        "--every", type=positive(float, most=_DAY), default=None, help="redraw every N seconds until Ctrl-C"
    )

    p_run = verb("run", help="llmledger.resume(): finish a step that apply_llm started, from the store alone")
    p_run.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_run.add_argument("--table", default=None, help=_INFERRED)
    p_run.add_argument("--step", default=None, help=_INFERRED)
    p_run.add_argument("--concurrency", type=positive(int, most=MAX_CONCURRENCY), default=16, help=_CONCURRENCY)
    p_run.add_argument("--where", default=None, help="SQL predicate over the fact table narrowing the rows")
    p_run.add_argument(
        "--redo",
        choices=["stale", "flagged", "all"],
        default=None,
        help="also re-send stale answers (stale), flagged rows (flagged) or every matching row (all)",
    )
    p_run.add_argument("--max-attempts", type=positive(int), default=3, help=_ATTEMPTS)
    p_run.add_argument("--quiet", action="store_true", help="no progress bar")
    p_run.add_argument(
        "--mode",
        choices=["online", "batch", "auto"],
        default="online",
        help="send the rows online or as Message Batches (half price); batches the step sent "
        "earlier are collected first either way",
    )
    p_run.add_argument(
        "--no-wait", action="store_true", help="with --mode batch: return once the batches are submitted"
    )

    p_worker = verb(
        "worker",
        help="llmledger.work(): work on a step together with other workers until none of it "
        "is left (a PostgreSQL store lets many machines share one step)",
    )
    p_worker.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_worker.add_argument("--table", default=None, help=_INFERRED)
    p_worker.add_argument("--step", default=None, help=_INFERRED)
    p_worker.add_argument("--concurrency", type=positive(int, most=MAX_CONCURRENCY), default=16, help=_CONCURRENCY)
    p_worker.add_argument(
        "--chunk-size",
        type=positive(int, most=MAX_CHUNK),
        default=200,
        help="rows claimed ahead and committed together (smaller shares a small step more evenly)",
    )
    p_worker.add_argument("--where", default=None, help="SQL predicate over the fact table narrowing the rows")
    p_worker.add_argument("--max-attempts", type=positive(int), default=3, help=_ATTEMPTS)
    p_worker.add_argument(
        "--poll",
        type=positive(float, most=_DAY),
        default=5.0,
        help="seconds between looks while other workers hold rows (default 5)",
    )
    p_worker.add_argument(
        "--stale-after",
        type=positive(float, most=_STALE_AFTER),
        default=1800.0,
        help="seconds after which a claim whose worker stopped renewing it is taken over "
        "(default 1800; claims are renewed every min(60, stale-after/4) seconds)",
    )
    p_worker.add_argument("--quiet", action="store_true", help="no progress bar")
    for p in (p_run, p_worker):
        _server_options(p)

    p_compare = verb(
        "compare",
        help="llmledger.compare(): several steps' answers to the same rows, side by side (one step per model)",
    )
    p_compare.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_compare.add_argument("--table", default=None, help=_INFERRED)
    p_compare.add_argument("--steps", nargs="+", required=True, help="two or more steps of the table")
    p_compare.add_argument("--where", default=None, help="SQL predicate over the fact table narrowing the rows")
    p_compare.add_argument(
        "--show",
        type=positive(int, zero=True),
        default=10,
        metavar="N",
        help="print the first N rows where they differ (default 10; 0: none)",
    )

    p_models = verb(
        "models",
        help="llmledger.models(): the models llmledger knows, their prices, what they support and their lifecycle",
    )
    p_models.add_argument("--provider", choices=("anthropic", "openai"), default=None, help="one provider's models")

    p_sql = verb("sql", help="run a SQL query on the store and print the result")
    p_sql.add_argument("store")
    p_sql.add_argument("query")
    p_sql.add_argument("--write", action="store_true", help="allow a statement that writes (llmledger.sql(write=True))")

    p_flag = verb("flag", help="flag a step's answers on matching rows for redo (redo='flagged')")
    p_reset = verb("reset", help="put a step back to NOT_STARTED on matching rows (answers to history)")
    p_history = verb("history", help="a step's replaced answers next to the current ones")
    for p in (p_flag, p_reset, p_history):
        p.add_argument("store", help="the DuckDB file or postgresql:// URL")
        p.add_argument("--table", default=None, help=_INFERRED)
        p.add_argument("--step", default=None, help=_INFERRED)
    for p in (p_flag, p_reset):
        p.add_argument("--where", required=True, help='SQL predicate over the fact table, e.g. "id IN (3, 7)"')
    p_flag.add_argument("--reason", required=True, help="what is wrong with these answers")
    p_flag.add_argument("--by", default=None, help="who flags them (default: the login name)")
    p_reset.add_argument(
        "--running",
        action="store_true",
        help="also take back RUNNING rows whose holder is gone (a dead process on this host, or a "
        "holder elsewhere whose claims were not renewed for --stale-after seconds or whose "
        "leases lapsed, in the database's clock)",
    )
    p_reset.add_argument(
        "--stale-after",
        type=positive(float, most=_STALE_AFTER),
        default=1800.0,
        help="seconds (with --running; default 1800)",
    )
    p_history.add_argument("--key", default=None, help="only the row with this key (single-column keys)")

    p_export = verb(
        "export", help="write a table (a folder of Parquet files, or one .parquet/.csv/.jsonl file) or one step"
    )
    p_export.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_export.add_argument("--table", default=None, help=_INFERRED)
    p_export.add_argument(
        "path",
        help="a new folder, named without a suffix (the table and its bookkeeping as Parquet files, which restore "
        "reads), or one file ending in .parquet, .csv, .jsonl or .ndjson (JSON lines): the table alone, or with "
        "--step one step's view; any other suffix is refused",
    )
    p_export.add_argument(
        "--step", default=None, help="only this step's view, as one file (.parquet, .csv, .jsonl or .ndjson)"
    )
    p_export.add_argument(
        "--overwrite", action="store_true", help="replace an existing file, or a folder an earlier export wrote"
    )
    p_restore = verb("restore", help="rebuild a table in a store from llmledger export's folder")
    p_restore.add_argument("path", help="the folder export wrote")
    p_restore.add_argument("store", help="the DuckDB file or postgresql:// URL (created if missing)")

    p_copy = verb("copy", help="copy a whole ledger into a new DuckDB file or an empty PostgreSQL database")
    p_copy.add_argument("source", help="the DuckDB file or postgresql:// URL to copy")
    p_copy.add_argument("target", help="a new DuckDB file, or a postgresql:// URL of a database without a ledger")

    p_demo = verb("demo", help="run a step over the bundled reviews dataset")
    p_demo.add_argument("--store", default=None, help="ledger file (default: a fresh one in a temp folder)")
    p_demo.add_argument(
        "--rows",
        type=positive(int),
        default=None,
        help="rows to use, at most the 3,000 there are (default: all 3,000 on the simulator, 20 on the real API)",
    )

    p_sim = verb(
        "simulator",
        help="serve the offline Messages API simulator (every fault simulate() "
        "takes is an option: --latency 0.1 --rate-limit 50 --error-rate 0.05 ...)",
    )
    p_sim.add_argument(
        "--port",
        type=port,
        default=8765,
        help="the TCP port on 127.0.0.1 to listen on, 0 to 65535 (0: any free one, printed when it starts; "
        "default 8765)",
    )
    _fault_options(p_sim)
    return top


def _server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url",
        default=None,
        metavar="URL",
        help="send to this server that answers the Messages API (vLLM, Ollama, llama.cpp, a LiteLLM proxy) "
        "instead of Anthropic's: the one the step's requests name (apply_llm(..., base_url=...))",
    )
    parser.add_argument(
        "--gateway",
        action="store_true",
        help="--base-url is a gateway to the provider's own API (a LiteLLM proxy, Portkey, Helicone, Cloudflare AI "
        "Gateway): its batches, prices and rate-limit headers are used (apply_llm(..., gateway=True))",
    )
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="the environment variable holding --base-url's key, if it needs one (a key on the command line "
        "would show in the process list and the shell's history)",
    )


_DAY = 86_400.0  # redraws and polls further apart than a day are a typo (time.sleep refuses far larger ones)
_STALE_AFTER = MAX_STALE_AFTER.total_seconds()
_CONCURRENCY = f"requests in flight at once, at most {MAX_CONCURRENCY:,} (default 16)"
_ATTEMPTS = "tries per row before it is FAILED (default 3)"


def _share(text: str) -> float:
    """A share of requests, 0 to 1 (`--error-rate 5` was taken, and every request failed)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r}: must be a share from 0 to 1 (0.05: one request in twenty)")
    return value


_NAMED_ERRORS = sorted(name for name in ERRORS if isinstance(name, str))


def _status(text: str) -> int | str:
    """An error the simulator can send: an HTTP error status, or one of its named cases. Checked here: the
    simulator took `--fail-next bogus` and failed at the first request instead."""
    text = text.strip()
    if text.isdigit() and 400 <= int(text) <= 599:
        return int(text)
    if text in _NAMED_ERRORS:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r}: must be an HTTP error status 400..599 or one of {', '.join(_NAMED_ERRORS)}"
    )


def _statuses(text: str) -> list[int | str]:
    """`--fail-next 529,529,429`: errors for the first requests, in order."""
    return [_status(part) for part in text.split(",")]


def _day(text: str) -> str:
    """A day as YYYY-MM-DD, the text `Faults.today` compares shutdown dates with."""
    try:
        return date.fromisoformat(text.strip()).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a day as YYYY-MM-DD, e.g. 2026-12-01") from None


def _flag(text: str) -> bool:
    """A true/false option's value, as a shell user writes it."""
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: pass true or false")


_FAULTS = {
    f.name: f
    for f in dataclasses.fields(Faults)
    if f.name not in ("fail_next", "outage_until", "accuracy", "shutdowns")
}
_FAULTS_AS_TOLD = ("outage_for", "fail_next")  # as simulate() takes them: seconds from now; a list of faults

_SECONDS = positive(float, zero=True)
_COUNT = positive(int, zero=True)
_RATE = positive(float)

# Each fault's option: what its value must be, a metavar, and what it does in words, its default included (the
# generated `Simulator(latency=...); default 0.0` told a shell user nothing). A field added to `Faults` needs a line
# here: tests/test_cli.py checks that every one has.
_FAULT_OPTIONS: dict[str, tuple[Callable[[str], Any], str, str]] = {
    "latency": (_SECONDS, "SECONDS", "seconds to wait before each answer (default 0)"),
    "jitter": (_SECONDS, "SECONDS", "up to this many seconds more, at random, on each answer (default 0)"),
    "rate_limit": (_RATE, "N", "requests per second it answers; more get a 429 with retry-after (default: no limit)"),
    "burst": (_RATE, "N", "requests it takes at once before --rate-limit applies (default: one second's worth)"),
    "input_tokens_per_minute": (_RATE, "N", "input tokens per minute it takes; more get a 429 (default: no limit)"),
    "output_tokens_per_minute": (
        _RATE,
        "N",
        "output tokens per minute it gives; max_tokens is reserved, the unused part refunded (default: no limit)",
    ),
    "tokens_per_minute": (
        _RATE,
        "N",
        "OpenAI's one token limit per minute: input and max output tokens reserved, the unused output refunded "
        "(default: no limit)",
    ),
    "token_burst": (_RATE, "SECONDS", "seconds' worth of tokens the token limits hold at once (default 60, the API's)"),
    "error_rate": (_share, "SHARE", "share of requests, 0 to 1, answered with --error-status (default 0)"),
    "error_status": (
        _status,
        "ERROR",
        "the error --error-rate sends: an HTTP status, or a named case such as no_retry or "
        "enforced_spend_limit_reached (default 529, overloaded)",
    ),
    "drop_next": (_COUNT, "N", "hang up on the next N requests without answering (default 0)"),
    "drop_rate": (_share, "SHARE", "share of requests, 0 to 1, hung up on without an answer (default 0)"),
    "outage_status": (_status, "ERROR", "the error every request gets during --outage-for (default 529, overloaded)"),
    "poison": (str, "TEXT", "a request whose prompt contains this text gets a 400 (default: none)"),
    "refuse": (
        str,
        "TEXT",
        "a request whose prompt contains this text is refused (stop_reason refusal; default: none)",
    ),
    "bad_json": (
        str,
        "TEXT",
        "structured answers to prompts containing this text are JSON that does not parse (default: none)",
    ),
    "bad_json_once": (
        str,
        "TEXT",
        "as --bad-json, on a prompt's first request only: the follow-up naming the error gets valid JSON "
        "(default: none)",
    ),
    "truncate": (str, "TEXT", "answers to prompts containing this text are cut at max_tokens (default: none)"),
    "api_key": (str, "KEY", "the only API key it accepts; any other gets a 401 (default: any key)"),
    "batch_delay": (_SECONDS, "SECONDS", "seconds a Message Batch takes to end (default 0)"),
    "batch_expire_after": (
        _RATE,
        "SECONDS",
        "seconds after which a batch still processing expires (default 86400, the API's 24 hours)",
    ),
    "batch_expire": (str, "TEXT", "batch requests whose prompt contains this text expire (default: none)"),
    "batch_error": (
        str,
        "TEXT",
        "batch requests whose prompt contains this text come back with the API's 500 (default: none)",
    ),
    "batch_max_requests": (positive(int), "N", "most requests in one batch (default 100,000, the API's)"),
    "batch_max_bytes": (positive(int), "N", "largest batch, in bytes (default 256,000,000, the API's)"),
    "batch_lose_response": (
        _COUNT,
        "N",
        "the next N batch creations make the batch, then hang up unanswered (default 0)",
    ),
    "compatible": (
        _flag,
        "true|false",
        "answer as another server speaking the Messages API does (vLLM, Ollama, a LiteLLM proxy): no rate-limit "
        "headers, no batches, no prompt caching (default false)",
    ),
    "usage": (_flag, "true|false", "answers carry token usage; false: none, as some servers send (default true)"),
    "resample": (
        _flag,
        "true|false",
        "a text request asked again (a redo) draws another answer, as sampling would (default false: the same one)",
    ),
    "capacity": (
        positive(int),
        "N",
        "requests worked on at once, as a GPU's batch; the rest wait their turn (default: no limit)",
    ),
    "queue_limit": (
        _COUNT,
        "N",
        "with --capacity, a request that finds this many waiting gets a 429 (default: no limit)",
    ),
    "seed": (_COUNT, "N", "the seed of its random choices: --error-rate, --drop-rate, --jitter (default 0)"),
    "today": (
        _day,
        "YYYY-MM-DD",
        "the day it believes it is: a model past its shutdown date gets the API's 404 (default: today)",
    ),
}


def _fault_options(parser: argparse.ArgumentParser) -> None:
    """One option per fault of `Simulator` (`llmledger.simulate`'s keywords), so a shell user has them all."""
    parser.add_argument(
        "--outage-for",
        type=_SECONDS,
        default=None,
        metavar="SECONDS",
        help="seconds from the start during which every request gets --outage-status (default: no outage)",
    )
    parser.add_argument(
        "--fail-next",
        type=_statuses,
        default=None,
        metavar="ERRORS",
        help="errors for the first requests, in order: HTTP statuses or named cases, e.g. 529,529,429 or no_retry "
        "(default: none)",
    )
    for name in _FAULTS:
        if name == "models":
            parser.add_argument(
                "--model",
                dest="models",
                action="append",
                default=[],
                metavar="ID",
                help="a model id to answer besides those llmledger has prices for (repeatable; default: none)",
            )
            continue
        convert, metavar, help_text = _FAULT_OPTIONS.get(name, (str, "X", f"the simulator's {name} (see Faults)"))
        parser.add_argument("--" + name.replace("_", "-"), type=convert, default=None, metavar=metavar, help=help_text)


_INFERRED = "(default: the only one the store has)"
