"""Named failpoints: `SBX_FAILPOINT=NAME` makes the process kill itself (SIGKILL) at NAME,
or stop itself (SIGSTOP) with `NAME:stop`. Crash tests use them to stop at exact steps."""

from __future__ import annotations

import os
import signal

POINTS = (
    "create.after-intent",    # the row says creating; nothing on the backend yet
    "create.after-backend",   # the backend object exists; the row still says creating
    "destroy.after-intent",   # the row says destroying; the backend object still exists
    "destroy.after-backend",  # the backend object is gone; the row still says destroying
)


def failpoint(name: str) -> None:
    wanted = os.environ.get("SBX_FAILPOINT")
    if not wanted:
        return
    point, _, action = wanted.partition(":")
    if point != name:
        return
    os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)
