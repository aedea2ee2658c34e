"""`llmledger simulator`'s options: one per fault of `Simulator` (`llmledger.simulate`'s keywords), each with what
its value must be and what it does in words."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from datetime import date
from typing import Any

from llmledger._cli_parser.args import positive
from llmledger.simulator.faults import ERRORS, Faults


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
    "pack_drop": (_share, "SHARE", "share of packed requests, 0 to 1, whose answer drops one row's entry (default 0)"),
    "pack_duplicate": (_share, "SHARE", "share of packed requests, 0 to 1, answering one row twice (default 0)"),
    "pack_swap": (_share, "SHARE", "share of packed requests, 0 to 1, whose answer swaps two rows' ids (default 0)"),
    "flex_unavailable": (
        _share,
        "SHARE",
        "share of OpenAI flex requests, 0 to 1, answered 429 Resource Unavailable (default 0)",
    ),
    "pack_invalid": (_share, "SHARE", "share of packed requests, 0 to 1, with one answer out of shape (default 0)"),
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


def fault_options(parser: Any) -> None:
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
