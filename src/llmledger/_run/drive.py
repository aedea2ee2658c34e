"""Driving the senders of one run on llmledger's event loop: online through the scheduler, or in Message Batches
(sent, waited for and collected), with the client the run sends with."""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import polars as pl

from llmledger._exec.apis import for_client, messages
from llmledger._exec.batch import BatchSender
from llmledger._exec.client import bounded_timeout
from llmledger._exec.collect import BatchCollector
from llmledger._exec.scheduler import Scheduler
from llmledger._ledger import Ledger, Selection
from llmledger._ledger.liveness import Claimant
from llmledger._ledger.types import BatchRecord
from llmledger._report import RunReport
from llmledger._run.plan import Plan

RESEND_ROUNDS = 3  # a waiting batch run sends rows its batches gave back again, this many times in all
ONLINE_SECONDS = 2.0  # what one request online is reckoned to take, to leave time before a deadline for the rows
# a batch has not answered by then (`online_from`), until the step's own answers online say how long they take
ONLINE_MARGIN, ONLINE_FLOOR = 1.5, 0.2  # then: half as long again as their average, and never under 0.2 s
SWITCH_SECONDS = 3.0  # and what cancelling, merging and starting the online run take (a loaded machine too)
DEADLINE_SHARE = 0.2  # and at least this share of the time to the deadline


def online_from(deadline: float, requests: int, concurrency: int, seconds: float | None = None) -> float:
    """The Unix time from which a batch run with a deadline (`mode="batch", deadline=`) sends online instead: its
    batches still processing are cancelled (what they finished is kept) and their rows sent online, leaving time
    to switch and send `requests` (packs, with `rows_per_request`) at `concurrency` at once, or a fifth of the
    time, whichever is more. A request is reckoned at half as long again as the step's answers online took
    (`seconds`, their average), or ONLINE_SECONDS before it has had enough of them."""
    each = ONLINE_SECONDS if seconds is None else max(seconds * ONLINE_MARGIN, ONLINE_FLOOR)
    online = SWITCH_SECONDS + requests * each / max(concurrency, 1)
    return deadline - max(online, DEADLINE_SHARE * (deadline - time.time()))


def stored_cancel_at(open_batches: list[BatchRecord], concurrency: int, seconds: float | None) -> float | None:
    """The last moment for batches that earlier calls sent with a deadline (`wait=False`; stored with each batch),
    so a later call honours it: the earliest, reckoned for all their requests; None when none has a deadline."""
    dated = [b for b in open_batches if b.deadline is not None]
    if not dated:
        return None
    deadline = min(b.deadline.replace(tzinfo=UTC).timestamp() for b in dated if b.deadline is not None)
    return online_from(deadline, sum(b.requests for b in dated), concurrency, seconds)


def _earliest(*moments: float | None) -> float | None:
    return min((m for m in moments if m is not None), default=None)


async def send_all(
    ledger: Ledger,
    selection: Selection,
    plan: Plan,
    claimant: Claimant,
    report: RunReport,
    stop_flag: threading.Event,
    display: Any,
) -> RunReport:
    api, own = run_client(plan.client)
    max_tokens = max((r.max_tokens for r in selection.requests.values()), default=1024)
    timeout = bounded_timeout(api.timeout, max_tokens=max_tokens, sdk=sdk_of(api), slow=plan.cfg.service_tier == "flex")
    api = api.with_options(max_retries=0, timeout=timeout)
    try:
        scheduler = Scheduler(
            ledger=ledger,
            selection=selection,
            cfg=plan.cfg,
            client=api,
            claimant=claimant,
            report=report,
            stop_flag=stop_flag,
            on_progress=display.update,
        )
        return await scheduler.run()
    finally:
        if own:
            await api.close()


