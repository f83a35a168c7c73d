"""The state table: every legal transition and the event type it writes. One place."""

from __future__ import annotations

import enum

from core.errors import Conflict


class State(enum.StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSED = "paused"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    FAILED = "failed"
    LOST = "lost"


S = State
LIVE = frozenset({S.CREATING, S.RUNNING, S.PAUSED, S.DESTROYING})
# Holding resources on a deadline: extend applies, the TTL counts down.
ON_THE_CLOCK = frozenset({S.CREATING, S.RUNNING, S.PAUSED})
# Up and usable: touch applies, the expiry warning fires.
ACTIVE = frozenset({S.RUNNING, S.PAUSED})
# What the reaper destroys when due (a creating row only once its lease has lapsed).
REAPABLE = frozenset({S.CREATING, S.RUNNING, S.PAUSED, S.LOST})

# (from, to) -> event type written with the transition.
TRANSITIONS: dict[tuple[State, State], str] = {
    (S.CREATING, S.RUNNING): "sandbox.created",
    (S.CREATING, S.FAILED): "sandbox.failed",
    (S.RUNNING, S.PAUSED): "sandbox.paused",
    (S.PAUSED, S.RUNNING): "sandbox.resumed",
    (S.RUNNING, S.DESTROYING): "sandbox.destroying",
    (S.PAUSED, S.DESTROYING): "sandbox.destroying",
    (S.CREATING, S.DESTROYING): "sandbox.destroying",
    # cleaning up what a failed create or a lost sandbox may have left behind
    (S.FAILED, S.DESTROYING): "sandbox.destroying",
    (S.LOST, S.DESTROYING): "sandbox.destroying",
    (S.DESTROYING, S.DESTROYED): "sandbox.destroyed",
    (S.CREATING, S.LOST): "sandbox.lost",
    (S.RUNNING, S.LOST): "sandbox.lost",
    (S.PAUSED, S.LOST): "sandbox.lost",
    (S.DESTROYING, S.LOST): "sandbox.lost",
}

# The event type of a new row, which has no "from" state.
CREATED_EVENT = "sandbox.creating"
# ...or of a row that reconcile made for a backend object of ours that had none.
ADOPTED_EVENT = "sandbox.adopted"


class IllegalTransition(Conflict):
    pass


def transition_event(current: State | str, target: State | str) -> str:
    """The event type for current -> target; IllegalTransition (exit 4) when not allowed."""
    key = (State(current), State(target))
    try:
        return TRANSITIONS[key]
    except KeyError:
        raise IllegalTransition(
            f"sandbox is {key[0].value}: it cannot become {key[1].value}"
        ) from None


def can_transition(current: State | str, target: State | str) -> bool:
    return (State(current), State(target)) in TRANSITIONS


def entry_events(target: State | str) -> set[str]:
    """The event types written on entering `target` (to find an interrupted intent's reason)."""
    return {event for (_, dst), event in TRANSITIONS.items() if dst == State(target)}


def leased(row, now_iso: str) -> bool:
    """Some process holds this row's lease: its operation is in progress."""
    return bool(row["lease_owner"]) and row["lease_expires_at"] >= now_iso
