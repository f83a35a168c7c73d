"""`/e2b` of `sbx serve`: the E2B API (sandboxer_tui/e2b_api, docs/e2b-api.md), the control
plane and envd under one prefix, so `E2B_API_URL` and `E2B_SANDBOX_URL` are both
`SERVICE_URL/e2b`. Behind the same keys as the REST routes (auth.py reads the SDK's
`X-API-KEY` and `X-Access-Token` there): each call runs through the caller's client, acting
as the key's owner, narrowed to its tenant; a read key may only look."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request

from sandboxer.service import Scope
from sandboxer_tui.service.auth import Refused, caller

PATH = "/e2b"


def mount(app: FastAPI) -> None:
    from sandboxer_tui.e2b_api.app import Denied, E2BApi

    async def resolve(scope: dict[str, Any], write: bool):
        request = Request(scope)
        try:
            who = await caller(request, Scope.WRITE if write else Scope.READ)
        except Refused as exc:
            raise Denied(exc.status, str(exc)) from None
        token = request.headers.get("x-api-key") or request.headers.get("x-access-token")
        return who.client, (token or "").strip()

    app.mount(PATH, E2BApi(resolve))
