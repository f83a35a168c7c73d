"""The writes an operation leaves until its caller has the answer.

The in-process transport (sandboxer/_local.py) gives the answer first and does these next,
before its core loop takes anything else, so every later call through that client sees
them; with no such caller they are done at once. docs/reliability.md says what it costs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

PENDING: ContextVar[list[Callable[[], None]] | None] = ContextVar("sbx_after_reply",
                                                                    default=None)


def after_reply(work: Callable[[], None]) -> None:
    pending = PENDING.get()
    if pending is None:
        work()
    else:
        pending.append(work)
