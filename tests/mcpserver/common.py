"""What the MCP tests share: a Docker profile on busybox with no network, the SDK's client
over stdio (`sbx mcp` as a subprocess) or streamable HTTP (a real `sbx serve`), and reading a
tool's reply."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, Implementation

BOX = "backend: docker\nimage: sandboxer/base:busybox\nnetwork: {mode: none}\n" \
      "ttl: {default: 10m, max: 1h}\n"


def profiles(tmp_path: Path) -> Path:
    """A profile folder holding `box` (and `other`, the same, for the allow-list)."""
    folder = tmp_path / "mcp-profiles"
    folder.mkdir(exist_ok=True)
    (folder / "box.yaml").write_text(BOX)
    (folder / "other.yaml").write_text(BOX)
    return folder


@contextlib.asynccontextmanager
async def stdio(env: dict[str, str], cwd: Path, name: str = "test-agent"
                ) -> AsyncIterator[Client]:
    """The SDK's client of `sbx mcp`, started as a desktop agent starts it."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandboxer_tui", "mcp"],
                                   env=env, cwd=str(cwd))
    async with Client(params, client_info=Implementation(name=name, version="1.0")) as client:
        yield client


@contextlib.asynccontextmanager
async def http(url: str, token: str | None, name: str = "http-agent") -> AsyncIterator[Client]:
    """The SDK's client of `/mcp` of a `sbx serve`, with `token` as its Bearer key."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=120) as session:
        transport = streamable_http_client(f"{url}/mcp", http_client=session)
        async with Client(transport, client_info=Implementation(name=name, version="1.0")
                          ) as client:
            yield client


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured reply of a call that must succeed."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, text(result))
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """The one-line message of a call that must be a tool error (never a traceback)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, text(result))
    message = text(result)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def text(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def resource(client: Client, uri: str) -> Any:
    answer = await client.read_resource(uri)
    return json.loads(answer.contents[0].text)


SCRIPT = "#!/bin/sh\necho \"hello from $1\" > /tmp/out.txt\ncat /tmp/out.txt\n"


async def create_write_run_read_destroy(client: Client, docker_api: Any) -> str:
    """The round trip every transport must do: list tools, create on Docker, write a script,
    run it, read what it wrote, destroy. Returns the sandbox's id (destroyed)."""
    names = {tool.name for tool in (await client.list_tools()).tools}
    assert {"create_sandbox", "list_sandboxes", "exec", "write_file", "read_file", "list_files",
            "start_process", "inspect_process", "read_process_output", "kill_process",
            "extend_sandbox", "snapshot_sandbox", "restore_checkpoint",
            "destroy_sandbox"} <= names
    exec_tool = next(t for t in (await client.list_tools()).tools if t.name == "exec")
    assert exec_tool.input_schema["properties"]["command"]["description"]  # an LLM can fill it
    box = await ok(client, "create_sandbox", profile="box", ttl="10m", task="mcp round trip")
    assert box["state"] == "running" and box["profile"] == "box"
    container = docker_api.inspect_container(box["backend_ref"])
    assert container["HostConfig"]["NetworkMode"] == "none"
    wrote = await ok(client, "write_file", sandbox=box["id"], path="/work/run.sh",
                     content=SCRIPT, mode=0o755)
    assert wrote["bytes"] == len(SCRIPT)
    ran = await ok(client, "exec", sandbox=box["id"], command=["/work/run.sh", "mcp"])
    assert ran["exit_code"] == 0 and ran["stdout"] == "hello from mcp\n", ran
    line = await ok(client, "exec", sandbox=box["id"], command="echo $X | tr a-z A-Z >&2",
                    env={"X": "quiet"})
    assert line["stderr"] == "QUIET\n"
    read = await ok(client, "read_file", sandbox=box["id"], path="/tmp/out.txt")
    assert read["text"] == "hello from mcp\n" and "next_offset" not in read
    listed = await ok(client, "list_files", sandbox=box["id"], path="/work")
    assert [e["name"] for e in listed["entries"]] == ["run.sh"]
    gone = await ok(client, "destroy_sandbox", sandbox=box["id"])
    assert gone["destroyed"] and not gone["already_destroyed"]
    assert not docker_api.containers(all=True, filters={"id": box["backend_ref"]})
    return box["id"]
