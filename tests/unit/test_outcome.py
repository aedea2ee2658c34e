"""How a run ended is decided once, from what it was when sending stopped (`_run.run.final_outcome`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmledger._ledger.states import Outcome
from llmledger._run.run import final_outcome

from . import UNIT

_GOING = (Outcome.PREPARING, Outcome.RUNNING)


@UNIT
@given(during=st.sampled_from(Outcome), foreground=st.booleans(), failed=st.booleans())
def test_an_ended_run_never_says_it_is_still_going(during: Outcome, foreground: bool, failed: bool) -> None:
    ended = final_outcome(during, foreground=foreground, failed=failed)
    assert ended not in _GOING
    if failed:  # a run that raised says so, or keeps the reason a sender stopped it for
        assert ended.stopped_early
        assert ended is (during if during.stopped_early else Outcome.ERROR)
    elif during in _GOING:
        assert ended is Outcome.COMPLETED
    elif during is Outcome.INTERRUPTED:  # in the background only Run.cancel() stops a run: it is a cancel
        assert ended is (Outcome.INTERRUPTED if foreground else Outcome.CANCELLED)
    else:  # an outage, a budget, a refused request...: the reason stands, in front or behind
        assert ended is during


def test_the_reason_a_sender_stopped_for_is_what_the_run_raises() -> None:
    assert final_outcome(Outcome.OUTAGE, foreground=True, failed=False) is Outcome.OUTAGE
    assert final_outcome(Outcome.RUNNING, foreground=False, failed=True) is Outcome.ERROR
