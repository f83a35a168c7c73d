"""`sbx mcp`: the MCP server over stdio (sandboxer_tui/mcp, docs/mcp.md); `mcp` loads only
here."""

from __future__ import annotations

import click

from sandboxer_tui.cli.output import command


@click.command("mcp")
@command
def mcp_command() -> None:
    """Serve MCP over stdio, for an agent that starts sbx (docs/mcp.md)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        from sandboxer.core.rules.errors import Unavailable

        raise Unavailable("sbx mcp needs the MCP SDK: pip install 'sandboxer[mcp]'") from None
    from sandboxer.core.rules import settings
    from sandboxer_tui.cli.clients import async_client, service_url
    from sandboxer_tui.mcp.stdio import run

    remote = bool(service_url())
    run(async_client(), None if remote else settings.actor(), remote=remote)
