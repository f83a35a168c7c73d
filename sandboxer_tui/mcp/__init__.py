"""The MCP front end (docs/mcp.md): sandboxes as tools and resources for an agent, on the
official `mcp` SDK's `MCPServer`. `sbx mcp` serves it over stdio (stdio.py); `sbx serve`
mounts it at `/mcp` over streamable HTTP (sandboxer_tui/service/mcp.py). Like every front
end it calls the public library only; `mcp` loads only when one of those runs."""
