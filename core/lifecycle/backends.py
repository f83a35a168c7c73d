"""What each backend offers here, asked through the Manager's own adapters (the ones its
actions use): loaded? reachable? credentials? a test double? its capabilities; and the
interactive shell of a sandbox, which only the adapter knows how to open. Reached through the
library (`AsyncSandboxer.backends`, `AsyncSandbox.shell_command`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandboxer.adapters.base import Capability
from sandboxer.core.rules.errors import Conflict, one_line
from sandboxer.core.rules.states import State

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager


async def backend_status(mgr: Manager, name: str, *, check: bool = True,
                         timeout_s: float = 5.0) -> dict[str, Any]:
    """One backend; never raises. `check`: ask its health (a backend that does not answer
    within `timeout_s` is unreachable); without it, only what loading it tells."""
    status: dict[str, Any] = {"name": name, "loaded": False, "test_double": False,
                              "capabilities": [], "checked": check, "reachable": None,
                              "credentials": None, "detail": ""}
    try:
        adapter = mgr.adapter(name)
    except Exception as exc:
        status.update(reachable=False, detail=one_line(exc))
        return status
    # memory checkpoints need a probe of the engine and of CRIU: `doctor()` reports them
    status.update(loaded=True, test_double=bool(adapter.test_double),
                  capabilities=sorted(c.value for c in Capability
                                      if c != Capability.MEMORY_CHECKPOINT
                                      and adapter.supports(c)))
    if not check:
        return status
    try:
        health = await asyncio.wait_for(adapter.health(), timeout_s)
    except TimeoutError:
        status.update(reachable=False, detail=f"no answer in {timeout_s:g}s")
        return status
    except Exception as exc:  # health() must not raise; a broken one is unreachable
        status.update(reachable=False, detail=one_line(exc))
        return status
    status.update(reachable=bool(health.reachable), credentials=bool(health.credentials),
                  detail=" ".join(health.detail.split()))
    return status


async def backend_statuses(mgr: Manager, names: Sequence[str] | None = None, *,
                           check: bool = True, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """`names` (default: every registered backend), asked at once, in that order."""
    from sandboxer.adapters import registry

    wanted = list(registry.names() if names is None else names)
    return list(await asyncio.gather(*(backend_status(mgr, n, check=check,
                                                      timeout_s=timeout_s) for n in wanted)))


async def shell_argv(mgr: Manager, ref: str) -> list[str]:
    """The command line that opens an interactive shell in a running sandbox, for a caller
    to hand its terminal to. Conflict (exit 4) when it is not running or its backend offers
    none here; Unavailable (exit 5) when the backend cannot be reached."""
    row = mgr.resolve(ref)
    require_running_for_shell(row)
    adapter = await mgr.adapter_for(row)
    if not adapter.supports(Capability.SHELL):
        raise Conflict(f"the {row['backend']} backend offers no interactive shell here")
    return list(adapter.shell_argv(row["backend_ref"]))


def require_running_for_shell(row: Mapping[str, Any]) -> None:
    """Conflict (exit 4) unless the sandbox (its row or its record) is running."""
    if row["state"] != State.RUNNING:
        raise Conflict(f"sandbox {row['id']} is {row['state']}: a shell needs it running")
