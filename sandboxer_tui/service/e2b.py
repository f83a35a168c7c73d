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


class SignedFileUrls:
    """The SDK's signed file URLs (`download_url`, `upload_url`) answered 501 with E2B's
    error body, ahead of the key check: the SDK joins envd's `/files` to `E2B_SANDBOX_URL`,
    so they reach the host's root, and with one URL for every sandbox they do not say which
    sandbox they are for. Nothing is read or written; any other request goes on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/files" \
                and b"signature=" in scope.get("query_string", b""):
            import json

            from sandboxer_tui.e2b_api.app import unimplemented  # (its wire.py's)

            body = json.dumps({"code": 501, "message": unimplemented(
                "signed file URLs (download_url, upload_url; use files.read and files.write)"
            )}).encode()
            await send({"type": "http.response.start", "status": 501, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
