"""What a row's request says beyond one text message: `messages=` (a conversation before the row's message) and
`attach=` (the row's files), checked before anything is written.

The row's own message is always the last, a user message made from the row (`prompt=`, or the last of
`messages=`). The messages before it are the same for every row: they are part of the step's request, stored
once with it, and with `cache=` sent as a cached prefix (a breakpoint on their last block), so a long few-shot
prefix or shared text is paid in full once and at the cache-read price by every later row.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Any

import polars as pl

from llmledger._step.attach import Attachments, check_attach
from llmledger._step.prompt import Prompt, template_fields
from llmledger.errors import PromptError


def prompt_and_prefix(prompt: Prompt | None, messages: Any) -> tuple[Prompt, tuple[dict[str, Any], ...]]:
    """The row's template and the messages before it, from `prompt=` or `messages=` (exactly one of them)."""
    if messages is None:
        if prompt is None:
            raise PromptError(
                "pass prompt= (a template such as 'Summarize: {text}', or a callable(row) -> str), "
                "or messages= (a list of messages whose last is the row's template)"
            )
        return prompt, ()
    if prompt is not None:
        raise PromptError(
            "pass prompt= or messages=, not both: with messages=, the last message is the row's "
            "template (e.g. [..., {'role': 'user', 'content': 'Classify: {text}'}])"
        )
    if not isinstance(messages, list | tuple) or not messages:
        raise PromptError(
            f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, the last "
            f"being the row's template, got {messages!r}"
        )
    for n, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or set(message) != {"role", "content"}
            or message["role"] not in ("user", "assistant")
        ):
            raise PromptError(
                f"messages[{n}] must be {{'role': 'user' or 'assistant', 'content': ...}} (those two "
                f"keys only), got {message!r}"
            )
    last = messages[-1]
    if last["role"] != "user" or not (isinstance(last["content"], str) or callable(last["content"])):
        raise PromptError(
            f"the last message is the row's own: a user message whose content is a template "
            f"(str) or a callable(row) -> str, got {last!r}"
        )
    return last["content"], tuple(_checked_static(n, m) for n, m in enumerate(messages[:-1]))


def _checked_static(n: int, message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, str) and content.strip():
        return {"role": message["role"], "content": content}
    if (
        isinstance(content, list)
        and content
        and all(
            isinstance(b, dict)
            and b.get("type") == "text"
            and isinstance(b.get("text"), str)
            and b["text"].strip()
            and set(b) <= {"type", "text"}
            for b in content
        )
    ):
        return {"role": message["role"], "content": [dict(b) for b in content]}
    raise PromptError(
        f"messages[{n}] (before the row's message) must have non-empty text content: a string or "
        f"text blocks [{{'type': 'text', 'text': ...}}]; files go in the row's message with attach=. "
        f"Got {content!r}"
    )


def check_prefix(prefix: Sequence[dict[str, Any]], columns: Collection[str]) -> None:
    """The messages before the row's are the same for every row, so a column named there is a mistake."""
    for n, message in enumerate(prefix):
        try:
            fields = [f for f in template_fields(message_text(message)) if f in columns]
        except PromptError:  # literal braces (JSON, code) in a fixed message are fine: it is not a template
            continue
        if fields:
            raise PromptError(
                f"messages[{n}] names column {{{fields[0]}}}, but only the last message is the row's "
                "template; the messages before it are sent as written, the same for every row. Move "
                "the row's fields into the last message."
            )


def message_text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


def cached(prefix: tuple[dict[str, Any], ...], ttl: str | None) -> tuple[dict[str, Any], ...]:
    """The prefix with a cache breakpoint on its last block (which caches the system prompt with it)."""
    if not prefix or ttl is None:
        return prefix
    last = prefix[-1]
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": last["content"]}]
        if isinstance(last["content"], str)
        else [dict(b) for b in last["content"]]
    )
    blocks[-1]["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    return (*prefix[:-1], {"role": last["role"], "content": blocks})


def attachments(
    attach: Any,
    frame: pl.DataFrame,
    prompt: Prompt,
    steps: Collection[str],
    key: Sequence[str],
    api: str = "messages",
) -> tuple[pl.DataFrame, Attachments | None]:
    """The frame (a column of `pathlib.Path`s made text, so the ledger keeps the paths) and the checked attach=
    columns, every file read and hashed now: a missing or unreadable file, or one the API does not take, is
    refused before anything is written (and a rerun finds the hashes of unchanged files)."""
    columns = check_attach(attach, frame)
    if not columns:
        return frame, None
    paths = [
        c
        for c in columns
        if frame.schema[c] == pl.Object and all(v is None or isinstance(v, os.PathLike | str) for v in frame[c])
    ]
    if paths:
        frame = frame.with_columns(
            pl.Series(c, [None if v is None else os.fspath(v) for v in frame[c]], dtype=pl.String) for c in paths
        )
    reading = [f for f in template_fields(prompt) if f in steps] if isinstance(prompt, str) else []
    if reading:
        raise PromptError(
            f"a step with attach= cannot read another step ({{{reading[0]}}}): its message holds "
            "files, and one reading other steps is rendered in SQL. Copy that step's answers into "
            "a column of the frame first."
        )
    found = Attachments(columns, api=api)  # its blocks in the shape of the step's API
    part = frame.select(list(dict.fromkeys([*key, *columns])))  # a column of paths may be the key itself
    for index, row in enumerate(part.iter_rows(named=True)):
        found.blocks(row, str({k: row[k] for k in key}), part, index)
    return frame, found
