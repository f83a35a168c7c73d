"""The service's routes, one `APIRouter` per resource; `build_app` includes `ROUTERS`. Within
a router a literal path (`/v1/checkpoints/prune`) comes before the `{ref}` path beside it."""

from __future__ import annotations

from sandboxer_tui.service.routes import (
    checkpoints,
    commands,
    events,
    evidence,
    files,
    health,
    inventory,
    keys,
    metrics,
    pools,
    ports,
    processes,
    profiles,
    reaper,
    sandboxes,
    terminals,
    volumes,
)

# ports first: its proxy answers every request to a sandbox's port, and FastAPI tries the
# routers in order (none of its paths is another router's)
ROUTERS = (ports.router, health.router, metrics.router, sandboxes.router, commands.router,
           files.router, processes.router, evidence.router,
           checkpoints.router, events.router, reaper.router, profiles.router, pools.router,
           keys.router, terminals.router, volumes.router, inventory.router)
