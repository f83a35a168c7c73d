"""The app of `sbx serve` (docs/service.md): its state, the routers (routes/, one per
resource), the error handlers (errors.py), the limits (limits.py) and the timer (timer.py).
Each route parses, calls the library through the caller's client (acting as the key's
owner) and shows the record's `to_dict()`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from fastapi import FastAPI

from sandboxer import AsyncSandboxer
from sandboxer_tui.service import e2b, errors, mcp, timer
from sandboxer_tui.service.deps import ServiceState
from sandboxer_tui.service.metrics import ServiceMetrics
from sandboxer_tui.service.routes import ROUTERS
from sandboxer_tui.service.watching import InventoryVersions


def build_app(client: AsyncSandboxer, *, actor: str, socket_path: str | None = None,
              reap_every: timedelta | None = None, evidence_key: str | None = None) -> FastAPI:
    """The service over `client` (a `sandboxer.service.ServiceClient`, which the caller owns
    and closes). With `reap_every`, a reaper cycle and a delivery run on that timer while the
    app runs. With `evidence_key` (an ed25519 private key file, read at each use), it signs
    evidence on request."""
    from importlib.metadata import version

    from sandboxer.core.rules import settings

    state = ServiceState(client=client, actor=actor, socket_path=socket_path,
                         metrics=ServiceMetrics(), inventory=InventoryVersions(client),
                         evidence_key=evidence_key,
                         max_exec_output=settings.serve_max_exec_output())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = None
        if reap_every is not None:
            task = asyncio.create_task(timer.run(client, reap_every, stop, state.metrics))
        try:
            async with mcp.running(app.state.mcp):  # /mcp's sessions (service/mcp.py)
                yield
        finally:
            stop.set()
            if task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(task, 30)
            await state.inventory.close()
            proxy = getattr(app.state, "proxy", None)  # the port proxy's pool (routes/ports.py)
            if proxy is not None:
                await proxy.close()

    app = FastAPI(title="Sandboxer", version=version("sandboxer"), lifespan=lifespan,
                  openapi_url="/openapi.json", docs_url=None, redoc_url=None,
                  description="Short-lived sandboxes from profiles, on deadlines, on record: "
                              "the `sandboxer` library over HTTP (docs/service.md).")
    app.state.service = state
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    app.state.mcp = mcp.mount(app)  # MCP at /mcp, when the SDK is installed
    e2b.mount(app)  # the E2B API at /e2b (docs/e2b-api.md)
    _document_keys(app)
    from sandboxer_tui.service.proxy_asgi import FastProxy, KeyCache, Keys

    app.add_middleware(FastProxy)  # the proxy's fast path, inside the limits (proxy_asgi.py)
    _limits(app)
    app.add_middleware(KeyCache, keys=Keys())  # and its keys, before them
    app.add_middleware(e2b.SignedFileUrls)  # the E2B SDK's signed URLs: a 501 (e2b.py)
    return app


def _limits(app: FastAPI) -> None:
    """The service's limits (limits.py), from the settings as it starts: bad ones stop it."""
    from sandboxer.core.rules import settings
    from sandboxer_tui.service.limits import Limits, Streams

    app.add_middleware(Limits, max_body=settings.serve_max_body(),
                       max_upload=settings.serve_max_upload(),
                       max_input=settings.serve_max_input(),
                       streams=Streams(settings.serve_max_streams(),
                                       settings.serve_max_streams_per_key()),
                       max_connections=settings.serve_max_connections())


def _document_keys(app: FastAPI) -> None:
    """The document says every route but /healthz and /readyz takes a Bearer key."""
    make = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = make()
            doc.setdefault("components", {})["securitySchemes"] = {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "an API key (sbx api-keys create); none over the unix socket"}}
            doc["security"] = [{"bearer": []}]
            for path in ("/healthz", "/readyz"):
                for operation in doc["paths"].get(path, {}).values():
                    operation["security"] = []
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
