"""Whether a run may start another request under its budget (`max_cost_usd`): what it spent, plus what its requests
in flight and the next one will cost at its average so far, must stay within the budget. A step budget is shared
with the step's other runs through reservations in the ledger (`_ledger/budget.py`), made by the scheduler's task
that owns the ledger (`_reserve`).

`BudgetGuard` is mixed into `Scheduler` (`scheduler.py`), whose senders ask `may_spend` before each request; it is
its own module because the budget arithmetic and its messages are a job apart from claiming, queueing and
committing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from llmledger._exec.config import RunConfig
from llmledger._ledger import Chunk, Ledger, Selection
from llmledger._ledger.liveness import Claimant
from llmledger._ledger.states import Outcome
from llmledger._report import RunReport
from llmledger._time import utcnow
from llmledger.errors import StoreBusy


class BudgetGuard:
    """The budget half of `Scheduler`; the scheduler sets these attributes and defines `stop`."""

    ledger: Ledger
    selection: Selection
    cfg: RunConfig
    claimant: Claimant
    report: RunReport
    in_flight: int
    shared_budget: bool
    budget_held: float
    budget_committed: float
    budget_ask: bool
    budget_first_ok: bool
    _wake: asyncio.Event
    stop: Callable[[Outcome, str], None]
    packs_paid: tuple[int, float]  # requests that carried several rows (`rows_per_request`), and what they cost
    unlanded: list[Chunk]  # chunks committed and not seen to land, written again where the store lost them

    def _average_request(self) -> float:
        """What the next request is reckoned to cost: the run's average so far (the step's before its first answer);
        for packed rows, at least the average pack of several rows. Most requests are full packs; the rows a pack
        failed are asked again one by one, far cheaper, and counting those in the average let twice as many packs
        into flight as the budget had room for (an attack: 1.6-2.1 times the budget with every pack failing)."""
        rep = self.report
        assert rep.cost_usd is not None
        average = rep.cost_usd / rep.calls if rep.calls else self.cfg.average_before_usd
        packs, cost = self.packs_paid
        return max(average, cost / packs) if packs else average

    def may_spend(self) -> bool:
        """Whether another request may start under `max_cost_usd`.

        What is spent, plus what the requests in flight and this one will cost at the run's average so far,
        must stay within the budget; so a run ends under it by less than a request or two, and over it only
        when answers cost more than the average. Until an answer of the step says what a request costs, one
        request at a time.
        """
        budget, rep = self.cfg.max_cost_usd, self.report
        if budget is None:
            return True
        if rep.cost_usd is None:  # a priced model (checked up front) whose server sent no usage with an answer
            self.stop(
                Outcome.BUDGET,
                f"max_cost_usd cannot be kept: the server sent {rep.uncounted:,} answer(s) without usage (the tokens "
                "they used), so what they cost is unknown; stopped. Leave max_cost_usd out for this server, or "
                "ask it to send usage",
            )
            return False
        average = self._average_request()
        if self.shared_budget:
            return self._within_reservation(rep.cost_usd, average)
        spent = self.cfg.spent_before_usd + rep.cost_usd
        if not average and spent < budget:  # no answer of the step says what one costs yet: one at a time
            return self.in_flight == 0
        if spent + average * (self.in_flight + 1) <= budget:  # the requests in flight, and this one
            return True
        earlier = (
            f" (${self.cfg.spent_before_usd:.4f} of it by earlier runs of this step)"
            if self.cfg.spent_before_usd
            else ""
        )
        flying = f", {self.in_flight} in flight (about ${average * self.in_flight:.4f})" if self.in_flight else ""
        self.stop(
            Outcome.BUDGET,
            f"the budget of ${budget:.4f} is reached: ${spent:.4f} spent{earlier}{flying}, "
            f"and another request (about ${average:.4f}) would take it to "
            f"${spent + average * (self.in_flight + 1):.4f}. Rows not sent stay as they were; "
            "raise max_cost_usd to go on.",
        )
        return False

    def _budget_need(self, cost: float, average: float) -> float:
        """Dollars this run has paid or is paying for that the fact table does not hold yet, with one more
        request: answers billed but not committed, the requests in flight and the next one at the average."""
        return cost - self.budget_committed + average * (self.in_flight + 1)

    def _within_reservation(self, cost: float, average: float) -> bool:
        """A step budget: start a request only within what the ledger holds reserved for this run. When that
        is not enough, the store loop reserves more (or stops the run at the budget); meanwhile, wait. Until an
        answer of the step says what one costs, one request at a time, each after a look at the room left."""
        if not average:
            if self.in_flight:
                return False
            if self.budget_first_ok:
                self.budget_first_ok = False
                return True
        elif self._budget_need(cost, average) <= self.budget_held:
            return True
        if not self.budget_ask:
            self.budget_ask = True
            self._wake.set()
        return False

    async def _reserve(self) -> None:
        """Reserve in the ledger what the senders wait for (and room for every worker's next request), or stop the
        run at the budget when even the next request does not fit (one short transaction, in a worker thread)."""
        budget, rep, layout = self.cfg.max_cost_usd, self.report, self.selection.layout
        assert budget is not None and rep.cost_usd is not None
        average = self._average_request()
        need = self._budget_need(rep.cost_usd, average)
        want = need + average * max(self.cfg.concurrency - self.in_flight, 1)  # every worker's next, and a spare:
        # answers dearer than the average then need no new reservation for a while
        now = utcnow()
        try:
            look = await asyncio.to_thread(
                self.ledger.reserve_budget,
                layout.table,
                layout.step,
                claimant=str(self.claimant),
                need_usd=need,
                want_usd=want,
                budget_usd=budget,
                now=now,
                stale_after=timedelta(seconds=self.cfg.stale_after),
                again=(layout, self.unlanded) if self.unlanded else None,
            )
        except StoreBusy:  # the store stayed locked: the senders keep waiting, and ask again
            self.budget_ask = False
            return
        self.budget_held = look.held_usd
        self.budget_ask = False
        if look.fits and (average or look.spent_usd + look.others_usd + need < budget):
            self.budget_first_ok = not average
            return
        others = f", ${look.others_usd:.4f} reserved by other runs of this step in flight" if look.others_usd else ""
        mine = need - average  # this run's answers billed but not committed, and its requests in flight
        flying = f", ${mine:.4f} this run has in flight or not yet committed" if mine > 0.00005 else ""
        self.stop(
            Outcome.BUDGET,
            f"the budget of ${budget:.4f} is reached: ${look.spent_usd:.4f} spent on the "
            f"step{others}{flying}, and another request (about ${average:.4f}) would take it "
            f"to ${look.spent_usd + look.others_usd + need:.4f}. Rows not sent stay as they "
            "were; raise max_cost_usd to go on.",
        )
