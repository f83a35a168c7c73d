"""The dashboard in a real terminal: bare `sbx` in tmux at 120x32, keys sent with
`send-keys`, the screen read with `capture-pane`. A sandbox made by another process shows up
within 2 s; `t` extends it; `e` hands the terminal to a shell in it and back; `d` then `y`
destroys it; `q` quits cleanly and leaves the terminal sane. The tmux server has a socket of
its own and is the only one killed."""

from __future__ import annotations

import shlex
from datetime import timedelta

import pytest
from support import dashboard_script, row_line

from sandboxer.core.rules.clock import from_iso

pytestmark = [pytest.mark.docker, pytest.mark.tmux]


def test_dashboard_in_tmux(sbx, docker_api, tmux, tmp_path):
    env = {k: v for k, v in sbx.env().items() if not k.startswith(("E2B_", "MODAL_"))}
    stty_after = tmp_path / "stty-after.txt"
    script = dashboard_script(tmp_path, env, sbx.cwd,
                              then=f"stty -a > {shlex.quote(str(stty_after))}\necho DONE\n")
    tmux("new-session", "-d", "-x", "120", "-y", "32", "-s", "main", f"sh {script}")
    tmux("set", "-g", "escape-time", "0")
    tmux.wait(lambda s: "0 sandboxes" in s and "docker ● up" in s, 60, "dashboard")

    box = sbx.create("--name", "tmux-box", "--ttl", "10m")  # carries the run label
    # the row shows it as it is now (it may first have appeared as creating); on a busy
    # machine the test waits for that with a generous limit, and prints how long it took
    took = tmux.wait(lambda s: "running" in (row_line(s, "tmux-box") or ""), 30, "new row")
    print(f"the row showed {took:.2f}s after `sbx create` returned")
    line = row_line(tmux.screen(), "tmux-box")
    assert "running" in line and box["id"][4:14] in line

    tmux.keys("t")
    tmux.wait(lambda s: " 39m" in (row_line(s, "tmux-box") or ""), 30, "the extended TTL")
    shown = sbx("show", box["id"], "--json").json()
    assert from_iso(shown["deadline"]) - from_iso(box["deadline"]) == timedelta(minutes=30)

    tmux.keys("e")  # the app steps aside for a shell in the container
    tmux.wait(lambda s: f"a shell in {box['id']}" in s and "#" in s, 30, "the shell")
    tmux.keys("echo in-the-box-$((6*7))", "Enter")
    tmux.wait(lambda s: "in-the-box-42" in s, 30, "the shell's output")
    tmux.keys("exit", "Enter")
    tmux.wait(lambda s: row_line(s, "tmux-box") is not None, 30, "the dashboard again")

    tmux.keys("d")
    tmux.wait(lambda s: f"sbx destroy {box['id']}" in s and "Cancel" in s, 30,
              "the confirmation, with its Cancel button")
    tmux.keys("y")
    tmux.wait(lambda s: row_line(s, "tmux-box") is None, 30, "the row to go")
    assert sbx("show", box["id"], "--json").json()["state"] == "destroyed"
    assert docker_api.containers(all=True, filters={"id": box["backend_ref"]}) == []

    tmux.keys("q")
    tmux.wait(lambda s: "DONE" in s, 30, "the app to quit")
    screen = tmux.screen()
    assert "exit=0" in screen and "Traceback" not in screen
    modes = tmux("display", "-p", "-t", "main",
                 "#{alternate_on} #{mouse_any_flag} #{mouse_button_flag} #{mouse_sgr_flag} "
                 "#{cursor_flag}").split()
    assert modes == ["0", "0", "0", "0", "1"], modes  # main screen, no mouse, cursor shown
    settings = stty_after.read_text().split()
    for flag in ("icanon", "echo", "isig", "icrnl", "opost"):
        assert flag in settings and f"-{flag}" not in settings, flag
