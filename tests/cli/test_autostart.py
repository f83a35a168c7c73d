"""`sbx server` on first use is opt-in: by default a command runs where it was typed and starts
nothing behind it. With SBX_SERVER_AUTOSTART=1 a command no server took starts one, which takes
the commands that follow and leaves after an idle while; SBX_NO_SERVER=1 still opts out, and a
client of an sbx service (SBX_URL) starts none and keeps nothing in its state folder. Every
server a test starts is stopped by pid at its end."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from support import RUN_LABEL, SBX, Launcher

pytestmark = pytest.mark.docker

ON = {"SBX_SERVER_AUTOSTART": "1", "SBX_SERVER_IDLE": "10m"}
# What a server started for a folder leaves in it (sandboxer_tui/resident/resident.py).
SERVER_FILES = {"server.sock", "server.pid", "server.log", "server.lock"}


def wait_for(predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("waited in vain")


def servers_of(home: Path) -> set[int]:
    """Pids of every `sbx server` process of `home`, serving or on its way out."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if b"sandboxer_tui.resident.resident" in argv and f"SBX_HOME={home}".encode() in env:
            found.add(int(proc.name))
    return found


@pytest.fixture
def autostarting(sbx):
    launcher = Launcher(sbx.home, sbx.cwd)
    pids = []
    yield launcher, pids
    status = launcher.status()
    pids += [status["pid"]] if status.get("running") else []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def test_by_default_a_command_starts_no_server(sbx):
    """What a user gets with no setting: each command runs in its own process, and nothing
    stays behind (no process, no socket, no log)."""
    assert sbx("ls").code == 0  # the folder exists: the first command of a user who has one
    made = sbx.create()
    assert sbx("destroy", "--yes", made["id"]).code == 0
    assert SERVER_FILES & {path.name for path in sbx.home.iterdir()} == set()
    assert servers_of(sbx.home) == set()
    assert Launcher(sbx.home, sbx.cwd).status() == {"running": False}


def test_the_first_command_starts_a_server_that_takes_the_next(autostarting, sbx):
    launcher, pids = autostarting
    sbx("ls")  # the folder exists: the first command of a user who has one
    assert not launcher.status()["running"]
    first = launcher("ls", "--json", env=ON)
    assert first.code == 0, first.err
    assert first.json() == []  # it ran, here, as ever
    status = wait_for(lambda: (s := launcher.status())["running"] and s)
    pids.append(status["pid"])
    made = launcher("create", "--label", RUN_LABEL, "--json", env=ON)
    assert made.code == 0, made.err
    after = launcher.status()
    assert after["pid"] == status["pid"] and after["served"] == status["served"] + 1
    assert sbx("show", made.json()["id"], "--json").json()["state"] == "running"


def test_two_first_commands_at_once_start_one_server(autostarting, sbx):
    import subprocess

    launcher, pids = autostarting
    sbx("ls")
    procs = [subprocess.Popen([*launcher.argv, "ls"], cwd=sbx.cwd, env=launcher.env(ON),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(4)]
    assert all(p.wait(60) == 0 for p in procs)
    status = wait_for(lambda: (s := launcher.status())["running"] and s)
    pids.append(status["pid"])
    # the others find the folder's lock taken and leave
    wait_for(lambda: servers_of(sbx.home) == {status["pid"]})
    log = (sbx.home / "server.log").read_text()
    assert log.count("serving ") == 1, log
    assert launcher.status()["pid"] == status["pid"]


@pytest.mark.parametrize("opt_out", [{"SBX_SERVER_AUTOSTART": "0"}, {"SBX_NO_SERVER": "1"}])
def test_opting_out_starts_no_server(autostarting, sbx, opt_out):
    launcher, _ = autostarting
    sbx("ls")
    assert launcher("ls", env={**ON, **opt_out}).code == 0
    # a server is started before the command runs: none was
    assert not (sbx.home / "server.log").exists()
    assert servers_of(sbx.home) == set()


def test_a_server_started_on_first_use_leaves_when_idle(autostarting, sbx):
    launcher, pids = autostarting
    sbx("ls")
    assert launcher("ls", env={**ON, "SBX_SERVER_IDLE": "3s"}).code == 0
    status = wait_for(lambda: (s := launcher.status())["running"] and s)
    pids.append(status["pid"])
    wait_for(lambda: not launcher.status()["running"], timeout=60)


def test_a_client_of_a_service_keeps_nothing_locally_and_starts_no_server(autostarting, sbx,
                                                                          tmp_path):
    """With SBX_URL (or --url) every command acts on the service's inventory: the client's
    own state folder, though it exists and autostart is on, gets no database, no reserve
    file, no installation id and no server."""
    from tests.service.live import start_process, stop_process

    created = sbx("api-keys", "create", "--scope", "write", "--owner", "remote-user")
    assert created.code == 0, created.err
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    client_home = tmp_path / "client-home"
    client_home.mkdir(mode=0o700)
    client = Launcher(client_home, sbx.cwd)
    remote = {**ON, "SBX_URL": url, "SBX_TOKEN": created.out.split()[-1]}
    try:
        made = client("create", "--label", RUN_LABEL, "--ttl", "10m", "--json", env=remote)
        assert made.code == 0, made.err
        assert [box["id"] for box in client("ls", "--json", env=remote).json()] == [
            made.json()["id"]]
        assert client("destroy", "--yes", made.json()["id"], env=remote).code == 0
        without_url = {k: v for k, v in remote.items() if k != "SBX_URL"}
        assert client("--url", url, "ls", "--json", env=without_url).code == 0
    finally:
        stop_process(proc)
    assert sorted(path.name for path in client_home.iterdir()) == []
    assert servers_of(client_home) == set()
