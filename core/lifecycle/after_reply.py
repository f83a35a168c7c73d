"""The writes an operation leaves until its caller has the answer.

The in-process transport (sandboxer/_local.py) gives the answer first and does these next,
before its core loop takes anything else, so every later call through that client sees
them; with no such caller they are done at once. docs/reliability.md says what it costs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

PENDING: ContextVar[list[Callable[[], None]] | None] = ContextVar("sbx_after_reply",
                                                                    default=None)


def after_reply(work: Callable[[], None]) -> None:
    pending = PENDING.get()
    if pending is None:
        work()
    else:
        pending.append(work)


def collecting() -> bool:
    """Whether an enclosing call already collects what is left for after its answer."""
    return PENDING.get() is not None


@contextmanager
def collected() -> Iterator[list[Callable[[], None]]]:
    """What the operations inside leave for after the answer, to hand to `run` then."""
    pending: list[Callable[[], None]] = []
    token = PENDING.set(pending)
    try:
        yield pending
    finally:
        PENDING.reset(token)


def run(pending: list[Callable[[], None]]) -> None:
    """Each one; one that fails is logged, and the rest still run."""
    for work in pending:
        try:
            work()
        except Exception:
            import logging  # only here: `sbx ls` and the other fast paths never load it

            logging.getLogger("sandboxer").exception(
                "sbx: a record left for after the answer was not written")
