"""`sbx server` starts on first use: a command no server took runs where it was typed and
starts one behind it, which takes the commands that follow and leaves after an idle while.
SBX_SERVER_AUTOSTART=0 (and SBX_NO_SERVER=1) opt out. Every server a test starts is stopped
by pid at its end."""

from __future__ import annotations

import os
import signal
import time

import pytest
from support import Launcher

pytestmark = pytest.mark.docker


def served(launcher: Launcher) -> dict:
    return launcher.status()


def wait_for(predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("waited in vain")


@pytest.fixture
def autostarting(sbx, launcher_argv):
    launcher = Launcher(sbx.home, sbx.cwd, launcher_argv)
    on = {"SBX_SERVER_AUTOSTART": "1", "SBX_SERVER_IDLE": "10m"}
    pids = []
    yield launcher, on, pids
    status = launcher.status()
    pids += [status["pid"]] if status.get("running") else []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def test_the_first_command_starts_a_server_that_takes_the_next(autostarting, sbx):
    launcher, on, pids = autostarting
    sbx("ls")  # the folder exists: the first command of a user who has one
    assert not launcher.status()["running"]
    first = launcher("ls", "--json", env=on)
    assert first.code == 0, first.err
    assert first.json() == []  # it ran, here, as ever
    status = wait_for(lambda: (s := launcher.status())["running"] and s)
    pids.append(status["pid"])
    made = launcher("create", "--label", "sbx-autostart=1", "--json", env=on)
    assert made.code == 0, made.err
    after = launcher.status()
    assert after["pid"] == status["pid"] and after["served"] == status["served"] + 1
    assert sbx("show", made.json()["id"], "--json").json()["state"] == "running"


def test_two_first_commands_at_once_start_one_server(autostarting, sbx):
    import subprocess

    launcher, on, pids = autostarting
    sbx("ls")
    procs = [subprocess.Popen([*launcher.argv, "ls"], cwd=sbx.cwd, env=launcher.env(on),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(4)]
    assert all(p.wait(60) == 0 for p in procs)
    status = wait_for(lambda: (s := launcher.status())["running"] and s)
    pids.append(status["pid"])
    time.sleep(2)  # the others found the folder's lock taken and left
    log = (sbx.home / "server.log").read_text()
    assert log.count("serving ") == 1, log
    assert launcher.status()["pid"] == status["pid"]


@pytest.mark.parametrize("opt_out", [{"SBX_SERVER_AUTOSTART": "0"}, {"SBX_NO_SERVER": "1"}])
def test_opting_out_starts_no_server(autostarting, sbx, opt_out):
    launcher, on, _ = autostarting
    sbx("ls")
    assert launcher("ls", env={**on, **opt_out}).code == 0
    time.sleep(2)
    assert not launcher.status()["running"]
    assert not (sbx.home / "server.log").exists()


def test_a_server_started_on_first_use_leaves_when_idle(autostarting, sbx):
    launcher, on, pids = autostarting
    sbx("ls")
    assert launcher("ls", env={**on, "SBX_SERVER_IDLE": "3s"}).code == 0
    status = wait_for(lambda: (s := launcher.status())["running"] and s)
    pids.append(status["pid"])
    wait_for(lambda: not launcher.status()["running"], timeout=60)