async def run_batches(
    ledger: Ledger,
    selection: Selection | None,
    plan: Plan,
    claimant: Claimant,
    report: RunReport,
    stop_flag: threading.Event,
    display: Any,
    *,
    wait: bool,
) -> None:
    """Batch mode: submit the selection (if any), then wait for the step's batches or just merge what ended.

    With `wait`, rows a batch gives back (expired, canceled, the API's own errors) are sent again, up to
    RESEND_ROUNDS times, so a waiting call finishes its rows. Without a selection: merge what has ended.
    """
    api, own = run_client(plan.client)
    api = api.with_options(max_retries=0)  # a retried create could make two batches: batch.py retries itself
    version = plan.definition.version if plan.definition is not None else None
    try:
        collector = BatchCollector(
            ledger=ledger,
            table=plan.table,
            step=plan.step,
            cfg=plan.cfg,
            client=api,
            report=report,
            stop_flag=stop_flag,
            version=version,
            output_model=plan.cfg.output_model,
            on_progress=display.update,
            stale_after=plan.stale,
            run_id=claimant.run_id,
        )
        if plan.cfg.deadline is not None:  # this call's deadline binds the rows in the step's batches too
            at = datetime.fromtimestamp(plan.cfg.deadline, UTC).replace(tzinfo=None)
            await asyncio.to_thread(ledger.hasten_batches, plan.table, plan.step, at)
        if selection is None:
            open_batches = await collector.collect()
            dated = any(b.deadline is not None for b in open_batches)
            seconds = await asyncio.to_thread(ledger.online_seconds, plan.table, plan.step) if dated else None
            last = stored_cancel_at(open_batches, plan.cfg.concurrency, seconds)
            if last is not None and time.time() >= last and not collector.stopped:  # a deadline an earlier call
                # sent batches with: cancel them now, keep what they finished; their rows are this call's to send
                display.note("the deadline's last moment for the step's batches has come: cancelling them")
                await collector.wait(open_batches, cancel_at=last)
                report.online_for_deadline = sum(b.height for b in collector.returned)  # back as they were: this
                collector.returned.clear()  # call sends them, online (a batch call is past their last moment too)
                report.past_deadline = True
            if collector.due is not None and not collector.stopped:  # a stopped run's batch may still be being
                # created: wait (at most ABANDON_AFTER) to tell, rather than leave its rows held by nobody
                display.note(
                    f"waiting {collector.due:.0f}s to tell whether a stopped run's Message Batch reached "
                    "the API (its rows are sent again if not)"
                )
                await asyncio.to_thread(stop_flag.wait, collector.due + 0.1)
                await collector.collect()
            return
        request = selection.requests.get(selection.version)
        output = collector.output_for(selection.version, request.output_spec() if request is not None else None)
        sender = BatchSender(
            ledger=ledger,
            cfg=plan.cfg,
            client=api,
            claimant=claimant,
            report=report,
            stop_flag=stop_flag,
            output=output,
            find=collector.find,
            mine=collector.mine,
            alone=collector.alone,
            batch_size=plan.batch_size,
            on_progress=display.update,
        )
        deadline, concurrency = plan.cfg.deadline, plan.cfg.concurrency
        open_before = await asyncio.to_thread(ledger.open_batches, plan.table, plan.step)
        seconds = (
            await asyncio.to_thread(ledger.online_seconds, plan.table, plan.step)
            if deadline is not None or any(b.deadline is not None for b in open_before)
            else None
        )
        requests = -(-selection.remaining // selection.rows_per_request)  # online: one a row, or one a pack
        cancel_at = None if deadline is None else online_from(deadline, requests, concurrency, seconds)
        stored = stored_cancel_at(open_before, concurrency, seconds)
        cancel_at = _earliest(cancel_at, stored)  # batches earlier calls sent with a deadline keep it
        for _ in range(RESEND_ROUNDS):
            late = report.past_deadline or (cancel_at is not None and time.time() >= cancel_at)
            if selection.remaining and not late:
                await sender.submit(selection)
            elif selection.remaining:  # past the batches' last moment: the rows go online, in time
                report.online_for_deadline = selection.remaining  # those batches gave back among them
                await send_all(ledger, selection, plan, claimant, report, stop_flag, display)
                return
            if not wait:
                report.in_batches = sum(
                    b.rows for b in await asyncio.to_thread(ledger.open_batches, plan.table, plan.step)
                )
                return
            open_batches = await collector.collect()
            if collector.waiting_on(open_batches):
                then = "" if cancel_at is None else "; at the deadline's last moment for batches, their rows go online"
                display.note(
                    f"waiting for {report.in_batches:,} rows in {len(open_batches)} Message Batch(es); "
                    "interrupting stops the waiting, not the batches (run the same call again to "
                    "collect them)" + then
                )
                await collector.wait(open_batches, cancel_at=cancel_at)
            if not collector.returned or collector.stopped:
                return
            key_types: dict[Any, Any] = dict(selection.key_types)
            selection.work = pl.concat(collector.returned).cast(key_types)  # send those again
            selection.cursor, selection.open_ended = 0, False
            collector.returned.clear()
    finally:
        if own:
            await api.close()


def sdk_of(client: Any) -> Any:
    """The SDK module a client comes from: `anthropic`, or `openai` (an optional extra)."""
    return for_client(client).load()


def run_client(client: Any) -> tuple[Any, bool]:
    """The client a run sends with, and whether the run must close it.

    A run gets a connection pool of its own, opened and closed on llmledger's event loop. Sharing
    the caller's pool across runs let a client the caller dropped without closing (one per cell, say)
    have its sockets finalized by the garbage collector while still registered with the loop; a new
    connection reusing such a socket's file descriptor then never heard its answer (a stall until the
    read timeout, and a request paid twice). A client with an http_client of the caller's own (a proxy,
    say) is used as given.
    """
    if client is None:
        return messages.default_client(), True
    http = getattr(client, "_client", None)
    if http is not None and type(http).__name__ != "AsyncHttpxClientWrapper":
        return client, False
    make = sdk_of(client).DefaultAsyncHttpxClient
    verify = shared_ssl_context(make)
    return client.with_options(http_client=make() if verify is None else make(verify=verify)), True


_ssl_contexts: dict[tuple[str | None, ...], tuple[Any, ssl.SSLContext]] = {}  # by setting: (CA file's stat, context)
_ssl_lock = threading.Lock()
_SSL_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "SSLKEYLOGFILE")  # what the library's default context reads


