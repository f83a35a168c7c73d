"""`sbx mcp`: the MCP server over stdio, for a desktop agent that starts it (docs/mcp.md). It
acts as the local user (or, under SBX_URL, as the service key's owner), and records every call
as "USER (mcp: CLIENT)". Nothing but MCP messages goes to stdout."""

from __future__ import annotations

import contextlib

from sandboxer import AsyncSandboxer


def run(client: AsyncSandboxer, owner: str | None, *, remote: bool) -> None:
    """Serve until the agent closes stdin; `client` is closed at the end."""
    from importlib.metadata import version

    from mcp.server.mcpserver import Context

    from sandboxer_tui.mcp.server import Acting, actor_of, build

    async def resolve(ctx: Context, write: bool) -> Acting:
        if remote or owner is None:  # a service's client: its key's owner is the actor
            return Acting(client, None)
        return Acting(client.acting_as(actor_of(owner, ctx)), owner)

    server = build(resolve, version=version("sandboxer"))

    try:
        server.run("stdio")
    finally:
        import asyncio

        with contextlib.suppress(Exception):
            asyncio.run(client.close())
