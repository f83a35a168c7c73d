"""Named failpoints: `SBX_FAILPOINT=NAME` makes the process kill itself (SIGKILL) at NAME,
or stop itself (SIGSTOP) with `NAME:stop`. Crash tests use them to stop at exact steps.
The mechanism is sandboxer.adapters.base.failpoint, which adapters call too; every name is listed here."""

from __future__ import annotations

from sandboxer.adapters import base

POINTS = (
    "create.after-intent",    # the row says creating; nothing on the backend yet
    "create.after-backend",   # the backend object exists; the row still says creating
    "create.during-setup",    # the profile's first setup command ran; the row says creating
    "create.after-running",   # the row says running; the caller has no answer yet
    "idempotency.after-claim",  # an Idempotency-Key is claimed; no sandbox recorded yet
    "destroy.after-intent",   # the row says destroying; the backend object still exists
    "destroy.after-backend",  # the backend object is gone; the row still says destroying
    "snapshot.after-intent",  # the checkpoint row is pending; no artifact yet
    "snapshot.after-backend",  # the artifact exists; the row is still pending
    "deliver.after-send",     # a sink took a batch; its cursor has not moved yet
    "compose.after-up",       # the compose backend: `compose up` made the project; create
                              # has not returned (the row says creating, no backend ref)
    "claim.before-claim",     # a create from a pooled profile is about to look for a warm
                              # member; nothing is written yet (racers line up here)
    "claim.after-claim",      # a warm pool member is the caller's (running); the backend's
                              # own deadline is not set yet and the caller has no answer
)


def failpoint(name: str) -> None:
    assert name in POINTS, f"unknown failpoint {name!r}: list it in POINTS"
    base.failpoint(name)
