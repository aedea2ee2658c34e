"""How a run sends: the options the scheduler and the senders read, fixed before the first claim.

Its own module so the scheduler, the recorder and the batch senders all depend on it and not on each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmledger._step.attach import Attachments

RENEW_EVERY = 60.0  # at most this many seconds between heartbeats on a run's claims (a quarter of stale_after if less)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry the API's own failures (429, 529, 5xx, timeouts, dropped connections).

    The circuit breaker trips when `outage_failures` transient failures in a row
    have happened and nothing succeeded for `outage_after` seconds.
    """

    base_delay: float = 1.0
    max_delay: float = 30.0
    outage_after: float = 60.0
    outage_failures: int = 10


@dataclass(frozen=True)
class RunConfig:
    chunk_size: int
    concurrency: int
    max_attempts: int
    commit_every: float
    retry: RetryPolicy
    dedupe: bool = True  # rows with identical requests share one call
    grace: float = 1.0  # seconds in-flight requests get to finish after an interrupt
    validate: Callable[[dict[str, Any], Any], str | None] | None = None  # apply_llm's validate=
    max_cost_usd: float | None = None  # stop starting requests once this much is spent
    budget_scope: str = "run"  # "step": the budget also counts what earlier runs of the step spent, and
    # what its concurrent runs reserved
    spent_before_usd: float = 0.0  # that, as the ledger holds it when the run starts
    average_before_usd: float = 0.0  # the step's average paid answer so far (what a request costs, before this
    # run's first answer says)
    output_model: Any = field(default=None, compare=False)  # the pydantic model of output= (apply_llm only)
    stale_after: float = 1800.0  # seconds after which another run may take back a claim that stopped beating
    source: str | None = None  # where the run's answers come from (`answer_source`), stored with each answer
    adaptive: bool = False  # a server that announces no limits (base_url=): requests at once follow its answers
    api: str | None = None  # the step's API when not its provider's default ("responses"): batches are made for it
    attachments: Attachments | None = field(default=None, compare=False)  # attach=: where this process has the
    # bytes of the files its rows' requests name
    # "flex": each request is sent at OpenAI's flex tier (mode="flex"), which is no part of the row's request (as
    # sending it in a batch is not): a flex answer and a standard one stand in for each other
    service_tier: str | None = None
    deadline: float | None = None  # Unix time: flex requests go at the standard tier once it would be missed

    @property
    def renew_every(self) -> float:
        """The heartbeat: often enough that a live claim never looks lapsed, even after a missed beat or two."""
        return min(RENEW_EVERY, self.stale_after / 4)
