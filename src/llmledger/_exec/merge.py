"""Merging an ended batch (Anthropic's or OpenAI's: `batch_api.py`) into the ledger: its results downloaded,
matched to the rows by custom id, checked and priced, and committed with the rows' statuses in one transaction
(`ledger.merge_batch`).

A result becomes a result row exactly like an online answer (`Recorder`),
priced at the batch rate: `errored` items the row caused (an invalid
request) count as a failed attempt; the API's own errors, `expired` and
`canceled` items give the row back to be sent again. A structured answer
that does not match `output=` is not asked again (that would be another
batch): the row goes to NEEDS_REVIEW with the answer in `{step}_raw`.

`BatchMerger` is mixed into `BatchCollector` (`collect.py`), which decides which batches to look at, settles
intents and waits; merging one batch's results is its own module because it is the one place answers come in
from a batch, and it reads nothing of how batches are found.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import polars as pl

from llmledger._draw import rows as rows_text
from llmledger._exec.batch import fingerprint_of, result_frame
from llmledger._exec.batch_api import BatchApi, Item
from llmledger._exec.batch_requests import PACK_SUFFIX
from llmledger._exec.client import NEVER_IN_THIS_SIMULATOR, Reply
from llmledger._exec.config import RunConfig
from llmledger._exec.packed import pack_shares
from llmledger._exec.reconcile import Reconciler, tag_of
from llmledger._exec.recorder import Recorder
from llmledger._ledger import Ledger, Selection
from llmledger._ledger.batches import BatchChanged
from llmledger._ledger.columns import SIMULATOR
from llmledger._ledger.states import Outcome
from llmledger._ledger.types import BatchRecord, BatchRows
from llmledger._report import RunReport
from llmledger._step.output import OutputError, OutputSpec
from llmledger._step.packing import read_pack, stored_pack
from llmledger._step.prices import cost_usd
from llmledger._time import utcnow

_PERMANENT_ITEM_ERRORS = {"invalid_request_error", "not_found_error", "request_too_large"}


class BatchMerger:
    """The half of `BatchCollector` that merges an ended batch; the collector sets these attributes and defines
    these methods."""

    ledger: Ledger
    table: str
    step: str
    cfg: RunConfig
    api: BatchApi
    report: RunReport
    on_progress: Callable[[RunReport, int], None] | None
    returned: list[pl.DataFrame]
    alone: set[str]
    mine: set[str]
    stuck: set[str]
    failures: Counter[str]
    reconciler: Reconciler
    run_id: str | None
    output_for: Callable[[str, OutputSpec | None], OutputSpec | None]
    _hand_over: Callable[..., Awaitable[None]]
    _failed: Callable[[list[BatchRecord], str], None]
    _note: Callable[[str], None]

    async def _unsettled(self) -> list[BatchRecord]:
        """The store's unsettled batches of this API's provider (another provider's intents own none of its)."""
        return [b for b in await asyncio.to_thread(self.ledger.unsettled_batches) if b.provider == self.api.provider]

    async def _give_back(self, record: BatchRecord, note: str, *, confirmed: bool = True) -> int:
        """Give the batch up: its rows go back as they were (unpaid, to be sent again); how many came back."""
        back = await asyncio.to_thread(
            self.ledger.abandon_batch,
            self.table,
            self.step,
            intent=record.intent,
            now=utcnow(),
            confirmed=confirmed,
            note=note,
        )
        if back.height:
            self.returned.append(back)
        return int(back.height)

    async def _merge_if_ended(self, record: BatchRecord) -> bool:
        """Merge the batch if it has ended; True when it is done with."""
        assert record.batch_id is not None
        rows = await asyncio.to_thread(self.ledger.batch_rows, record, inputs=self.cfg.validate is not None)
        emptied = not rows.rows.height  # every row was taken out of it (llmledger.reset); the API still bills what
        # it answers, so the batch is cancelled, then merged as any other: what it cost is kept as unused
        if record.validated and self.cfg.validate is None and not emptied:
            self.stuck.add(record.intent)
            self._note(
                f"batch {record.batch_id} was sent with validate=; collect it with the same validate= "
                "(apply_llm or llmledger.resume(..., validate=...)), so its answers are checked"
            )
            return False
        try:
            batch = await self.api.retrieve(record.batch_id)
        except self.api.not_found as exc:  # deleted, or another workspace's key: keep the rows, say what to do
            if emptied:  # reset out of a batch the API does not have (the escape for a lost batch)
                await self._give_back(record, "its rows were reset")
                return True
            if record.source == SIMULATOR and NEVER_IN_THIS_SIMULATOR in str(exc):  # its simulator is gone
                back = await self._give_back(
                    record, "sent to a simulator that is gone (it lives in its kernel or process)"
                )
                if back:
                    self._note(
                        f"{rows_text(back)} were in simulated batch {record.batch_id}, which ended "
                        "with the simulator that held it (a simulator lives in its kernel or process; "
                        "nothing was paid): they are asked again of this one"
                    )
                return True
            self.stuck.add(record.intent)
            self._note(
                f"the API has no batch {record.batch_id} for this API key (deleted, or another "
                f"workspace's); its rows stay SUBMITTED. To send them again: llmledger.reset(store, "
                f"{self.table!r}, {self.step!r}, where=\"{self.step}_batch_id = '{record.batch_id}'\")"
            )
            return False
        except self.api.error as exc:
            self._failed([record], f"batch {record.batch_id}: {exc}")
            return False
        if not batch.ended:
            if emptied and record.intent not in self.stuck:  # no row waits for it: stop paying for it, and do not
                self.stuck.add(record.intent)  # wait for it to end (a later look merges it, with what it cost)
                with contextlib.suppress(self.api.error):  # ending anyway, or the API failed: merged as it ends
                    await self.api.cancel(record.batch_id)
            return False
        if batch.refused is not None:  # the API ran none of it: the rows go back as they were, unpaid
            await self._give_back(record, f"the API refused the batch: {batch.refused}")
            if self.report.outcome in (Outcome.RUNNING, Outcome.PREPARING):  # sending them again would fail alike
                self.report.outcome = Outcome.ERROR
                self.report.message = (
                    f"the API refused batch {record.batch_id} ({batch.refused}); its rows are as they were, nothing "
                    "was paid. Run the same call again to retry, or pass mode='online'."
                )
            return True
        counted = RunReport(table=self.table, step=self.step)  # into the run's report once merged
        packs: dict[str, dict[str, Any]] = {}  # the batch's packs, with their answers
        try:
            results, counts, tags, unused = await self._results(record, rows, counted, packs)
        except Exception as exc:  # a download cut short: the results stay with the API, try next time
            self._failed(
                [record], f"batch {record.batch_id}: downloading its results failed ({type(exc).__name__}: {exc})"
            )
            return False
        if record.adopted and record.intent not in tags and sum(counts.values()) > 0:  # a wrong guess: not ours
            self.reconciler.tags[record.batch_id] = frozenset(tags)
            await asyncio.to_thread(
                self.ledger.reject_batch, record, note=f"{record.batch_id} holds no custom id of this intent"
            )
            unsettled = await self._unsettled()
            await self._hand_over(
                {r.intent: record.batch_id for r in unsettled if r.batch_id is None and r.intent in tags}, unsettled
            )
            return False
        try:
            merged = await asyncio.to_thread(
                self.ledger.merge_batch,
                record,
                rows.layout,
                result_frame(results, rows.key_types),
                counts=counts,
                processing_status=batch.status,
                ended_at=batch.ended_at,
                now=utcnow(),
                expected_rows=rows.rows.height,
                unused=unused,
                run=None if self.run_id is None else (self.run_id, self.report.paid_figures(plus=counted)),
                packs=list(packs.values()),
            )
        except BatchChanged:  # rows joined it meanwhile: merge it again at the next look, with them
            return False
        self.failures.pop(record.intent, None)
        if merged is None:  # another run merged it meanwhile
            return True
        self.report.absorb(counted)
        self.report.collected += len(results)
        self.report.returned += merged.height
        if record.intent in self.mine or record.batch_id in self.mine:
            self.report.batch_pending = max(0, self.report.batch_pending - len(results) - merged.height)
        if merged.height:
            self.returned.append(merged)
        if self.on_progress:
            self.on_progress(self.report, len(results))
        return True

    async def _results(
        self, record: BatchRecord, rows: BatchRows, report: RunReport, packs: dict[str, dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], Counter[str], set[str], tuple[int, float]]:
        """Result rows for the rows the batch answered or refused for their own reasons; its counts; the intents
        its custom ids name (`reconcile.tag_of`); and the answers no row holds any more, with their cost (a pack's
        entry not kept among them: its row is sent again, alone). `packs` takes the batch's packs, answered."""
        by_custom: dict[str, list[dict[str, Any]]] = {}
        for row in rows.rows.iter_rows(named=True):
            by_custom.setdefault(row["custom_id"], []).append(
                {
                    **row,
                    "batch_id": record.batch_id,
                    "version": record.version,
                    "fingerprint": fingerprint_of(row["custom_id"]),
                }
            )  # what was sent, whatever the row asks now
        request = rows.requests.get(record.version)
        output = self.output_for(record.version, request.output_spec() if request is not None else None)
        selection = Selection(
            layout=rows.layout,
            version=record.version,
            requests=rows.requests,
            work=pl.DataFrame(),
            params={},
            key_types=rows.key_types,
            inputs=rows.inputs,
        )
        cfg = dataclasses.replace(self.cfg, source=record.source) if record.source else self.cfg  # where it was sent
        recorder = Recorder(selection=selection, cfg=cfg, report=report, output=output)
        results: list[dict[str, Any]] = []
        counts: Counter[str] = Counter()
        tags: set[str] = set()
        unused, unused_usd = 0, 0.0
        assert record.batch_id is not None
        sent: dict[str, dict[str, dict[str, Any]]] = {}  # the packs each intent named sent, by custom id
        async for item in self.api.results(record.batch_id):
            counts[item.type] += 1
            tags.add(tag := tag_of(item.custom_id))
            if item.custom_id.endswith(PACK_SUFFIX):
                if tag not in sent:
                    sent[tag] = await asyncio.to_thread(self.ledger.batch_packs, self.table, self.step, tag)
                stored = sent[tag].get(item.custom_id)
                model = request.model if request else ""
                if stored is not None:
                    got, (lost, lost_usd) = self._pack(item, stored, by_custom, model, output, recorder)
                    results.extend(got)
                    unused, unused_usd = unused + lost, unused_usd + lost_usd
                    packs[stored["pack_id"]] = stored
                elif item.type == "succeeded" and tag == record.intent:  # a pack of this batch the store has no
                    # record of (another intent's is another batch's, or another step's): nobody's, paid all the same
                    unused += 1
                    unused_usd += (
                        recorder.bill((item.reader or self.api.api).reply_from(item.answer, model, batch=True)) or 0.0
                    )
                continue
            mine = by_custom.pop(item.custom_id, None)
            if not mine:  # no row holds this request any more (reset meanwhile): paid all the same
                if item.type == "succeeded" and item.custom_id.startswith(record.intent + "-"):
                    unused += 1
                    reader = item.reader or self.api.api
                    paid = reader.reply_from(item.answer, request.model if request else "", batch=True)
                    unused_usd += recorder.bill(paid) or 0.0
                continue
            reply, error = self._answer(item, request.model if request else "", output, recorder)
            if reply is None and error is None:
                continue  # expired, canceled, or the API's error: the row goes back to be sent again
            for n, row in enumerate(mine):
                results.append(recorder.result(row, reply, error, reused=n > 0))
        return results, counts, tags, (unused, unused_usd)

    def _pack(
        self,
        item: Item,
        stored: dict[str, Any],
        by_custom: dict[str, list[dict[str, Any]]],
        model: str,
        output: OutputSpec | None,
        recorder: Recorder,
    ) -> tuple[list[dict[str, Any]], tuple[int, float]]:
        """The result rows of one pack's answer (`stored`: its record as sent, which takes the answer), entry by
        entry as online (`packed.py`); and what was paid for entries not kept (their rows go back, to be asked
        alone: `alone`). A pack of one that fails is its row's failure, as a row asked alone online."""
        pack = stored_pack(json.loads(stored["request"]))
        custom_ids: list[str] = json.loads(stored["custom_ids"])
        results: list[dict[str, Any]] = []
        if item.type == "succeeded" and len(pack.ids) != len(custom_ids):  # its record does not read: no row's
            paid = (item.reader or self.api.api).reply_from(item.answer, model, batch=True)  # answer, paid all the same
            stored.update(kept=0, problems=json.dumps({"": "its stored request does not read"}), answered_at=utcnow())
            self.alone.update(fingerprint_of(c) for c in custom_ids)  # its rows go back, to be sent alone
            return results, (1, recorder.bill(paid) or 0.0)
        if item.type != "succeeded":
            reply, error = self._answer(item, model, None, recorder)  # the API's or the request's error
            for custom_id in custom_ids:
                for n, row in enumerate(by_custom.pop(custom_id, [])):
                    if error is not None:
                        results.append(recorder.result(row, None, error, reused=n > 0))
            stored.update(kept=0, problems=json.dumps({"": error or item.type}), answered_at=utcnow())
            return results, (0, 0.0)
        reader = item.reader or self.api.api
        reply = reader.reply_from(item.answer, model, batch=True)
        useless = reader.useless(item.answer)
        kept: dict[int, str] = {}
        if useless is not None:
            problems = dict.fromkeys(range(len(pack.ids)), useless)
        else:
            kept, problems = read_pack(reply.text, pack, output)
        unused, unused_usd = 0, 0.0
        for i, (custom_id, share) in enumerate(
            zip(custom_ids, pack_shares(reply, pack, stored["pack_id"]), strict=True)
        ):
            mine = by_custom.pop(custom_id, [])
            if i in kept and mine:
                answer, error = dataclasses.replace(share, text=kept[i]), None
            elif mine and len(pack.ids) == 1:  # asked alone: the row keeps what it paid for, and why it is no answer
                answer = dataclasses.replace(share, useless=useless is not None, text=reply.text)
                error = useless or f"the answer does not hold this row's entry: {problems[i]}"
            else:  # nobody's now, or its entry not kept: paid all the same; its rows go back, to be asked alone
                unused += 1
                unused_usd += recorder.bill(share) or 0.0
                self.alone.add(fingerprint_of(custom_id))
                continue
            results.extend(recorder.result(row, answer, error, reused=n > 0) for n, row in enumerate(mine))
        stored.update(
            answer=reply.text,
            kept=len(kept),
            problems=json.dumps({pack.ids[i]: why for i, why in problems.items()}) if problems else None,
            model=reply.model,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cache_write_tokens=reply.cache_write_tokens,
            cache_read_tokens=reply.cache_read_tokens,
            cost_usd=cost_usd(reply),
            answered_at=utcnow(),
        )
        return results, (unused, unused_usd)

    def _answer(
        self, item: Item, model: str, output: OutputSpec | None, recorder: Recorder
    ) -> tuple[Reply | None, str | None]:
        """(reply, None) an answer; (None, error) refused for the row's reasons; (reply, error) paid, needs a look;
        (None, None) not answered for the API's reasons."""
        if item.type == "succeeded":
            reader = item.reader or self.api.api
            reply = reader.reply_from(item.answer, model, batch=True)
            useless = reader.useless(item.answer)  # a refusal; an empty answer (no room left to write one)
            if useless is not None:  # paid: the row fails with what it cost
                return dataclasses.replace(reply, useless=True), useless
            if output is None:
                return reply, None
            try:
                return dataclasses.replace(reply, text=output.check(reply.text)), None
            except OutputError as exc:
                return reply, (
                    f"the answer does not match the output schema: {exc} (a batch answer is not asked "
                    "again; flag the row and rerun online with redo='flagged')"
                )
        if item.type == "errored":
            kind, message = item.error_kind, item.error_message
            if kind in _PERMANENT_ITEM_ERRORS:
                return None, f"errored in the batch: {kind}: {message}"
            recorder.note_error(f"batch item {kind}: {message} (will be sent again)")
        return None, None
