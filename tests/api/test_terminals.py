"""Terminals (docs/terminals-and-ports.md, "Terminals") on the real Docker engine, in the
busybox image, in process and through a live `sbx serve` (its WebSocket): a real shell typed
into, its output read, resized (`stty size` changes), exited with a code; output read again
after a dropped connection; the bounded replay buffer; the events (never the keystrokes nor
the output); the end of a session with its sandbox; a backend without terminals refused with
exit 4. Every sandbox carries the run label and is removed by id (the client fixture)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import docker
import pytest
from support import ROOT, containers_of, install_id_of

import sandboxer
from tests.api.conftest import RUN, debian_box

pytestmark = pytest.mark.docker


async def read_until(term, needle: bytes, within: float = 30.0) -> bytes:
    """The terminal's output until `needle` shows (the test fails after `within`)."""
    seen = b""
    deadline = time.monotonic() + within
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {needle!r} within {within}s; the terminal showed "
                                 f"{seen[-500:]!r}")
        chunk = await asyncio.wait_for(term.read(), left)
        if not chunk:
            raise AssertionError(f"the program ended before {needle!r}; it showed "
                                 f"{seen[-500:]!r}")
        seen += chunk
    return seen


async def test_a_shell_is_typed_into_read_resized_and_exits_with_its_code(client):
    box = await client.create("default", ttl="10m", labels=RUN)
    term = await box.pty(cols=100, rows=30)  # a login shell: busybox has no bash
    assert term.id.startswith("pty-") and term.running
    await term.write("echo $TERM; stty size; echo sum=$((6*7))\r")
    shown = await read_until(term, b"sum=42")
    assert b"xterm-256color" in shown and b"30 100" in shown

    await term.resize(132, 50)
    await term.write("stty size\r")
    await read_until(term, b"50 132")

    await term.write("exit 3\r")
    assert await asyncio.wait_for(term.wait(), 30) == 3
    assert term.exit_code == 3 and not term.running
    assert await term.read() == b""

    events = [e for e in await box.events() if e.type.startswith("sandbox.pty")]
    assert [e.type for e in events] == ["sandbox.pty.opened", "sandbox.pty.closed"]
    opened, closed = (e.payload for e in events)
    assert (opened["id"], opened["cols"], opened["rows"]) == (term.id, 100, 30)
    assert opened["argv"][0] == "sh"  # the login shell's own argv
    assert (closed["exit_code"], closed["how"], closed["cols"], closed["rows"]) == \
        (3, "exited", 132, 50)
    assert closed["duration_s"] > 0
    # never keystrokes nor output
    assert all("sum=" not in str(e.payload) and "stty" not in str(e.payload) for e in events)


async def test_the_default_is_bash_where_the_sandbox_has_it(client, docker_api, tmp_path):
    box = await debian_box(client, docker_api, tmp_path)
    term = await box.pty()
    await term.write('echo "shell=${BASH_VERSION:+bash}"; shopt -q login_shell && echo login\r')
    await read_until(term, b"shell=bash\r\nlogin")
    await term.write("exit 2\r")
    assert await asyncio.wait_for(term.wait(), 30) == 2


async def test_a_command_with_env_and_cwd_and_close_ends_it(client):
    box = await client.create("default", ttl="10m", labels=RUN)
    async with await box.pty(["sh"], env={"GREETING": "hi there", "TERM": "vt100"},
                             cwd="/tmp") as term:
        await term.write('echo "$GREETING from $(pwd) on $TERM"\r')
        await read_until(term, b"hi there from /tmp on vt100")
    # leaving the block closed it: the program was ended, the session says so
    again = await box.terminal(term.id)
    deadline = time.monotonic() + 30
    while again.running and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        again = await box.terminal(term.id)
    assert not again.running
    closed = [e.payload for e in await box.events() if e.type == "sandbox.pty.closed"]
    assert [c["how"] for c in closed] == ["closed"]
    opened = [e.payload for e in await box.events() if e.type == "sandbox.pty.opened"]
    assert opened[0]["env"] == ["GREETING", "TERM"] and "hi there" not in str(opened)
    with pytest.raises(sandboxer.Conflict) as ended:
        await again.write("echo late\r")
    assert "has ended" in str(ended.value)


async def test_after_a_dropped_connection_attach_reads_what_was_missed(client, service):
    box = await client.create("default", ttl="10m", labels=RUN)
    term = await box.pty(["sh"])
    await term.write("echo first-$((1+1)); sleep 1; echo missed-$((2+3))\r")
    await read_until(term, b"first-2")
    reached = term.offset
    if service is not None:  # the connection drops (as a network would end it)
        client._transport._pty_sockets()[term.id].ws.transport.abort()
    # the program writes on while nobody is connected; the session keeps it
    deadline = time.monotonic() + 30
    while (await box.terminal(term.id)).to_dict()["offset"] <= reached + len("missed-5"):
        assert time.monotonic() < deadline, "the session's output did not grow"
        await asyncio.sleep(0.1)
    await term.attach()  # from where this handle had read to
    assert term.offset == reached
    rest = await read_until(term, b"missed-5")
    assert b"first-2" not in rest  # nothing given twice
    # another client, from an older offset, reads it all again
    other = await box.terminal(term.id, offset=0)
    assert b"first-2" in await read_until(other, b"missed-5")
    await term.write("exit 7\r")
    assert await asyncio.wait_for(term.wait(), 30) == 7


