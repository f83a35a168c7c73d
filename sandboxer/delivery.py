"""Event delivery's settings, checked before a long-running process relies on them
(`sbx reap --every` refuses a bad sink setting before its first cycle, not at it)."""

from __future__ import annotations


def check_settings() -> None:
    """Raise `BadInput` naming the settings file (or `SBX_WEBHOOK_URL`) and the field when a
    sink's setting is bad; return when every setting is usable (docs/events.md)."""
    from sandboxer.core.observe.delivery import load_settings

    load_settings()


__all__ = ["check_settings"]
