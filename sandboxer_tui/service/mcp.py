"""`/mcp` of `sbx serve`: the MCP server (sandboxer_tui/mcp) over the SDK's streamable HTTP
transport, behind the same keys as the REST routes (docs/mcp.md). A request without a usable
key is refused (401) before the SDK sees it; each tool call then takes the caller of the HTTP
request that carried it (auth.py): a read key may call only the tools that change nothing,
and a read or write key sees its owner's sandboxes only. Mounted only when `mcp` is
installed (`pip install 'sandboxer[mcp]'`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.routing import Route

from sandboxer.service import Scope
from sandboxer_tui.service.auth import Refused, caller
from sandboxer_tui.service.errors import refusal

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

    from sandboxer_tui.mcp.server import Acting

PATH = "/mcp"


def mount(app: FastAPI) -> _Lazy | None:
    """Add `/mcp` to `app`; what `running` keeps while the app runs, or None when the SDK is
    not installed. The SDK is imported on the first request that carries a key, not before:
    it costs the service about 22 MiB of memory that a service nobody asks for MCP need not
    hold (the service's peak stays under 150 MB, docs/service.md)."""
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        return None
    lazy = _Lazy()

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        try:
            await caller(request, Scope.READ)
        except Refused as exc:
            if exc.status == 401:
                answer = refusal(401, "unauthorized", str(exc), **{"WWW-Authenticate": "Bearer"})
            else:
                answer = refusal(403, "forbidden", str(exc))
            await answer(scope, receive, send)
            return
        manager = await lazy.manager()
        await manager.handle_request(scope, receive, send)

    app.router.routes.append(Route(PATH, endpoint=_Asgi(endpoint), include_in_schema=False,
                                   methods=["GET", "POST", "DELETE"]))
    return lazy


class _Lazy:
    """The SDK's session manager, built and run on first use; its task group lives in a task
    of its own (an anyio task group is left in the task that entered it) until `stop`."""

    def __init__(self) -> None:
        self._manager: Any | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def manager(self) -> Any:
        async with self._lock:
            if self._manager is None:
                manager = _build()
                ready = asyncio.Event()

                async def serve() -> None:
                    async with manager.run():
                        ready.set()
                        await self._stop.wait()

                self._task = asyncio.create_task(serve())
                waiting = asyncio.create_task(ready.wait())
                await asyncio.wait({waiting, self._task}, return_when=asyncio.FIRST_COMPLETED)
                if not ready.is_set():
                    waiting.cancel()
                    await self._task  # raises why it could not run
                self._manager = manager
        return self._manager

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._task


def _build() -> Any:
    """The MCP server over this service's keys, and its session manager."""
    from importlib.metadata import version

    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.transport_security import TransportSecuritySettings

    from sandboxer_tui.mcp.server import Acting, actor_of, build

    async def resolve(ctx: Context, write: bool) -> Acting:
        request = ctx.request_context.request
        if not isinstance(request, Request):
            raise ToolError("this call came without its HTTP request")
        try:
            who = await caller(request, Scope.WRITE if write else Scope.READ)
        except Refused as exc:
            raise ToolError(str(exc)) from None
        service = request.app.state.service
        client = service.client.acting_as(actor_of(who.actor, ctx),
                                          tenant=who.tenant or False)
        return Acting(client, who.actor)

    server = build(resolve, version=version("sandboxer"))
    # Every request carries a key (or comes over the 0600 unix socket), which a page that
    # rebinds a name to this address does not have: the Host check would only refuse the
    # names an operator serves under.
    server.streamable_http_app(
        streamable_http_path=PATH, json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    return server.session_manager


class _Asgi:
    """An ASGI callable that Starlette's Route takes as an app, not as a request handler."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


@contextlib.asynccontextmanager
async def running(lazy: _Lazy | None) -> AsyncIterator[None]:
    """For as long as the app runs; the session manager, if it was started, stopped after."""
    try:
        yield
    finally:
        if lazy is not None:
            await lazy.stop()
