"""A call on a model that shuts down soon says so before anything is paid.

The facts are the price table's (`_step/models.py`); for OpenAI's own API (or the simulator standing in for it),
what its `GET /v1/models` says of each model's `shutdown_date` is read first, once per process, so a date announced
after this release of llmledger counts too. A server named by `base_url=` serves its own models under its own
names: no lifecycle applies there.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from llmledger._exec.apis import for_provider
from llmledger._step import models as model_facts
from llmledger.errors import warn


def warn_if_retiring(
    model: str, *, provider: str, client: Any, endpoint: str | None, gateway: bool = False, today: date | None = None
) -> None:
    """Warn (`ModelRetiringWarning`, at the user's line) when `model` shuts down within 60 days, naming the date and
    its replacement; nothing when it is a server's own model (`endpoint`, but for a gateway to the provider's API)."""
    if endpoint is not None and not gateway:
        return
    if client is not None:
        for_provider(provider).read_shutdown_dates(client)  # what the API says, where it says it
    notice = model_facts.retirement_notice(model, provider, today or model_facts.current_day())
    if notice is not None:
        warn(notice, model_facts.ModelRetiringWarning)
