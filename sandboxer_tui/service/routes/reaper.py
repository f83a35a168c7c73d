"""The reaper on request: one reconcile-and-reap cycle, or a repair of the inventory alone.
(The service's own timer, `sbx serve --reap-every`, is timer.py.)"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Admin

router = APIRouter(tags=["reaper"])


@router.post("/v1/reap", summary="One reconcile-and-reap cycle now", responses=ERRORS)
async def reap(who: Admin, body: Annotated[s.Reap | None, Body()] = None) -> dict:
    body = body or s.Reap()
    report = await who.client.reap(body.dry_run, orphans=body.orphans, timeout=body.timeout)
    return report.to_dict()


@router.post("/v1/reconcile", summary="Repair the inventory now", responses=ERRORS)
async def reconcile(who: Admin, body: Annotated[s.Reconcile | None, Body()] = None) -> dict:
    return (await who.client.reconcile(body.dry_run if body else False)).to_dict()
