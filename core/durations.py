"""The one parser for durations: `90s`, `15m`, `2h`, `1d`, `1h30m`. Zero and negative are refused."""

from __future__ import annotations

import re
from datetime import timedelta

from core.errors import BadInput

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)([dhms])")
_WHOLE = re.compile(r"(?:\d+[dhms])+")


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
    seconds = sum(int(n) * _UNITS[u] for n, u in _PART.findall(raw))
    if seconds <= 0:
        raise BadInput(f"bad {what} {text!r}: must be longer than zero")
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
