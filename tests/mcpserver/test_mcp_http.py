"""`/mcp` of a real `sbx serve` driven by the MCP SDK's own client over streamable HTTP: the
round trip on the real Docker engine, with the REST routes' keys, scopes and tenants (a read
key cannot change anything, another tenant's sandbox is not found, no key is a 401) and every
call in the event log as "KEY OWNER (mcp: CLIENT)" (docs/mcp.md)."""

from __future__ import annotations

import httpx
import pytest
from support import SBX, events_of, query

from tests.mcpserver.common import create_write_run_read_destroy, http, ok, profiles, refused
from tests.service.live import start_process, stop_process

pytestmark = pytest.mark.docker


@pytest.fixture
def served(sbx, tmp_path):
    """A real `sbx serve` whose profile path holds `box`, and keys: alice's write and read
    keys and bob's write key."""
    env = sbx.env({"SBX_PROFILE_PATH": str(profiles(tmp_path))})
    keys = {}
    for name, scope, owner in (("alice", "write", "alice"), ("alice-read", "read", "alice"),
                               ("bob", "write", "bob")):
        made = sbx("api-keys", "create", "--scope", scope, "--owner", owner, env=env)
        assert made.code == 0, made.err
        keys[name] = made.out.split()[-1]
    proc, url = start_process(SBX, env, cwd=tmp_path)
    yield url, keys
    stop_process(proc)


async def test_http_create_write_run_read_destroy(sbx, served, docker_api):
    url, keys = served
    async with http(url, keys["alice"], name="web-agent") as client:
        made = await create_write_run_read_destroy(client, docker_api)
    events = events_of(sbx, made)
    assert {e["actor"] for e in events} == {"alice (mcp: web-agent)"}
    assert query(sbx.home, "SELECT owner FROM sandboxes WHERE id = ?", made) == [
        {"owner": "alice"}]


async def test_keys_scopes_and_tenants(sbx, served):
    url, keys = served
    # no key (or a wrong one): refused before MCP, as every REST route refuses it
    for token in (None, "sbx_not-a-key"):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answer = httpx.post(f"{url}/mcp", headers=headers, timeout=30, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert answer.status_code == 401 and answer.json()["error"]["kind"] == "unauthorized"
    async with http(url, keys["alice-read"], name="reader") as reader:
        said = await refused(reader, "create_sandbox", profile="box")
        assert "A read key cannot do this: it needs a write key" in said
        assert (await ok(reader, "list_sandboxes"))["sandboxes"] == []
    assert query(sbx.home, "SELECT id FROM sandboxes") == []  # the refusal made nothing
    async with http(url, keys["alice"]) as alice, http(url, keys["bob"]) as bob:
        box = await ok(alice, "create_sandbox", profile="box", ttl="10m")
        try:
            async with http(url, keys["alice-read"], name="reader") as reader:
                mine = await ok(reader, "list_sandboxes")
                assert [b["id"] for b in mine["sandboxes"]] == [box["id"]]
                said = await refused(reader, "exec", sandbox=box["id"], command=["true"])
                assert "needs a write key" in said
            # bob's key: alice's sandbox does not exist for it, in every tool and resource
            assert (await ok(bob, "list_sandboxes"))["sandboxes"] == []
            for tool, more in (("exec", {"command": ["true"]}), ("destroy_sandbox", {}),
                               ("read_file", {"path": "/etc/hostname"})):
                said = await refused(bob, tool, sandbox=box["id"], **more)
                assert f"no sandbox {box['id']!r}" in said, said
            with pytest.raises(Exception, match="no sandbox"):
                await bob.read_resource(f"sandbox://{box['id']}/events")
            ran = await ok(alice, "exec", sandbox=box["id"], command=["true"])
            assert ran["exit_code"] == 0  # still there, untouched
        finally:
            await ok(alice, "destroy_sandbox", sandbox=box["id"])
    kinds = [(e["type"], e["actor"]) for e in events_of(sbx, box["id"])]
    assert all(actor == "alice (mcp: http-agent)" for _, actor in kinds), kinds
