"""The packed sender: several claimed rows in one request (`rows_per_request=`), each answer its own.

It stands on the online sender (`OnlineSender.send_request`: pacing, retries, the budget, stops, the circuit breaker),
so a pack is one more request to it. What it adds: rows whose identical request is answered already (or on its way in
another pack) are not packed again; the pack's answer is read entry by entry (`_step/packing.read_pack`), never by
position; an entry that is missing, duplicated, misaligned or out of shape fails only its row, which is asked again in
a pack of its own; and each row pays its share of the request: the input by its text's share of the request (the
shared instructions split evenly), the output by its entry's share of the answer. A row asked again alone also carries
its share of the pack that failed it, so the step's rows add up to what its requests cost. Every pack is recorded
(`Sink.note_pack`) with its whole request and answer for `llmledger_packs`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import uuid
from collections.abc import Callable
from typing import Any

from llmledger._exec.client import Reply
from llmledger._exec.online import Answer, OnlineSender
from llmledger._step.output import OutputSpec
from llmledger._step.packing import Pack, apportion, entry_lengths, pack_groups, pack_request, read_pack
from llmledger._step.prices import cost_usd
from llmledger._time import utcnow

Deliver = Callable[[int, Answer], None]  # a pack's row (by its place in the pack) and its answer


def _placed(places: list[int], deliver: Deliver) -> Deliver:
    """`deliver` for a pack of some of the rows: its item `k` is the row at `places[k]`."""
    return lambda k, answer: deliver(places[k], answer)


class PackedSender:
    def __init__(self, online: OnlineSender, *, output: OutputSpec | None, key: list[str]) -> None:
        self.online, self.output, self.key = online, output, key

    async def process(self, rows: list[dict[str, Any]]) -> None:
        """Answer claimed rows in packs, sharing one answer among rows whose requests are identical."""
        online, sink = self.online, self.online.sink
        leaders: list[dict[str, Any]] = []
        followers: dict[str, list[dict[str, Any]]] = {}
        waiting: list[asyncio.Task[None]] = []
        for row in rows:
            fp = row["fingerprint"]
            if online.dedupe and fp in online.answers:
                sink.record(row, *online.answers[fp], reused=True)
            elif online.dedupe and fp in followers:
                followers[fp].append(row)
            elif online.dedupe and fp in online.twins:
                waiting.append(asyncio.ensure_future(self._await_twin(row, online.twins[fp])))
            else:
                leaders.append(row)
                followers[fp] = []
                if online.dedupe:
                    online.twins[fp] = asyncio.get_running_loop().create_future()
        delivered: set[int] = set()

        def deliver(i: int, answer: Answer) -> None:
            """The answer of leader `i` (and of its twins), recorded (so journaled) the moment it is known: a pack's
            good answers must not wait for its failed rows' re-asks, which a kill -9 or a long backoff may cut."""
            row = leaders[i]
            fp = row["fingerprint"]
            delivered.add(i)
            sink.record(row, *answer, reused=False)
            for twin in followers[fp]:
                sink.record(twin, *answer, reused=True)
            if online.dedupe:
                online.answers[fp] = answer
                future = online.twins.pop(fp, None)
                if future is not None and not future.done():
                    future.set_result(answer)

        try:
            for version in dict.fromkeys(r["version"] for r in leaders):  # a pack holds one step version's rows
                places = [i for i, r in enumerate(leaders) if r["version"] == version]
                for group in pack_groups([leaders[i]["prompt"] for i in places]):  # items it can tell apart
                    chosen = [places[k] for k in group]
                    await self._pack([leaders[i] for i in chosen], _placed(chosen, deliver))
        finally:
            for i, row in enumerate(leaders):  # stopped before an answer: the row is released, and so are its twins
                future = online.twins.pop(row["fingerprint"], None) if online.dedupe and i not in delivered else None
                if future is not None and not future.done():
                    future.set_result(None)
            await asyncio.gather(*waiting, return_exceptions=True)

    async def _await_twin(self, row: dict[str, Any], twin: asyncio.Future[Answer | None]) -> None:
        shared = await asyncio.shield(twin)
        if shared is not None:  # None: the twin was stopped, so this row is released too
            self.online.sink.record(row, *shared, reused=True)

    async def _pack(self, rows: list[dict[str, Any]], deliver: Deliver) -> None:
        """Send rows of one version together; `deliver(i, answer)` each row's answer the moment it is known (a row
        the run stops before answering gets none). Rows the pack does not answer well are asked again, each alone,
        while the others' answers are already delivered: paid for, they reach the ledger whatever happens next."""
        online = self.online
        spec = online.requests[rows[0]["version"]]
        pack = pack_request(spec, [r["prompt"] for r in rows])
        sent = await online.send_request(pack.body, rows[0], spec)
        if sent is None:  # the run stopped first: the rows go back as they were
            return
        reply, error = sent
        pack_id = str(uuid.uuid4())
        kept: dict[int, str] = {}
        if reply is None:  # refused, not billed
            problems = dict.fromkeys(range(len(rows)), error or "refused")
        elif reply.useless:  # billed, nothing to read (a refusal, an answer cut off)
            problems = dict.fromkeys(range(len(rows)), error or "the pack's answer was of no use")
        else:
            kept, problems = read_pack(reply.text, pack, self.output)
        shares: list[Reply | None] = [*pack_shares(reply, pack, pack_id)] if reply is not None else [None] * len(rows)
        self._note(pack, rows, reply, problems, pack_id)
        for i, text in kept.items():
            share = shares[i]
            assert share is not None
            deliver(i, (dataclasses.replace(share, text=text), None))
        if not problems:
            return
        if len(rows) == 1:  # asked alone already: the row keeps what it paid for, and why it is no answer
            share = shares[0]
            if share is None or (reply is not None and reply.useless):
                deliver(0, (share, error))
            else:  # an answer the row paid for that is not its answer: kept raw, for a person (NEEDS_REVIEW)
                deliver(0, (dataclasses.replace(share, text=reply.text if reply else ""),
                            f"the answer does not hold this row's entry: {problems[0]}"))  # fmt: skip
            return
        await asyncio.gather(*(self._again(rows[i], shares[i], functools.partial(deliver, i)) for i in problems))

    async def _again(self, row: dict[str, Any], share: Reply | None, deliver: Callable[[Answer], None]) -> None:
        """Ask a row alone that its pack did not answer well, and deliver its answer carrying its `share` of that
        pack."""
        alone: list[Answer | None] = [None]
        try:
            await self._pack([row], lambda _, answer: alone.__setitem__(0, answer))
        finally:  # also when cancelled: what the row's share of the pack cost is counted
            if alone[0] is None:  # stopped before its own request was answered: its share of the pack is paid
                if share is not None:
                    self.online.sink.bill(share)
            else:
                later, why = alone[0]
                if share is None:
                    deliver(alone[0])
                elif later is None:  # its own request refused: it fails, with what the pack cost it
                    deliver((dataclasses.replace(share, useless=True), why))
                else:  # its own answer, carrying its share of the pack that failed it (a refusal stays one)
                    deliver((dataclasses.replace(share.plus(later), useless=later.useless), why))

    def _note(
        self,
        pack: Pack,
        rows: list[dict[str, Any]],
        reply: Reply | None,
        problems: dict[int, str],
        pack_id: str,
    ) -> None:
        """The pack's record for `llmledger_packs` (the sink adds the table, step and run)."""
        keys = [r[self.key[0]] if len(self.key) == 1 else [r[k] for k in self.key] for r in rows]
        self.online.sink.note_pack(
            {
                "pack_id": pack_id,
                "rows": len(rows),
                "kept": len(rows) - len(problems),
                "row_keys": json.dumps(keys, ensure_ascii=False, default=str),
                "request": json.dumps(pack.body, ensure_ascii=False),
                "answer": reply.text if reply is not None else None,
                "problems": json.dumps({pack.ids[i]: why for i, why in problems.items()}, ensure_ascii=False)
                if problems
                else None,
                "model": reply.model if reply is not None else pack.body.get("model"),
                "input_tokens": None if reply is None else reply.input_tokens,
                "output_tokens": None if reply is None else reply.output_tokens,
                "cache_write_tokens": None if reply is None else reply.cache_write_tokens,
                "cache_read_tokens": None if reply is None else reply.cache_read_tokens,
                "cost_usd": None if reply is None else cost_usd(reply),
                "latency_ms": None if reply is None else reply.latency_ms,
                "answered_at": utcnow(),
            }
        )


def pack_shares(reply: Reply, pack: Pack, pack_id: str) -> list[Reply]:
    """Each item's part of a pack's reply: input by its text's share (the shared part split evenly), output by its
    entry's share of the answer; cache tokens evenly; the request counted once, on the first item."""
    n = len(pack.ids)
    own = [len(json.dumps(t, ensure_ascii=False)) for t in pack.own]
    inputs = [pack.shared_chars / n + chars for chars in own]
    lengths = entry_lengths(reply.text, pack)
    outputs = [float(x) for x in lengths] if sum(lengths) else [1.0] * n
    split: dict[str, Any] = {
        "input_tokens": apportion(reply.input_tokens, inputs),
        "output_tokens": apportion(reply.output_tokens, outputs),
        "cache_write_tokens": apportion(reply.cache_write_tokens, [1.0] * n),
        "cache_write_1h_tokens": apportion(reply.cache_write_1h_tokens, [1.0] * n),
        "cache_read_tokens": apportion(reply.cache_read_tokens, [1.0] * n),
    }
    split["calls"] = [reply.calls] + [0] * (n - 1)
    return [dataclasses.replace(reply, **{k: v[i] for k, v in split.items()}, pack=pack_id) for i in range(n)]
