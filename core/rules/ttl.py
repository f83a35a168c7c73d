"""The TTL rules, in one place: when a sandbox expires and why, how extend moves a deadline,
when the expiry warning is due. Pure functions over a sandbox row and a time."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sandboxer.core.rules.clock import from_iso, to_iso
from sandboxer.core.rules.states import ACTIVE, State

EXPIRY_REASONS = ("ttl", "idle", "max-ttl", "max-age")


def idle_deadline(row: Mapping[str, Any]) -> datetime | None:
    if not row.get("idle_timeout_s"):
        return None
    return from_iso(row["last_activity_at"]) + timedelta(seconds=row["idle_timeout_s"])


def effective_deadline(row: Mapping[str, Any]) -> datetime:
    """The earliest of the deadline and the idle deadline."""
    deadline = from_iso(row["deadline"])
    idle = idle_deadline(row)
    return min(deadline, idle) if idle else deadline


def expiry_reason(row: Mapping[str, Any], now: datetime) -> str | None:
    """`ttl`, `idle` or `max-ttl` when the sandbox is past its time (`max-age` for a warm
    pool member, whose deadline is its pool's max_age); None otherwise."""
    deadline = from_iso(row["deadline"])
    if row.get("state") == State.WARM:
        return "max-age" if deadline <= now else None
    idle = idle_deadline(row)
    if idle is not None and idle <= now and idle < deadline:
        return "idle"
    if deadline <= now:
        return "max-ttl" if deadline >= from_iso(row["hard_deadline"]) else "ttl"
    return None


def extended(deadline: datetime, hard_deadline: datetime, by: timedelta) -> tuple[datetime, bool]:
    """(new deadline, capped): adds `by`, never past the hard deadline, never earlier. A `by`
    too long for the calendar (past year 9999) is past the hard deadline too: capped, never
    an OverflowError."""
    if by > hard_deadline - deadline:  # checked before adding, which could overflow
        return max(deadline, hard_deadline), True
    wanted = deadline + max(by, timedelta(0))  # a non-positive `by` changes nothing
    if wanted > hard_deadline:
        return max(deadline, hard_deadline), True
    return wanted, False


def warning_due(row: Mapping[str, Any], now: datetime, warn_before: timedelta) -> bool:
    """The `sandbox.expiring` event is due once per deadline (an extend re-arms it)."""
    if row["state"] not in ACTIVE:
        return False
    deadline = effective_deadline(row)
    if row.get("warned_deadline") == to_iso(deadline):
        return False
    return deadline - warn_before <= now < deadline
