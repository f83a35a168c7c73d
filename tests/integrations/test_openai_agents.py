"""The OpenAI Agents SDK's sandbox client and session over sandboxer sandboxes
(docs/integrations.md, "OpenAI Agents SDK"): the real `openai-agents` package, its
`SandboxSession` called as its tools call it (no model), on the real Docker engine, in
process and through `sbx serve`. Network none, except the exposed-port test, whose profile
publishes a port on the installation's own bridge (removed by id with the containers) and is
reached on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import httpx
import pytest
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    InvalidManifestPathError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession

import sandboxer
from sandboxer.integrations.openai_agents import (
    SandboxerSandboxClient,
    SandboxerSandboxClientOptions,
    SandboxerSandboxSessionState,
)
from tests.integrations.conftest import RUN

pytestmark = pytest.mark.docker


def options(**more) -> SandboxerSandboxClientOptions:
    return SandboxerSandboxClientOptions(**{"ttl": "10m", "labels": RUN, **more})


async def started(client: sandboxer.AsyncSandboxer, **more) -> SandboxSession:
    session = await SandboxerSandboxClient(client).create(options=options(**more))
    await session.start()
    return session


async def test_exec_runs_in_the_workspace_with_its_output_and_exit_code(client):
    session = await started(client)
    try:
        done = await session.exec("echo out; echo err >&2; pwd; exit 3")
        assert (done.stdout, done.stderr, done.exit_code) == (b"out\n/workspace\n", b"err\n", 3)
        argv = await session.exec("printf", "%s|", "a b", "c", shell=False)
        assert argv.stdout == b"a b|c|"
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 30", timeout=1)
        assert (await session.exec("echo still")).stdout == b"still\n"
    finally:
        await session.aclose()


async def test_files_written_read_back_byte_for_byte_and_a_missing_one_is_not_found(client):
    session = await started(client)
    try:
        blob = bytes(range(256)) * 4096
        await session.write(Path("deep/er/blob.bin"), io.BytesIO(blob))
        assert (await session.read(Path("deep/er/blob.bin"))).read() == blob
        assert (await session.read(Path("/workspace/deep/er/blob.bin"))).read() == blob
        # the sandbox holds it where the SDK said
        assert await session._inner.sandbox.files.read("/workspace/deep/er/blob.bin") == blob

        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("missing.txt"))
        # a write onto a folder is refused, and the folder keeps what it holds
        with pytest.raises(WorkspaceArchiveWriteError):
            await session.write(Path("deep"), io.BytesIO(b"would replace the folder"))
        assert (await session.read(Path("deep/er/blob.bin"))).read() == blob
        # the SDK's own tools on top: ls, mkdir, rm
        names = sorted(e.path for e in await session.ls("deep/er"))
        assert names == ["/workspace/deep/er/blob.bin"]
        await session.rm(Path("deep/er/blob.bin"))
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("deep/er/blob.bin"))
    finally:
        await session.aclose()


async def test_a_path_out_of_the_workspace_is_refused_through_a_symlink_too(local_client):
    session = await started(local_client)
    try:
        await session.exec("ln -s /etc /workspace/out")
        with pytest.raises(InvalidManifestPathError):
            await session.read(Path("out/hostname"))
        with pytest.raises(InvalidManifestPathError):
            await session.write(Path("out/evil"), io.BytesIO(b"x"))
        with pytest.raises(InvalidManifestPathError):
            await session.read(Path("../etc/hostname"))
        assert (await session.exec("test -e /etc/evil")).exit_code == 1
    finally:
        await session.aclose()


async def test_a_terminal_session_typed_into_gives_its_output_and_exit_code(client):
    session = await started(client)
    try:
        assert session.supports_pty()
        first = await session.pty_exec_start("sh", tty=True, yield_time_s=1)
        assert first.process_id is not None and first.exit_code is None
        seen = b""
        update = await session.pty_write_stdin(session_id=first.process_id,
                                               chars="echo typed-$((6 * 7))\n", yield_time_s=1)
        seen += update.output
        give_up = time.monotonic() + 30
        while b"typed-42" not in seen and time.monotonic() < give_up:
            update = await session.pty_write_stdin(session_id=first.process_id, chars="",
                                                   yield_time_s=1)
            seen += update.output
        assert b"typed-42" in seen
        assert update.process_id == first.process_id and update.exit_code is None

        end = await session.pty_write_stdin(session_id=first.process_id, chars="exit 7\n",
                                            yield_time_s=10)
        give_up = time.monotonic() + 30
        while end.exit_code is None and time.monotonic() < give_up:
            end = await session.pty_write_stdin(session_id=first.process_id, chars="",
                                                yield_time_s=1)
        assert (end.process_id, end.exit_code) == (None, 7)
    finally:
        await session.aclose()


async def test_a_command_without_a_terminal_streams_its_output_and_takes_no_keys(client):
    session = await started(client)
    try:
        done = await session.pty_exec_start("echo a; sleep 0.3; echo b >&2; exit 4",
                                            yield_time_s=20)
        assert (done.process_id, done.exit_code) == (None, 4)
        assert done.output.replace(b"\r", b"") in (b"a\nb\n", b"b\na\n")

        running = await session.pty_exec_start("sleep 30", yield_time_s=0.25)
        assert running.process_id is not None and running.exit_code is None
        with pytest.raises(RuntimeError, match="stdin is not available"):
            await session.pty_write_stdin(session_id=running.process_id, chars="x")
        count = "ps -o args | grep -c '^sleep 30' || true"
        assert (await session.exec(count)).stdout.strip() == b"1"
        await session.pty_terminate_all()  # ends it: nothing is left running
        assert (await session.exec(count)).stdout.strip() == b"0"
    finally:
        await session.aclose()


async def test_resolve_exposed_port_is_the_loopback_url_of_a_published_port(local_client):
    web = {"name": "web", "extends": "default", "network": {"mode": "full"}, "ports": [8080]}
    session = await started(local_client, profile=web, exposed_ports=(8080,))
    try:
        endpoint = await session.resolve_exposed_port(8080)
        assert (endpoint.host, endpoint.tls) == ("127.0.0.1", False)
        url = endpoint.url_for("http")
        assert url == await session._inner.sandbox.url(8080) + "/"

        # a server in the sandbox answers there
        await session.write(Path("www/index.html"), io.BytesIO(b"served from the sandbox\n"))
        await session.exec("httpd -p 8080 -h /workspace/www")
        give_up = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            while True:
                try:
                    reply = await http.get(url + "index.html")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < give_up
                    await asyncio.sleep(0.1)
        assert (reply.status_code, reply.text) == (200, "served from the sandbox\n")

        # a port not in the options, and one the profile does not publish, are the SDK's error
        with pytest.raises(ExposedPortUnavailableError):
            await session.resolve_exposed_port(9090)
    finally:
        await session.aclose()

    plain = await started(local_client, exposed_ports=(8080,))
    try:
        with pytest.raises(ExposedPortUnavailableError) as caught:
            await plain.resolve_exposed_port(8080)
        assert "publishes no port 8080" in str(caught.value.context.get("detail"))
    finally:
        await plain.aclose()


async def test_the_session_destroys_what_it_made_and_never_what_it_attached_to(client):
    made = await started(client)
    box_id = made.state.sandbox_id
    await made.aclose()
    assert (await client.get(box_id)).state == sandboxer.State.DESTROYED

    mine = await client.create("default", ttl="10m", labels=RUN)
    attached = await started(client, sandbox=mine.id)
    assert attached.state.sandbox_id == mine.id and attached.state.owned is False
    await attached.exec("echo hi > /workspace/hi.txt")
    await attached.aclose()
    assert (await mine.refresh()).state == sandboxer.State.RUNNING
    assert await mine.files.read("/workspace/hi.txt") == b"hi\n"


async def test_a_persisted_state_resumes_on_the_same_sandbox_while_it_runs(local_client):
    client = SandboxerSandboxClient(local_client)
    session = await client.create(options=options())
    await session.start()
    await session.write(Path("kept.txt"), io.BytesIO(b"kept\n"))
    payload = client.serialize_session_state(session.state)

    state = client.deserialize_session_state(payload)
    assert isinstance(state, SandboxerSandboxSessionState)
    again = await client.resume(state)
    await again.start()
    assert again.state.sandbox_id == session.state.sandbox_id
    assert (await again.read(Path("kept.txt"))).read() == b"kept\n"
    await again.aclose()  # the same sandbox, owned: now destroyed
    assert (await local_client.get(session.state.sandbox_id)).state == \
        sandboxer.State.DESTROYED

    # gone: resume makes another from the same profile
    other = await client.resume(client.deserialize_session_state(payload))
    await other.start()
    try:
        assert other.state.sandbox_id != session.state.sandbox_id
        assert (await other.exec("true")).exit_code == 0
    finally:
        await other.aclose()


async def test_the_workspace_persists_as_a_tar_and_hydrates_another_sandbox(local_client):
    one = await started(local_client)
    two = await started(local_client)
    try:
        await one.write(Path("a/b.txt"), io.BytesIO(b"carried\n"))
        archive = await one.persist_workspace()
        await two.hydrate_workspace(archive)
        assert (await two.read(Path("a/b.txt"))).read() == b"carried\n"
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_manifest_root_elsewhere_is_made_at_start(local_client):
    client = SandboxerSandboxClient(local_client)
    session = await client.create(manifest=Manifest(root="/srv/agent"), options=options())
    async with session:
        assert (await session.exec("pwd")).stdout == b"/srv/agent\n"
        await session.write(Path("x.txt"), io.BytesIO(b"x"))
        assert await session._inner.sandbox.files.read("/srv/agent/x.txt") == b"x"


async def test_a_sandbox_agent_run_uses_a_session_of_this_client(client):
    """The SDK's own Runner with a SandboxAgent and a scripted model in place of a real one
    (no model is called): the run makes a sandbox through this client, its exec_command tool
    runs there, and the sandbox is destroyed when the run ends."""
    from agents import Runner
    from agents.run_config import RunConfig, SandboxRunConfig
    from agents.sandbox import SandboxAgent
    from agents.testing import ScriptedModel, assistant_message, function_call

    model = ScriptedModel([
        [function_call("exec_command", {"cmd": "echo from-the-agent > made.txt; cat made.txt"},
                       call_id="c1")],
        [assistant_message("done")],
    ])
    agent = SandboxAgent(name="coder", instructions="Work in the sandbox.", model=model)
    config = RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(
        client=SandboxerSandboxClient(client), options=options(task="agent-run")))
    result = await Runner.run(agent, "Make a file.", run_config=config)

    assert result.final_output == "done"
    [tool_output] = [item.output for item in result.new_items if hasattr(item, "output")]
    assert "Process exited with code 0" in tool_output and "from-the-agent" in tool_output
    [made] = [box for box in await client.list(labels=RUN, include_destroyed=True)
              if box.task == "agent-run"]
    assert made.state == sandboxer.State.DESTROYED


async def test_an_interactive_commands_timeout_ends_it_and_run_as_runs_as_that_user(
        local_client):
    session = await started(local_client)
    try:
        for tty in (False, True):
            began = time.monotonic()
            ended = await session.pty_exec_start("sleep 60", tty=tty, timeout=1, yield_time_s=20)
            assert (ended.process_id, ended.exit_code) == (None, 137), tty
            assert time.monotonic() - began < 15

        as_nobody = await session.pty_exec_start("id -u", user="nobody", yield_time_s=20)
        assert (as_nobody.output, as_nobody.exit_code) == (b"65534\n", 0)
        with pytest.raises(ExecTransportError, match="cannot run as nobody"):
            await session.pty_exec_start("id -u", user="nobody", tty=True)
    finally:
        await session.aclose()
