"""What the verbs' arguments are made of: the parser that refuses in one line, the value checks (`positive`,
`port`), and the argument groups several verbs share (`STORE_TABLE_STEP`, `RUN_OPTIONS`, `SERVER`, ...).

A default that mirrors an option of the Python twin is read from `RunOptions`' `DEFAULTS` (or the twin's own
signature), and the "(default N)" its help shows is made from it: never written twice.
"""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from llmledger._run.options import DEFAULTS, MAX_CONCURRENCY, MAX_STALE_AFTER
from llmledger._run.worker import work

Adder = Callable[[Any], None]  # adds arguments to a parser or an argparse argument group


class CliParser(argparse.ArgumentParser):
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


DAY = 86_400.0  # redraws and polls further apart than a day are a typo (time.sleep refuses far larger ones)
STALE_AFTER = DEFAULTS.stale.total_seconds()  # the CLI takes seconds: 1800
MAX_STALE_SECONDS = MAX_STALE_AFTER.total_seconds()
POLL = inspect.signature(work).parameters["poll"].default  # work()'s own option, not a RunOptions one
INFERRED = "(default: the only one the store has)"
STORE_HELP = "the DuckDB file or postgresql:// URL"
WHERE_HELP = "SQL predicate over the fact table narrowing the rows"


def seconds(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Group:
    """Arguments several verbs take alike (or one verb's own). `title` shows them under a heading of their own in
    the verb's --help; `infers` names the arguments `cli.main` fills in when the store has only one."""

    add: Adder
    title: str | None = None
    infers: tuple[str, ...] = ()

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        self.add(parser if self.title is None else parser.add_argument_group(self.title))


def _store(p: Any) -> None:
    p.add_argument("store", help=STORE_HELP)


def _store_table(p: Any) -> None:
    _store(p)
    p.add_argument("--table", default=None, help=INFERRED)


def _store_table_step(p: Any) -> None:
    _store_table(p)
    p.add_argument("--step", default=None, help=INFERRED)


def _where(p: Any) -> None:
    p.add_argument("--where", default=DEFAULTS.where, help=WHERE_HELP)


def _run_options(p: Any) -> None:
    p.add_argument(
        "--concurrency",
        type=positive(int, most=MAX_CONCURRENCY),
        default=DEFAULTS.concurrency,
        help=f"requests in flight at once, at most {MAX_CONCURRENCY:,} (default {DEFAULTS.concurrency})",
    )
    _where(p)
    p.add_argument(
        "--max-attempts",
        type=positive(int),
        default=DEFAULTS.max_attempts,
        help=f"tries per row before it is NEEDS_REVIEW (default {DEFAULTS.max_attempts})",
    )


def _quiet(p: Any) -> None:
    p.add_argument("--quiet", action="store_true", default=not DEFAULTS.progress, help="no progress bar")


def _server(p: Any) -> None:
    p.add_argument(
        "--base-url",
        default=DEFAULTS.base_url,
        metavar="URL",
        help="send to this server that answers the Messages API (vLLM, Ollama, llama.cpp, a LiteLLM proxy) "
        "instead of Anthropic's: the one the step's requests name (apply_llm(..., base_url=...))",
    )
    p.add_argument(
        "--gateway",
        action="store_true",
        default=DEFAULTS.gateway,
        help="--base-url is a gateway to the provider's own API (a LiteLLM proxy, Portkey, Helicone, Cloudflare AI "
        "Gateway): its batches, prices and rate-limit headers are used (apply_llm(..., gateway=True))",
    )
    p.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="the environment variable holding --base-url's key, if it needs one (a key on the command line "
        "would show in the process list and the shell's history)",
    )


def stale_after(p: Any, help_text: str) -> None:
    """--stale-after, in seconds: `help_text` ends with where the default goes."""
    p.add_argument(
        "--stale-after",
        type=positive(float, most=MAX_STALE_SECONDS),
        default=STALE_AFTER,
        help=help_text.format(default=seconds(STALE_AFTER)),
    )


STORE = Group(_store)
STORE_TABLE = Group(_store_table, infers=("table",))
STORE_TABLE_STEP = Group(_store_table_step, infers=("table", "step"))
WHERE = Group(_where)
RUN_OPTIONS = Group(_run_options, title="run options")
QUIET = Group(_quiet)
SERVER = Group(_server, title="server options (another server than the provider's own API)")
