"""`sbx shell ID` in a real terminal (tmux), in process and as a client of a real `sbx serve`
(SBX_URL): a keystroke typed in tmux reaches the shell in the container and its answer shows
on the pane, the pane's new size reaches the shell (`stty size`), `exit 3` ends `sbx shell`
with exit code 3, and the terminal is left as it was (cooked mode). A backend without
terminals: exit 4, one line, nothing opened. The tmux server has a socket of its own and is
the only one killed."""

from __future__ import annotations

import os
import pty
import select
import shlex
import signal
import subprocess
import time

import pytest
from support import RUN_LABEL, SBX, events_of, write_profile

from tests.service.test_serve_cli import served  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.docker, pytest.mark.tmux]


def shell_in_tmux(tmux, env: dict[str, str], cwd, tmp_path, sandbox_id: str) -> str:
    """`sbx shell ID` in tmux at 100x30; then its exit code and the terminal's settings."""
    stty_after = tmp_path / "stty-after.txt"
    script = tmp_path / "shell.sh"
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()
                        if k.isidentifier())
    script.write_text(f"""{exports}
cd {shlex.quote(str(cwd))}
{shlex.join([*SBX, "shell", sandbox_id])}
echo "sbx-shell-exit=$?"
stty -a > {shlex.quote(str(stty_after))}
sleep 60
""")
    tmux("new-session", "-d", "-x", "100", "-y", "30", "-s", "main", f"sh {script}")
    tmux.wait(lambda s: "#" in s, 60, "the shell's prompt")
    tmux.keys("echo $((6*7))", "Enter")
    tmux.wait(lambda s: any(line.strip() == "42" for line in s.splitlines()), 30, "42")
    tmux.keys("stty size", "Enter")
    tmux.wait(lambda s: "30 100" in s, 30, "the first size")
    tmux("resize-window", "-t", "main", "-x", "120", "-y", "40")
    # SIGWINCH reaches sbx shell on its own time: keys typed at once may go before it
    for attempt in range(10):
        tmux.keys("stty size", "Enter")
        try:
            tmux.wait(lambda s: "40 120" in s, 3, "the new size")
            break
        except AssertionError:
            if attempt == 9:
                raise
    tmux.keys("exit 3", "Enter")
    tmux.wait(lambda s: "sbx-shell-exit=" in s, 30, "sbx shell to end")
    screen = tmux.screen()
    assert "sbx-shell-exit=3" in screen and "Traceback" not in screen, screen
    settings = stty_after.read_text().split()
    for flag in ("icanon", "echo", "isig", "icrnl", "opost"):
        assert flag in settings and f"-{flag}" not in settings, flag
    tmux.kill()
    return screen


def test_sbx_shell_in_tmux_in_process(sbx, tmux, tmp_path):
    box = sbx.create("--ttl", "10m")
    shell_in_tmux(tmux, sbx.env(), sbx.cwd, tmp_path, box["id"])
    events = [e for e in events_of(sbx, box["id"]) if e["type"].startswith("sandbox.pty")]
    assert [e["type"] for e in events] == ["sandbox.pty.opened", "sandbox.pty.closed"]
    assert (events[1]["payload"]["exit_code"], events[1]["payload"]["cols"],
            events[1]["payload"]["rows"]) == (3, 120, 40)


def test_sbx_shell_in_tmux_through_sbx_serve(sbx, served, tmux, tmp_path):  # noqa: F811
    url, token, env, client_home = served
    made = sbx("create", "--ttl", "10m", "--label", RUN_LABEL, "--json",
               env={"SBX_URL": url, "SBX_TOKEN": token})
    assert made.code == 0, made.err
    box = made.json()
    shell_in_tmux(tmux, env, sbx.cwd, tmp_path, box["id"])
    events = [e for e in events_of(sbx, box["id"]) if e["type"].startswith("sandbox.pty")]
    assert [(e["type"], e["actor"]) for e in events] == [
        ("sandbox.pty.opened", "cli-user"), ("sandbox.pty.closed", "cli-user")]
    assert not client_home.exists()  # the client kept nothing: the service holds it


def test_a_backend_without_terminals_exits_4_with_one_line(sbx, tmp_path):
    box = sbx.create("--profile-file", str(write_profile(tmp_path, "stubby", "backend: stub\n")))
    result = sbx("shell", box["id"], input="")
    assert result.code == 4, result
    assert result.err.splitlines() == ["sbx: the stub backend cannot open a terminal"]
    assert result.out == ""
    assert not [e for e in events_of(sbx, box["id"]) if e["type"].startswith("sandbox.pty")]


def test_a_hangup_ends_the_program_in_the_sandbox_too(sbx, tmp_path):
    """sbx shell's terminal goes away (SIGHUP): the program in the sandbox is ended with it
    rather than left running with nobody at its terminal; exit 129."""
    box = sbx.create("--ttl", "10m")
    master, slave = pty.openpty()
    proc = subprocess.Popen([*SBX, "shell", box["id"], "--", "sh", "-c",
                             "echo started; sleep 1000"], stdin=slave, stdout=slave,
                            stderr=slave, env=sbx.env(), cwd=sbx.cwd, start_new_session=True)
    os.close(slave)
    try:
        seen, deadline = b"", time.monotonic() + 60
        while b"started" not in seen:
            assert time.monotonic() < deadline, seen
            if select.select([master], [], [], 1)[0]:
                seen += os.read(master, 4096)
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(30) == 128 + signal.SIGHUP
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
    left = sbx("exec", box["id"], "--", "sh", "-c", "ps -o args | grep -c '^sleep 1000'")
    assert left.out.strip() == "0", left
    closed = [e["payload"] for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.pty.closed"]
    assert [c["how"] for c in closed] == ["closed"]