def shared_ssl_context(http_client_class: type) -> ssl.SSLContext | None:
    """The verified SSL context the SDK's HTTP library would build by default, built once per process.

    Each run gets a pool of its own (see `run_client`), and building its context loads the whole certificate
    store again: about 20 ms of CPU per call, which a notebook making many small calls, or a test suite,
    pays over and over. The context is the library's own default (`create_ssl_context()`), shared by every
    pool. One is kept per setting of the environment it reads (SSL_CERT_FILE, SSL_CERT_DIR, SSLKEYLOGFILE); it
    is built again when SSL_CERT_FILE's file changes size or time (a CA added mid-session). The bundle the library
    finds with none of them set (certifi's, or the system's) is read once per process. The pools made here are HTTP/1.1
    with no client certificate, as the SDK's default: they all set the same ALPN on it, nothing else. None
    when the library offers no such function: the client then builds its own as before.
    """
    library = next((c.__module__.split(".")[0] for c in http_client_class.__mro__ if c.__name__ == "AsyncClient"), "")
    create = getattr(sys.modules.get(library), "create_ssl_context", None)
    if create is None:
        return None
    env = tuple(os.environ.get(name) for name in _SSL_ENV)
    try:
        bundle = os.stat(env[0]) if env[0] else None
    except OSError:
        bundle = None  # the library says what is wrong with it
    key, stamp = (library, *env), None if bundle is None else (bundle.st_mtime_ns, bundle.st_size)
    with _ssl_lock:
        kept = _ssl_contexts.get(key)
        if kept is None or kept[0] != stamp:
            kept = _ssl_contexts[key] = (stamp, create())
        return kept[1]
