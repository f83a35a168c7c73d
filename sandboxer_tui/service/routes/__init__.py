"""The service's routes, one `APIRouter` per resource; `build_app` includes `ROUTERS`. Within
a router a literal path (`/v1/checkpoints/prune`) comes before the `{ref}` path beside it."""

from __future__ import annotations

from sandboxer_tui.service.routes import (
    checkpoints,
    commands,
    events,
    evidence,
    health,
    keys,
    metrics,
    pools,
    profiles,
    reaper,
    sandboxes,
)

ROUTERS = (health.router, metrics.router, sandboxes.router, commands.router, evidence.router,
           checkpoints.router, events.router, reaper.router, profiles.router, pools.router,
           keys.router)
