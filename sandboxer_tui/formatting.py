"""How the front ends write durations, ages, sizes and errors for people: one module for the
CLI and the dashboard. (Kept light: `sbx ls` imports it.)

Two forms of a duration, each where it serves:
- `exact_duration` (`1d1h1m1s`), what the CLI prints: every unit, and `sandboxer.core.rules.durations` reads
  it back, so a printed TTL can be pasted into `--ttl` or `sbx extend`;
- `compact_duration` (`1d1h`), what the dashboard's cells show: two units at most, fixed
  width within a unit, easy to read while it ticks every second.
"""

from __future__ import annotations

from datetime import datetime, timedelta


def _seconds(value: float | timedelta) -> int:
    return int(value.total_seconds() if isinstance(value, timedelta) else value)


def exact_duration(value: float | timedelta | None) -> str:
    """Every unit, largest first (`1h30m`, `1d1h1m1s`); `0s` for zero or less; `-` for None.
    sandboxer.core.rules.durations.parse_duration reads it back."""
    if value is None:
        return "-"
    from sandboxer.core.rules.durations import format_duration

    return format_duration(timedelta(seconds=_seconds(value)))


def exact_age(created: datetime, now: datetime) -> str:
    """How long ago `created` was, as `exact_duration` writes it."""
    return exact_duration(now - created)


def compact_duration(value: float | timedelta | None) -> str:
    """Compact and readable at a glance: `42s`, `29m59s`, `3h59m`, `2d3h`; `-` for None."""
    if value is None:
        return "-"
    s = max(0, _seconds(value))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def compact_age(value: float | timedelta) -> str:
    """An age needs less precision than a countdown: `42s`, `12m`, `3h12m`, `2d3h`."""
    s = max(0, _seconds(value))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    return compact_duration(s)


def human_bytes(value: float | None) -> str:
    """The largest unit that fits, one decimal: `512B`, `64.0MB`, `3.0GB`; `-` for None."""
    if value is None:
        return "-"
    for unit, size in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{int(value)}B"


def megabytes(value: float | None) -> str:
    """Always in MB, one decimal (`sbx metrics` lines up its columns): `64.0MB`; `-`."""
    return "-" if value is None else f"{value / 1024**2:.1f}MB"


def one_line(exc: BaseException) -> str:
    """The one-line message a person sees for any error (sandboxer.core.rules.errors.one_line)."""
    from sandboxer.core.rules.errors import one_line as rule

    return rule(exc)


def printable(value: object) -> str:
    """`value` as text a terminal shows and does not obey: a control character (an escape
    sequence from a name, an owner, a task or a label) is written out as `\\x1b`, never sent.
    The JSON output escapes them by itself."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
