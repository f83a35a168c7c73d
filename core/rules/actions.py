"""What a reconcile cycle can do, as data: the kinds of action in the order a cycle applies
them, and one planned action. The planners (sandboxer.core.reconcile.reaper, and the pools'
planner it plugs in, sandboxer.core.pools) return these; the reaper applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandboxer.adapters.base import BackendObject

# Actions, in the order a cycle applies them.
FINISH_CREATE = "finish-create"  # an interrupted create whose object exists: running
FAIL = "fail"                    # an interrupted create with no object: failed
LOSE = "lose"                    # the backend no longer has it, or it stopped out of band
SYNC = "sync"                    # paused or resumed out of band: record it
RESTART = "restart"              # the backend started it again (an engine restart): record it
ADOPT = "adopt"                  # an object of ours with no row, before its hard deadline
DESTROY = "destroy"              # expired, failed (settled), or an interrupted destroy
DESTROY_OBJECT = "destroy-object"  # an object whose row is gone or destroyed (orphan)
RETIRE = "retire"                # a warm pool member its pool no longer wants (sandboxer.core.pools)
FILL = "fill"                    # one new warm member for a pool short of its size
WARN = "warn"                    # sandbox.expiring
CHECKPOINTS = "checkpoints"      # expired, interrupted or orphaned checkpoints on a backend
ORDER = (FINISH_CREATE, FAIL, LOSE, SYNC, RESTART, ADOPT, DESTROY, DESTROY_OBJECT, RETIRE,
         FILL, WARN, CHECKPOINTS)


@dataclass(frozen=True)
class Action:
    kind: str
    backend: str
    sandbox_id: str | None
    ref: str | None = None
    reason: str | None = None
    target: str | None = None  # the state for LOSE / SYNC / FAIL
    expect: str | None = None  # the state the plan saw; re-checked when applied
    obj: BackendObject | None = None
    pool: str | None = None  # the pool (profile) of a pool member, or that FILL fills

    def describe(self) -> dict[str, Any]:
        described = {"action": self.kind, "id": self.sandbox_id, "backend": self.backend,
                     "ref": self.ref, "reason": self.reason, "state": self.target}
        return {**described, "pool": self.pool} if self.pool else described
