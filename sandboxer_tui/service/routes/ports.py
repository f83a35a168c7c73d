"""A sandbox's TCP ports (docs/terminals-and-ports.md): where each published port is reached
from the service's host, and exposing one while the sandbox runs, where its backend can.

`.../ports/{port}/...` below the list is the service's proxy to a port (its own section)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from sandboxer_tui.service.deps import ERRORS, Read, Write

router = APIRouter(tags=["ports"])
PORTS = "/v1/sandboxes/{ref}/ports"
PortNumber = Annotated[int, Path(ge=1, le=65535, description="a TCP port in the sandbox")]


class PortView(BaseModel):
    """One published port of a sandbox."""

    port: int = Field(description="the TCP port inside the sandbox")
    url: str = Field(description="where it is reached from the service's host, e.g. "
                                 "http://127.0.0.1:49153 (Docker), https://... (E2B, Modal)")


# -- where a sandbox's ports are reached ---------------------------------------------------


@router.get(PORTS, summary="A sandbox's published ports and their URLs",
            response_model=list[PortView], responses=ERRORS)
async def list_ports(who: Read, ref: str, port: Annotated[int | None, Query(
        ge=1, le=65535, description="only this port (404 when it is not published)")] = None,
        ) -> JSONResponse:
    box = await who.client.get(ref)
    if port is not None:
        return JSONResponse([{"port": port, "url": await box.url(port)}])
    return JSONResponse([{"port": p, "url": url} for p, url in (await box.ports()).items()])


@router.post(PORTS + "/{port}", summary="Expose a port while the sandbox runs (where the "
             "backend can: E2B, Modal; Docker publishes only the profile's `ports:`)",
             response_model=PortView, responses=ERRORS)
async def expose(who: Write, ref: str, port: PortNumber) -> JSONResponse:
    box = await who.client.get(ref)
    return JSONResponse({"port": port, "url": await box.expose(port)})


# -- the proxy to a port and preview links (docs/terminals-and-ports.md, "The proxy and
# preview links") ------------------------------------------------------------------------
