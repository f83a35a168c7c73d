"""The one parser for durations: `90s`, `15m`, `2h`, `1d`, `1h30m`. Zero and negative are refused,
and so is anything longer than LONGEST: a deadline is a date, and a date ends in year 9999."""

from __future__ import annotations

import re
from datetime import timedelta

from sandboxer.core.rules.errors import BadInput

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)([dhms])")
_WHOLE = re.compile(r"(?:\d+[dhms])+")
# 1000 years: past any deadline anyone means, and far enough from the calendar's end that a
# deadline computed from it (now + ttl) is always a date
LONGEST = timedelta(days=365_000)


def parse_duration(text: str, what: str = "duration") -> timedelta:
    """Parse a positive duration; BadInput naming `what` otherwise."""
    raw = str(text).strip().lower()
    if not _WHOLE.fullmatch(raw):
        raise BadInput(
            f"bad {what} {text!r}: use a positive duration such as 90s, 15m, 2h, 1d or 1h30m"
        )
    units = [u for _, u in _PART.findall(raw)]
    if len(set(units)) != len(units) or units != sorted(units, key=lambda u: -_UNITS[u]):
        raise BadInput(f"bad {what} {text!r}: give each unit once, largest first (like 1h30m)")
    try:
        seconds = sum(int(n) * _UNITS[u] for n, u in _PART.findall(raw))
    except ValueError:  # more digits than int() reads: too long anyway
        seconds = None
    if seconds is not None and seconds <= 0:
        raise BadInput(f"bad {what} {text!r}: must be longer than zero")
    if seconds is None or seconds > LONGEST.total_seconds():
        raise BadInput(f"bad {what} {text!r}: longer than sbx takes (at most "
                       f"{format_duration(LONGEST)}, 1000 years)")
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    """Compact form that parse_duration reads back (`1h30m`); `0s` for zero or less."""
    seconds = int(delta.total_seconds())
    if seconds <= 0:
        return "0s"
    parts = []
    for unit, size in _UNITS.items():
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)
