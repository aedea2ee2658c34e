"""The online sender: one Messages request per claimed row, sent concurrently.

It owns everything about talking to the API in real time: identical requests
share one call (within the run, and with DONE answers already in the ledger),
transient errors are retried with backoff behind a shared pacer, the circuit
breaker stops a run the API keeps failing, and fatal answers (credentials,
spend limits, `x-should-retry: false`) stop the run at once. What it learns
about each row goes back to the scheduler through `Sink`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Protocol

from llmledger._exec.adaptive import AdaptiveLimit
from llmledger._exec.apis import for_client
from llmledger._exec.apis.chat import NO_ROOM_HEAD
from llmledger._exec.client import CallFailed, Kind, NotSent, Reply, known_reply, send
from llmledger._exec.config import RetryPolicy
from llmledger._exec.pacing import Pacer, backoff
from llmledger._ledger import KnownAnswer
from llmledger._ledger.states import Outcome
from llmledger._step import models as model_facts
from llmledger._step.attach import NOT_SENT, AttachmentError, Attachments
from llmledger._step.output import OutputError, OutputSpec
from llmledger._step.request import RequestSpec

log = logging.getLogger("llmledger")
REFUSED_TRIES = 4  # refused connections, before any answer, after which a run stops: nothing listens there

# (reply, None): an answer. (None, error): a permanent failure. (reply, error): an answer paid for that did not
# match the step's output schema, kept for a person to review.
Answer = tuple[Reply | None, str | None]

FEEDBACK = (
    "That answer does not match the required JSON schema: {problem}. Answer again with only the JSON "
    "object, matching the schema exactly."
)

_STOP_ADVICE = {
    Outcome.AUTH: "the API refused the credentials or the account ({}); no row was marked failed. Check "
    "ANTHROPIC_API_KEY (OPENAI_API_KEY for an 'openai:' model; or the client you passed; for a base_url= server, "
    "its api_key=) and run again.",
    Outcome.SPEND_LIMIT: "the account cannot spend more now ({}); no row was marked failed. Raise the limit, add "
    "credit or wait for it to reset (the Claude Console; OpenAI's billing page for an 'openai:' model), then run "
    "the same call again.",
    Outcome.RETRY_REFUSED: "the API said not to retry ({}); no row was marked failed. Run the same call again "
    "later to resume.",
    Outcome.NO_MODEL: "the API has no such model ({}); no row was marked failed. Check model= (see "
    "llmledger.models() for the current model ids; a base_url= server has the models it was started with, "
    "and answers 404 too when base_url= has a wrong path) and run again.",
}


def stop_advice(outcome: Outcome, failure: CallFailed, model: str) -> str:
    """What a run stopped by `failure` tells the user: a 404 for a model past its announced shutdown date says it
    was retired on that date and what replaces it."""
    retired = model_facts.retired_note(model, model_facts.current_day()) if outcome is Outcome.NO_MODEL else None
    if retired is not None:
        return (
            f"{retired} ({failure}); no row was marked failed. Move the step to the replacement with "
            "apply_llm(..., model=...): its answers turn stale, reported and not paid (llmledger.models() lists "
            "the models and their lifecycles)."
        )
    return _STOP_ADVICE.get(outcome, "{}").format(failure)


# Distinct requests refused alike, none answered, that stop a run (`OnlineSender._refused_alike`): enough that a
# few bad rows at the head of a frame, refused faster than the rest are answered, do not pass for a bad call.
REFUSED_ALIKE = 8
EMPTY_ALIKE = 3  # answers cut empty at max_tokens, none useful, that stop a run (each was paid for)


class Sink(Protocol):
    """What the sender reports to (the scheduler)."""

    stopping: Outcome | None

    def record(self, row: dict[str, Any], reply: Reply | None, error: str | None, *, reused: bool) -> None: ...
    def stop(self, outcome: Outcome, message: str) -> None: ...
    def note_retry(self, message: str, row: dict[str, Any]) -> None: ...
    def note_unsent(self, message: str, row: dict[str, Any]) -> None: ...
    def set_in_flight(self, delta: int) -> None: ...
    def note_pack(self, record: dict[str, Any]) -> None: ...
    def pace(self) -> tuple[int, int]: ...  # (rows answered in this run, rows still to answer)
    def note_standard(self) -> None: ...  # a request sent at the standard tier to meet the deadline
    def may_spend(self) -> bool: ...
    def bill(self, reply: Reply) -> float | None: ...


class OnlineSender:
    def __init__(
        self,
        client: Any,  # an anthropic.AsyncAnthropic, or an openai.AsyncOpenAI
        *,
        requests: dict[str, RequestSpec],
        known: dict[str, KnownAnswer],
        retry: RetryPolicy,
        dedupe: bool,
        sink: Sink,
        output: OutputSpec | None = None,
        concurrency: int = 1,
        adaptive: bool = False,
        attachments: Attachments | None = None,
        service_tier: str | None = None,
        deadline: float | None = None,
    ) -> None:
        self.client, self.requests, self.retry, self.dedupe, self.sink = client, requests, retry, dedupe, sink
        self.files = attachments or Attachments(())  # where this process has the bytes of attached files
        self.tier = {"service_tier": service_tier} if service_tier else {}  # sent with each request, not recorded
        self.deadline, self.started_at = deadline, time.time()  # flex: the standard tier once it would be missed
        self.standard = False  # the deadline was judged in danger: the rest go at the standard tier
        # refusals alike that stop a run: more than a first wave of requests holds, so rows refused for their own
        # reason at the head of a frame are outweighed by the rest of that wave's answers
        self.refused_alike = max(REFUSED_ALIKE, concurrency + 1)
        self.output = output  # answers are checked against it; one that fails gets one retry with the reason
        self.pacer = Pacer(AdaptiveLimit(concurrency) if adaptive else None)
        self.answers: dict[str, Answer] = {fp: (known_reply(a), None) for fp, a in known.items()}
        self.twins: dict[str, asyncio.Future[Answer | None]] = {}
        self.doing: dict[str, str] = {}
        self.transient_streak = 0
        self.last_success = time.monotonic()
        self.answered = 0  # requests the API answered (200) in this run
        self.refused: dict[str, set[str]] = {}  # before any answer: 400s by message, the fingerprints refused so

    async def process(self, row: dict[str, Any]) -> None:
        """Answer one claimed row, sharing one request among rows whose requests are identical."""
        fp = row["fingerprint"]
        if self.dedupe:
            if fp in self.answers:
                self.sink.record(row, *self.answers[fp], reused=True)
                return
            twin = self.twins.get(fp)
            if twin is not None:
                self._doing(f"waiting for twin {fp[:8]}")
                shared = await asyncio.shield(twin)
                if shared is not None:  # None: the twin was stopped, so this row is released too
                    self.sink.record(row, *shared, reused=True)
                return
            self.twins[fp] = asyncio.get_running_loop().create_future()
        answer: Answer | None = None
        try:
            answer = await self._call(row)
            if answer is not None:
                self.sink.record(row, *answer, reused=False)
                if self.dedupe:
                    self.answers[fp] = answer
        finally:
            future = self.twins.pop(fp, None)
            if future is not None and not future.done():
                future.set_result(answer)

    async def _call(self, row: dict[str, Any]) -> Answer | None:
        """The row's answer (checked against the output schema, retried once if it does not match)."""
        spec = self.requests[row["version"]]
        body = spec.body(row["prompt"])
        if spec.attach:  # the recorded hashes become the files' bytes, read now and checked against them
            try:
                body = await asyncio.to_thread(self.files.for_columns(spec.attach).resolve, body, row)
            except AttachmentError as exc:  # the row goes back as it was, unpaid and with no attempt used up
                self.sink.note_unsent(f"{NOT_SENT}{exc}", row)
                return None
        answer = await self.send_request(body, row, spec)
        if answer is None or answer[0] is None or answer[0].useless or self.output is None:
            return answer
        first = answer[0]
        try:
            return dataclasses.replace(first, text=self.output.check(first.text)), None
        except OutputError as exc:
            problem = str(exc)
        conversation = spec.shape.messages_field  # "messages", or Responses' "input"
        follow_up = {
            **body,
            conversation: [
                *body[conversation],
                {"role": "assistant", "content": first.text or "(no answer)"},
                {"role": "user", "content": FEEDBACK.format(problem=problem)},
            ],
        }
        second: Answer | None = None
        try:
            second = await self.send_request(follow_up, row, spec)
        finally:  # the run stopped (or a stop cancelled this) before the row's one follow-up: the row goes back as
            if second is None:  # it was, its first answer counted as paid, and the next run asks it afresh
                self.sink.bill(first)
        if second is None:
            return None
        if second[0] is None or second[0].useless:  # the follow-up was refused: keep what was paid for (both)
            kept = first if second[0] is None else dataclasses.replace(first.plus(second[0]), text=first.text)
            return kept, f"the answer does not match the output schema: {problem} (not retried: {second[1]})"
        both = first.plus(second[0])
        try:
            return dataclasses.replace(both, text=self.output.check(both.text)), None
        except OutputError as exc:
            return both, f"the answer does not match the output schema, also when asked again: {exc}"

    async def send_request(self, body: dict[str, Any], row: dict[str, Any], spec: RequestSpec) -> Answer | None:
        """Send until there is an answer or a permanent error; None when the run stops first."""
        tries = 0
        while self.sink.stopping is None:
            if not self.sink.may_spend():  # wait for the first answer's cost; a reached budget stops the run
                self._doing("waiting under the budget")
                await asyncio.sleep(0.05)
                continue
            self.sink.set_in_flight(+1)
            wait_at_least: float | None = None
            self._doing(f"sending {row['fingerprint'][:8]} (try {tries})")
            try:
                api = for_client(self.client, spec.api).api()
                tier = self._tier()
                sent = {**body, **tier} if tier else body
                reply = await send(self.client, self.pacer, sent, go=lambda: self.sink.stopping is None, api=api)
                self.answered += 1
                self.transient_streak = 0
                self.last_success = time.monotonic()
                return reply, None
            except NotSent:  # the run stopped while this request waited for its turn
                return None
            except CallFailed as failure:
                if failure.kind is Kind.FATAL:
                    outcome = failure.stop or Outcome.ERROR
                    self.sink.stop(outcome, stop_advice(outcome, failure, str(body.get("model"))))
                    return None
                if failure.kind is Kind.PERMANENT:
                    self._refused_alike(failure, row)  # the call's fault, not the rows': the run stops
                    if failure.reply is not None:  # refused, but billed: the row fails with what it cost (the
                        return dataclasses.replace(failure.reply, useless=True), str(failure)  # report counts it)
                    return None, str(failure)
                self._transient(failure, row)
                wait_at_least = failure.retry_after
            finally:
                self.sink.set_in_flight(-1)
            if self.sink.stopping is not None:
                return None
            self._doing(f"backoff {row['fingerprint'][:8]} (try {tries})")
            await asyncio.sleep(
                backoff(tries, base=self.retry.base_delay, cap=self.retry.max_delay, retry_after=wait_at_least)
            )
            tries += 1
        return None

    def _tier(self) -> dict[str, str]:
        """The tier this request goes at: flex, unless a deadline would be missed at the pace so far (before any
        answer: once a fifth of the time to it has passed without one); from then on, standard."""
        if not self.tier or self.deadline is None:
            return self.tier
        if not self.standard:
            now = time.time()
            answered, left = self.sink.pace()
            if answered:
                needed = left * (now - self.started_at) / answered
                self.standard = needed > 0.8 * (self.deadline - now)
            else:
                self.standard = now - self.started_at > (self.deadline - self.started_at) / 5
        if self.standard:
            self.sink.note_standard()
            return {}
        return self.tier

    def _refused_alike(self, failure: CallFailed, row: dict[str, Any]) -> bool:
        """A 400 `invalid_request_error` the API gave, word for word, to `refused_alike` distinct requests before it
        answered any is the call's fault (an option, a schema, a model it refuses), not the rows': stop the run
        with one clear error rather than fail every row with advice to run it again (the rows refused so far are
        FAILED with it, so the count said is the rows that show it). True when it stopped."""
        text = str(failure)
        empty = text.startswith(NO_ROOM_HEAD)  # answered, paid, and empty: every row would be alike
        if self.answered or not (empty or (text.startswith("400 ") and "(invalid_request_error)" in text)):
            return False
        message = text.split(" (request ", 1)[0]  # the request id differs from request to request
        seen = self.refused.setdefault(message, set())
        seen.add(row["fingerprint"])
        # an empty answer cut at max_tokens is the call's (its bound): a few alike say so, and each was paid for
        if len(seen) < (EMPTY_ALIKE if empty else self.refused_alike):
            return False
        said = "answered" if empty else "refused"
        self.sink.stop(
            Outcome.BAD_REQUEST,
            f"the API {said} the first {len(seen)} distinct requests alike, answering none usefully: {message}. "
            "The call's options are at fault, not the rows: change what the message names; running the same "
            "call again would be refused again. Those rows are FAILED with this error and are sent again by "
            "the changed call.",
        )
        return True

    def _transient(self, failure: CallFailed, row: dict[str, Any]) -> None:
        log.info("transient failure, will retry: %s", failure)
        self.transient_streak += 1
        self.sink.note_retry(str(failure), row)
        if failure.refused and not self.answered and self.transient_streak >= REFUSED_TRIES:
            where = getattr(self.client, "base_url", "the server")
            self.sink.stop(
                Outcome.OUTAGE,
                f"nothing answers at {where}: the connection was refused {self.transient_streak} times and no "
                "request was ever answered (is the server started, and is base_url= its address and port?). "
                "Nothing was sent; start it and run the same call again.",
            )
            return
        quiet_for = time.monotonic() - self.last_success
        if self.transient_streak >= self.retry.outage_failures and quiet_for >= self.retry.outage_after:
            self.sink.stop(
                Outcome.OUTAGE,
                f"the API kept failing ({self.transient_streak} transient errors in a "
                f"row, no success for {quiet_for:.0f}s; last: {failure}). Stopped "
                "cleanly; unsent rows stay as they were. Run the same call again "
                "later to resume.",
            )

    def _doing(self, what: str) -> None:
        """What each sender task awaits now: shown by `debug_state()` when a run looks stuck."""
        task = asyncio.current_task()
        if task is not None:
            self.doing[task.get_name()] = what
