"""Time, injectable. Every TTL decision asks a Clock, so tests can move time.

`SBX_CLOCK_OFFSET` (a duration, optionally prefixed by `-`) shifts the system clock of a
whole process, so subprocess tests can look into the future without sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Clock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class OffsetClock(Clock):
    def __init__(self, offset: timedelta) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


class FrozenClock(Clock):
    """A clock that moves only when told: for unit tests."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> None:
        self._now += delta


def clock_from_env() -> Clock:
    from sandboxer.core.rules.settings import clock_offset

    raw = clock_offset()
    if not raw:
        return Clock()
    from sandboxer.core.rules.durations import parse_duration

    sign = -1 if raw.startswith("-") else 1
    return OffsetClock(sign * parse_duration(raw.lstrip("+-"), "SBX_CLOCK_OFFSET"))


def to_iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC with a `Z`, fixed width, so strings sort as the times do."""
    if moment is None:
        return None
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def from_iso(text: str | None) -> datetime | None:
    if text is None:
        return None
    if len(text) != 27 or text[-1] != "Z" or text[10] != "T":  # what to_iso writes, only
        raise ValueError(f"time data {text!r} does not match format '%Y-%m-%dT%H:%M:%S.%fZ'")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)  # C speed; strptime is not
