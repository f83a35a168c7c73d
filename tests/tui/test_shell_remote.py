"""The dashboard as a client of a real `sbx serve` (SBX_URL), in tmux: its shell key opens a
terminal in the sandbox through the service (`sbx shell ID`, the service's WebSocket), the
shell answers on the pane, and `exit` brings the dashboard back. The tmux server has a socket
of its own and is the only one killed."""

from __future__ import annotations

import pytest
from support import RUN_LABEL, dashboard_script, events_of, row_line

from tests.service.test_serve_cli import served  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.docker, pytest.mark.tmux]


def test_the_shell_key_through_a_service(sbx, served, tmux, tmp_path):  # noqa: F811
    url, token, env, client_home = served
    made = sbx("create", "--ttl", "10m", "--name", "far-box", "--label", RUN_LABEL, "--json",
               env={"SBX_URL": url, "SBX_TOKEN": token})
    assert made.code == 0, made.err
    box = made.json()
    script = dashboard_script(tmp_path, env, sbx.cwd)
    tmux("new-session", "-d", "-x", "120", "-y", "32", "-s", "main", f"sh {script}")
    tmux("set", "-g", "escape-time", "0")
    tmux.wait(lambda s: "running" in (row_line(s, "far-box") or ""), 60, "the row")

    tmux.keys("e")  # the dashboard steps aside for `sbx shell ID`, through the service
    tmux.wait(lambda s: f"a shell in {box['id']}" in s and "#" in s, 30, "the shell")
    tmux.keys("echo far-$((6*7))", "Enter")
    tmux.wait(lambda s: "far-42" in s.replace("far-$((6*7))", ""), 30, "the shell's output")
    tmux.keys("exit", "Enter")
    tmux.wait(lambda s: row_line(s, "far-box") is not None, 30, "the dashboard again")
    tmux.keys("q")
    tmux.wait(lambda s: "exit=0" in s, 30, "the dashboard to quit")
    assert "Traceback" not in tmux.screen()

    events = [e for e in events_of(sbx, box["id"]) if e["type"].startswith("sandbox.pty")]
    assert [(e["type"], e["actor"]) for e in events] == [
        ("sandbox.pty.opened", "cli-user"), ("sandbox.pty.closed", "cli-user")]
    # nothing ran in process: the client's home (`sbx tui` makes the folder) stays empty
    assert list(client_home.iterdir()) == []
