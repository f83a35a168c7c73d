"""The inventory's changes for a watcher (`watch()` over a service): the records changed and
the ids gone since a position the service handed out (sandboxer_tui/service/watching.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Read, Service

router = APIRouter(tags=["sandboxes"])


@router.get("/v1/inventory/changes", summary="What changed in the inventory since a position",
            response_model=s.InventoryChanges, responses=ERRORS)
async def changes(who: Read, service: Service, include_destroyed: bool = False,
                  since: Annotated[str | None, Query(
                      description="the `position` of the previous answer; none for every "
                                  "sandbox")] = None) -> JSONResponse:
    # sent as made: the records carry pool and launch too, as /v1/inventory's do
    return JSONResponse(await service.inventory.changes(include_destroyed, since, who.tenant),
                        headers={"Cache-Control": "no-cache"})