async def test_the_replay_buffer_keeps_the_last_bytes_only(client, service, monkeypatch):
    monkeypatch.setenv("SBX_TERMINAL_REPLAY", "4KiB")  # read where the session opens
    box = await client.create("default", ttl="10m", labels=RUN)
    term = await box.pty(["sh", "-c", "i=0; while [ $i -lt 400 ]; do "
                                      "echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; "
                                      "i=$((i+1)); done; echo the-end; read x"])
    await read_until(term, b"the-end")  # all written: the program now waits for input
    view = (await box.terminal(term.id)).to_dict()
    assert view["offset"] > 16_000 and 0 < view["kept_from"]
    assert view["offset"] - view["kept_from"] <= 4096
    late = await box.terminal(term.id, offset=0)  # asks for the start: it is gone
    first = await late.read()
    assert late.offset - len(first) == view["kept_from"]  # on from the oldest kept byte
    assert b"the-end" in first + (b"" if b"the-end" in first
                                  else await read_until(late, b"the-end"))
    await term.close()


async def test_a_session_ends_with_its_sandbox(client):
    box = await client.create("default", ttl="10m", labels=RUN)
    term = await box.pty(["sh"])
    await term.write("echo up\r")
    await read_until(term, b"up")
    await box.destroy()
    assert await asyncio.wait_for(term.wait(), 30) in (None, 137)
    closed = [e.payload for e in await box.events() if e.type == "sandbox.pty.closed"]
    assert [c["how"] for c in closed] == ["sandbox-ended"]


async def test_bad_input_is_refused_and_opens_nothing(client):
    box = await client.create("default", ttl="10m", labels=RUN)
    for kwargs, words in (({"cols": 0}, "bad cols 0"), ({"rows": 5000}, "bad rows 5000"),
                          ({"argv": []}, "argv must be a non-empty list"),
                          ({"cwd": "relative"}, "bad cwd"),
                          ({"env": {"1X": "v"}}, "bad environment variable name")):
        with pytest.raises(sandboxer.BadInput) as refused:
            await box.pty(**kwargs)
        assert words in str(refused.value), (kwargs, str(refused.value))
    with pytest.raises(sandboxer.NotFound):
        await box.terminal("pty-0000000000000000")
    assert [e for e in await box.events() if e.type.startswith("sandbox.pty")] == []


async def test_a_backend_without_terminals_refuses_with_exit_4(stub_profile, sbx_home):
    async with sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test") as sbx:
        box = await sbx.create(stub_profile)
        with pytest.raises(sandboxer.Conflict) as refused:
            await box.pty()
        assert refused.value.exit_code == 4
        assert str(refused.value) == "the stub backend cannot open a terminal"
        assert [e for e in await box.events() if e.type.startswith("sandbox.pty")] == []


def test_the_sync_twin(sync_client):
    box = sync_client.create("default", ttl="10m", labels=RUN)
    with box.pty(["sh", "-c", "echo sync-$((40+2)); exit 5"]) as term:
        out = b"".join(term)
        assert b"sync-42" in out and term.exit_code == 5


def test_the_documented_example_runs(sbx, tmp_path):
    """docs/terminals-and-ports.md's Python example ("Terminals"), as written, on the test's
    SBX_HOME: it prints the shell's exit code, and leaves nothing running."""
    section = (ROOT / "docs" / "terminals-and-ports.md").read_text().split("## Terminals\n")[1]
    [example] = re.findall(r"```python\n(.*?)```", section.split("\n## ")[0], re.S)
    done = subprocess.run([sys.executable, "-c", example], env=sbx.env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3\n"
    api = docker.APIClient(version="auto")
    assert [c for c in containers_of(api, install_id_of(sbx.home))
            if c["State"] == "running"] == []
    api.close()


async def test_typing_is_activity_for_the_idle_limit(client, monkeypatch):
    from sandboxer.core.lifecycle import terminals

    monkeypatch.setattr(terminals, "ACTIVITY_EVERY_S", 0.0)  # every key marks it (10 s apart)
    box = await client.create("default", ttl="10m", labels=RUN)
    term = await box.pty(["cat"])
    await box.refresh()
    opened_at = box.last_activity_at
    deadline = time.monotonic() + 30
    while (await box.refresh()).last_activity_at <= opened_at:
        assert time.monotonic() < deadline, "typing did not count as activity"
        await term.write("x")
        await read_until(term, b"x")
    await term.close()
