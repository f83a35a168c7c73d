"""Named failpoints: `SBX_FAILPOINT=NAME` makes the process kill itself (SIGKILL) at NAME,
or stop itself (SIGSTOP) with `NAME:stop`. Crash tests use them to stop at exact steps."""

from __future__ import annotations

import os
import signal
import threading

POINTS = (
    "create.after-intent",    # the row says creating; nothing on the backend yet
    "create.after-backend",   # the backend object exists; the row still says creating
    "destroy.after-intent",   # the row says destroying; the backend object still exists
    "destroy.after-backend",  # the backend object is gone; the row still says destroying
    "snapshot.after-intent",  # the checkpoint row is pending; no artifact yet
    "snapshot.after-backend",  # the artifact exists; the row is still pending
    "deliver.after-send",     # a sink took a batch; its cursor has not moved yet
    "claim.before-claim",     # a create from a pooled profile is about to look for a warm
                              # member; nothing is written yet (racers line up here)
    "claim.after-claim",      # a warm pool member is the caller's (running); the backend's
                              # own deadline is not set yet and the caller has no answer
)


def failpoint(name: str) -> None:
    assert name in POINTS, f"unknown failpoint {name!r}: list it in POINTS"
    wanted = os.environ.get("SBX_FAILPOINT")
    if not wanted:
        return
    point, _, action = wanted.partition(":")
    if point != name:
        return
    # Sent to this thread, not the process: a signal to the process may be taken by another
    # thread while this one runs on (into the next transaction) before the group stops.
    signal.pthread_kill(threading.get_ident(),
                        signal.SIGSTOP if action == "stop" else signal.SIGKILL)
