"""What the routes share, as FastAPI dependencies: the service's state (made once by
`build_app`), the caller of a request (auth.py), and the error responses every route
documents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from sandboxer import AsyncSandboxer
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.auth import ADMIN, READ, WRITE, Caller
from sandboxer_tui.service.metrics import ServiceMetrics
from sandboxer_tui.service.watching import InventoryVersions


@dataclass(frozen=True)
class ServiceState:
    """One app's state: `app.state.service`."""

    client: AsyncSandboxer  # the service's own (a sandboxer.service.ServiceClient)
    actor: str  # who a request over the unix socket without a key acts as
    socket_path: str | None  # the unix socket it listens on, if any
    metrics: ServiceMetrics
    inventory: InventoryVersions
    evidence_key: str | None  # the private key file evidence is signed with, if any
    max_exec_output: int  # bytes of stdout (and of stderr) an exec's JSON reply keeps


def service_state(request: Request) -> ServiceState:
    return request.app.state.service


def service_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.service.metrics


Service = Annotated[ServiceState, Depends(service_state)]
Metrics = Annotated[ServiceMetrics, Depends(service_metrics)]
Read = Annotated[Caller, Depends(READ)]
Write = Annotated[Caller, Depends(WRITE)]
Admin = Annotated[Caller, Depends(ADMIN)]
Accept = Annotated[str | None, Header(include_in_schema=False)]

ERRORS = {status: {"model": s.ErrorBody, "description": what} for status, what in (
    (400, "bad input: nothing was written"), (401, "no API key, or not one of ours"),
    (403, "the key's scope does not allow it"), (404, "no such sandbox, checkpoint or profile"),
    (409, "the state does not allow it, or another process holds it"),
    (422, "the request does not follow this document"),
    (503, "a backend or the database cannot be reached"))}
