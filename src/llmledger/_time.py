"""The ledger's clock: naive UTC timestamps, as stored in TIMESTAMP columns."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)
