"""exec's options through the library on the real Docker engine, in process (and through a
live `sbx serve`: tests/api/test_files_remote.py collects them again): env (its
values never reach the event log, the JSON Lines sink or any file of the state folder), cwd,
user and stdin as bytes, text or a file object (its digest in the event); bad options
refused with the documented exit code before anything runs, changing nothing; `user=` on a
backend without run-as-user refused naming the backend. docs/api.md, "Exec options"."""

from __future__ import annotations

import hashlib
import io
import json
import secrets
from pathlib import Path

import pytest
import pytest_asyncio
from support import remove_test_containers

import sandboxer
from sandboxer import BadInput, Conflict, NotFound
from tests.api.conftest import RUN

pytestmark = pytest.mark.docker


@pytest_asyncio.fixture
async def client(sbx_home: Path):
    """An AsyncSandboxer in this process on the test's SBX_HOME (tests/api/test_files_remote.py
    collects these tests again with a client of a live `sbx serve`)."""
    sbx = sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test")
    yield sbx
    await sbx.close()
    remove_test_containers(sbx_home)


@pytest_asyncio.fixture
async def box(client):
    made = await client.create("default", ttl="10m", labels=RUN, task="exec options")
    yield made
    await made.destroy()


def _execs(events) -> list[dict]:
    return [dict(e.payload) for e in events if e.type == "sandbox.exec"]


async def test_env_cwd_and_stdin_reach_the_command_and_the_event_keeps_names_only(
        client, box, sbx_home):
    value = f"v-{secrets.token_hex(16)}"
    result = await box.exec(["sh", "-c", 'echo "$API_TOKEN"; pwd; cat'],
                            env={"API_TOKEN": value, "MODE": "test"}, cwd="/tmp",
                            stdin=b"from stdin\n")
    assert (result.exit_code, result.stdout) == (0, f"{value}\n/tmp\nfrom stdin\n".encode())

    [event] = _execs(await box.events())
    assert event["env"] == ["API_TOKEN", "MODE"]
    assert event["cwd"] == "/tmp"
    assert event["stdin"] == {"sha256": hashlib.sha256(b"from stdin\n").hexdigest(),
                              "bytes": 11}
    assert "user" not in event  # not given: not recorded

    await client.deliver_events()  # the JSON Lines sink has it too (names only)
    jsonl = sbx_home / "events.jsonl"
    assert b'"API_TOKEN"' in jsonl.read_bytes()
    hits = [p.name for p in sbx_home.rglob("*") if p.is_file()
            and value.encode() in p.read_bytes()]
    assert hits == []  # nowhere in the state folder: database, its journal, the sink


async def test_stdin_as_text_and_as_a_file_object(box, tmp_path):
    text = await box.exec(["cat"], stdin="héllo\n")
    assert text.stdout == "héllo\n".encode()
    data = secrets.token_bytes(300_000)  # more than one pipe buffer
    local = tmp_path / "input.bin"
    local.write_bytes(data)
    with local.open("rb") as f:
        read = await box.exec(["sha256sum", "-"], stdin=f)
    assert read.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    assert _execs(await box.events())[-1]["stdin"] == {
        "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    from_memory = await box.exec(["wc", "-c"], stdin=io.BytesIO(b"12345"))
    assert from_memory.stdout.strip() == b"5"
    # no stdin: the command's input is empty, closed at once (cat does not wait)
    assert (await box.exec(["cat"], timeout=10)).stdout == b""


async def test_exec_stream_takes_the_same_options(box):
    items = [i async for i in box.exec_stream(["sh", "-c", 'echo "$X"; pwd; cat'],
                                              env={"X": "y"}, cwd="/etc", stdin=b"in\n")]
    out = b"".join(i.data for i in items if isinstance(i, sandboxer.OutputChunk))
    assert out == b"y\n/etc\nin\n"
    assert items[-1].exit_code == 0
    [event] = _execs(await box.events())
    assert (event["env"], event["cwd"], event["stdin"]["bytes"]) == (["X"], "/etc", 3)


async def test_user_runs_the_command_as_that_user(box):
    result = await box.exec(["id", "-u"], user="65534")
    assert result.stdout.strip() == b"65534"
    assert _execs(await box.events())[-1]["user"] == "65534"


async def test_bad_options_are_refused_before_anything_runs(box):
    before = await box.events()
    with pytest.raises(BadInput, match="relative") as relative:
        await box.exec(["touch", "/tmp/should-not-exist"], cwd="tmp")
    assert relative.value.exit_code == 2
    with pytest.raises(BadInput, match="env"):
        await box.exec(["touch", "/tmp/should-not-exist"], env={"A=B": "x"})
    with pytest.raises(BadInput, match="stdin"):
        await box.exec(["touch", "/tmp/should-not-exist"], stdin=12)  # type: ignore[arg-type]
    assert await box.events() == before
    assert (await box.exec(["ls", "/tmp/should-not-exist"])).exit_code != 0


async def test_a_missing_cwd_is_not_found(box):
    with pytest.raises(NotFound, match="/no/such/folder") as missing:
        await box.exec(["touch", "made"], cwd="/no/such/folder")
    assert missing.value.exit_code == 3


async def test_user_on_a_backend_without_run_as_user_is_refused_naming_it(client, stub_profile):
    box = await client.create(stub_profile, labels=RUN)
    before = await box.events()
    with pytest.raises(Conflict, match="stub backend") as refused:
        await box.exec(["id", "-u"], user="1000")
    assert refused.value.exit_code == 4
    assert await box.events() == before  # nothing ran, nothing recorded
    await box.destroy()


def test_the_sync_api_takes_the_options(sbx_home):
    with sandboxer.Sandboxer(home=sbx_home, actor="api-test") as sbx:
        try:
            with sbx.create("default", ttl="10m", labels=RUN) as box:
                result = box.exec(["sh", "-c", 'echo "$K"; cat'], env={"K": "v"}, stdin="x")
                assert result.stdout == b"v\nx"
                event = [e for e in box.events() if e.type == "sandbox.exec"][-1]
                assert json.loads(json.dumps(dict(event.payload)))["env"] == ["K"]
        finally:
            remove_test_containers(sbx_home)
