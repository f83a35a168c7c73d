"""Query values several routes read: a time (a duration ago or a moment), labels, and the
event id a stream resumes after."""

from __future__ import annotations

from datetime import datetime, timedelta

from sandboxer.core.rules.errors import BadInput


def since(text: str | None) -> datetime | timedelta | None:
    """A duration ago ("15m") or an ISO 8601 time."""
    if text is None:
        return None
    from sandboxer.core.rules.durations import parse_duration

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return parse_duration(text, "since")
    if moment.tzinfo is None:
        raise BadInput(f"bad since {text!r}: give a duration (15m) or a time with its zone")
    return moment


def labels(texts: list[str]) -> dict[str, str] | None:
    """K=V texts as labels (None: no filter)."""
    from sandboxer.core.rules.labels import parse_labels

    return parse_labels(texts) or None


def after(after: int | None, last_event_id: str | None) -> int | None:
    """The event id to resume after: a reconnect's Last-Event-ID wins over `after`."""
    if last_event_id is not None:
        try:
            return int(last_event_id)
        except ValueError:
            raise BadInput(f"bad Last-Event-ID {last_event_id[:40]!r}: an event id") from None
    return after
