"""`sbx mcp` driven by the MCP SDK's own client over stdio, as a desktop agent starts it: the
round trip on the real Docker engine, bad arguments as one-line tool errors that change
nothing, the operator's limits, output cut with a note and read in full another way, and
every call in the event log as "USER (mcp: CLIENT)" (docs/mcp.md)."""

from __future__ import annotations

import pytest
from support import events_of, install_id_of, query

from tests.mcpserver.common import (
    create_write_run_read_destroy,
    ok,
    profiles,
    refused,
    resource,
    stdio,
)

pytestmark = pytest.mark.docker


def _env(sbx, tmp_path, **extra: str) -> dict[str, str]:
    return sbx.env({"SBX_PROFILE_PATH": str(profiles(tmp_path)), "SBX_ACTOR": "dana",
                    **extra})


async def test_stdio_create_write_run_read_destroy(sbx, tmp_path, docker_api):
    async with stdio(_env(sbx, tmp_path), tmp_path, name="desk-agent") as client:
        made = await create_write_run_read_destroy(client, docker_api)
    events = events_of(sbx, made)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "sandbox.creating" and "sandbox.exec" in kinds
    assert "sandbox.file" in kinds and kinds[-1] == "sandbox.destroyed"
    # every call the agent made is recorded as the local user through that client
    assert {e["actor"] for e in events} == {"dana (mcp: desk-agent)"}
    # a call that records nothing of its own (a listing) is an mcp.call event
    assert [e["payload"] for e in events if e["type"] == "mcp.call"] == [{"tool": "list_files"}]
    assert {e["payload"].get("owner") for e in events if e["type"] == "sandbox.creating"} \
        == {"dana"}


async def test_bad_arguments_are_tool_errors_that_change_nothing(sbx, tmp_path):
    env = _env(sbx, tmp_path, SBX_MCP_PROFILES="box", SBX_MCP_MAX_TTL="20m")
    async with stdio(env, tmp_path) as client:
        said = await refused(client, "create_sandbox", profile="box", ttl="soon")
        assert "bad ttl 'soon'" in said
        said = await refused(client, "create_sandbox", profile="box", ttl="3h")
        assert "longer than this server's limit of 20m" in said
        said = await refused(client, "create_sandbox", profile="other")
        assert "'other' is not one this server lets MCP create from: box" in said
        said = await refused(client, "create_sandbox", profile="box", ttl=5)
        assert "bad arguments: ttl" in said
        said = await refused(client, "exec", sandbox="nothing-here", command=5)
        assert "bad arguments: command" in said
        said = await refused(client, "exec", sandbox="nothing-here", command=["true"])
        assert "no sandbox 'nothing-here'" in said
        said = await refused(client, "write_file", sandbox="nothing-here", path="/x",
                             content="%%", encoding="base64")
        assert "not base64" in said
        assert (await ok(client, "list_sandboxes", include_destroyed=True))["sandboxes"] == []
    # nothing was made, nothing recorded: no sandbox row, no event, no container
    assert query(sbx.home, "SELECT id FROM sandboxes") == []
    assert query(sbx.home, "SELECT id FROM events WHERE sandbox_id IS NOT NULL") == []
    assert install_id_of(sbx.home) is None or not _containers(sbx)


def _containers(sbx) -> list:
    import docker
    from support import containers_of

    api = docker.APIClient(version="auto")
    try:
        return containers_of(api, install_id_of(sbx.home))
    finally:
        api.close()


async def test_output_over_the_limit_is_cut_with_a_note_and_read_in_full(sbx, tmp_path):
    env = _env(sbx, tmp_path, SBX_MCP_MAX_OUTPUT="1KiB")
    big = "seq 1 2000"  # 8893 bytes
    whole = "".join(f"{n}\n" for n in range(1, 2001))
    async with stdio(env, tmp_path) as client:
        box = await ok(client, "create_sandbox", profile="box")
        try:
            ran = await ok(client, "exec", sandbox=box["id"], command=big)
            assert ran["stdout"] == whole[:1024] and ran["stdout_bytes"] == len(whole)
            assert "stdout was 8893 bytes; the first 1024 are shown" in ran["note"]
            assert "read_file" in ran["note"] and "read_process_output" in ran["note"]
            # as the note says: to a file, read in pieces from each reply's next_offset
            await ok(client, "exec", sandbox=box["id"], command=f"{big} > /tmp/seq.txt")
            got, offset = "", 0
            while True:
                piece = await ok(client, "read_file", sandbox=box["id"], path="/tmp/seq.txt",
                                 offset=offset)
                got += piece["text"]
                assert len(piece["text"]) <= 1024
                if "next_offset" not in piece:
                    break
                assert f"offset={piece['next_offset']}" in piece["note"]
                offset = piece["next_offset"]
            assert got == whole
            # or in the background, paging through its output
            proc = await ok(client, "start_process", sandbox=box["id"], command=big)
            got, out_at, err_at = "", 0, 0
            while True:
                page = await ok(client, "read_process_output", sandbox=box["id"],
                                pid=proc["pid"], stdout_offset=out_at, stderr_offset=err_at,
                                wait="30s")
                got += page["stdout"]
                out_at, err_at = page["stdout_next_offset"], page["stderr_next_offset"]
                if "note" not in page:
                    break
            assert got == whole and page["running"] is False and page["exit_code"] == 0
            # a process that runs on: inspected, then killed
            sleeper = await ok(client, "start_process", sandbox=box["id"],
                               command=["sleep", "300"])
            assert (await ok(client, "inspect_process", sandbox=box["id"],
                             pid=sleeper["pid"]))["running"] is True
            await ok(client, "kill_process", sandbox=box["id"], pid=sleeper["pid"])
            ended = await ok(client, "read_process_output", sandbox=box["id"],
                             pid=sleeper["pid"], wait="30s")
            assert ended["running"] is False and ended["exit_code"] == 137
        finally:
            await ok(client, "destroy_sandbox", sandbox=box["id"])


async def test_extend_snapshot_restore_and_the_resources(sbx, tmp_path):
    async with stdio(_env(sbx, tmp_path, SBX_MCP_MAX_TTL="1h"), tmp_path) as client:
        box = await ok(client, "create_sandbox", profile="box", ttl="10m", name="keeper")
        made = []
        try:
            await ok(client, "write_file", sandbox="keeper", path="/data/note.txt",
                     content="kept")
            longer = await ok(client, "extend_sandbox", sandbox="keeper", by="5m")
            assert longer["sandbox"]["deadline"] > box["deadline"]
            assert "longer than this server's limit of 1h" in await refused(
                client, "extend_sandbox", sandbox="keeper", by="2h")
            point = await ok(client, "snapshot_sandbox", sandbox="keeper", name="cp1")
            back = await ok(client, "restore_checkpoint", checkpoint=point["id"], ttl="10m")
            made.append(back["id"])
            read = await ok(client, "read_file", sandbox=back["id"], path="/data/note.txt")
            assert read["text"] == "kept"
            record = await resource(client, f"sandbox://{box['id']}")
            assert record["id"] == box["id"] and record["name"] == "keeper"
            events = await resource(client, f"sandbox://{box['id']}/events")
            assert "sandbox.extended" in [e["type"] for e in events]
            evidence = await resource(client, f"sandbox://{box['id']}/evidence")
            assert evidence
        finally:
            for ref in [box["id"], *made]:
                await ok(client, "destroy_sandbox", sandbox=ref)
