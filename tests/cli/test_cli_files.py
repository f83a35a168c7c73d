"""Working inside a sandbox from the command line (docs/cli.md, "sbx cp", "sbx files",
"sbx exec", "sbx ps"): the real `sbx` in subprocesses against the real Docker engine. An
agent's round trip (code in, run with env and cwd, the artefact out), trees and tar streams
both ways, exec's -e/-w/-i and the hint for stdin piped without -i, background processes,
and bad input: one line, its exit code, nothing changed."""

from __future__ import annotations

import io
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from support import SBX, table_rows

pytestmark = pytest.mark.docker


def raw(sbx, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """`sbx` with bytes in and out (a tar stream)."""
    return subprocess.run([*SBX, *args], cwd=sbx.cwd, env=sbx.env(), input=stdin,
                          capture_output=True, timeout=120)


def file_events(home: Path) -> list[dict]:
    return [e for e in table_rows(home, "events") if e["type"] == "sandbox.file"]


def test_an_agents_round_trip_code_in_run_with_env_and_cwd_artefact_out(sbx, tmp_path):
    box = sbx.create()["id"]
    project = tmp_path / "project"
    (project / "lib").mkdir(parents=True)
    (project / "run.sh").write_text('echo "$GREETING from $(pwd)" > result.txt\n')
    (project / "lib" / "data.txt").write_text("data\n")

    put = sbx("cp", str(project), f"{box}:/work/app")  # /work/app is made: it is the tree
    assert put.code == 0, put.err
    ran = sbx("exec", "-e", "GREETING=hello", "-w", "/work/app", box, "--", "sh", "run.sh")
    assert ran.code == 0, ran.err
    out = tmp_path / "out"
    out.mkdir()
    got = sbx("cp", f"{box}:/work/app/result.txt", str(out))  # into an existing folder
    assert got.code == 0, got.err
    assert (out / "result.txt").read_text() == "hello from /work/app\n"

    # the whole tree back, and the files commands over it
    back = tmp_path / "back"
    assert sbx("cp", f"{box}:/work/app", str(back)).code == 0
    assert (back / "lib" / "data.txt").read_text() == "data\n"
    assert (back / "result.txt").read_text() == "hello from /work/app\n"
    listed = sbx("files", "ls", box, "/work/app", "--json")
    assert listed.code == 0, listed.err
    assert {f["name"] for f in listed.json()} == {"run.sh", "lib", "result.txt"}
    table = sbx("files", "ls", box, "/work/app").out.splitlines()
    assert table[0].split() == ["MODE", "SIZE", "MTIME", "PATH"] and len(table) == 4
    assert sbx("files", "cat", box, "/work/app/lib/data.txt").out == "data\n"
    assert sbx("files", "stat", box, "/work/app/lib", "--json").json()["type"] == "dir"
    assert sbx("files", "mkdir", box, "/work/a/b").code == 0
    assert sbx("files", "mv", box, "/work/app/result.txt", "/work/a/b/r.txt").code == 0
    assert sbx("files", "cat", box, "/work/a/b/r.txt").out == "hello from /work/app\n"
    assert sbx("files", "rm", "-r", box, "/work/a").code == 0
    gone = sbx("files", "stat", box, "/work/a")
    assert gone.code == 3 and gone.err.startswith("sbx: ") and gone.err.count("\n") == 1


def test_cp_dash_is_a_tar_stream_on_stdin_and_stdout(sbx):
    box = sbx.create()["id"]
    made = io.BytesIO()
    with tarfile.open(fileobj=made, mode="w") as tar:
        info = tarfile.TarInfo("pkg/mod.py")
        body = b"VALUE = 42\n"
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    put = raw(sbx, "cp", "-", f"{box}:/srv", stdin=made.getvalue())
    assert put.returncode == 0, put.stderr
    assert sbx("files", "cat", box, "/srv/pkg/mod.py").out == "VALUE = 42\n"
    got = raw(sbx, "cp", f"{box}:/srv/pkg", "-")
    assert got.returncode == 0, got.stderr
    with tarfile.open(fileobj=io.BytesIO(got.stdout), mode="r|") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert members == {"pkg/mod.py": b"VALUE = 42\n"}


def test_exec_forwards_stdin_with_i_and_hints_without_it(sbx):
    box = sbx.create()["id"]
    piped = sbx("exec", "-i", box, "--", "sh", "-c", "tr a-z A-Z", input="shout\n")
    assert piped.code == 0, piped.err
    assert piped.out == "SHOUT\n" and piped.err == ""
    hinted = sbx("exec", box, "--", "cat", input="data\n")
    assert hinted.code == 0 and hinted.out == ""
    assert hinted.err.count("\n") == 1 and "-i" in hinted.err and hinted.err.startswith("sbx:")
    quiet = sbx("exec", box, "--", "true", input="")
    assert quiet.code == 0 and quiet.err == ""  # nothing piped: nothing to say
    # -u runs as that user; -e K alone passes this shell's value of K
    who = sbx("exec", "-u", "nobody", "-e", "FROM_HERE", box, "--", "sh", "-c",
              'echo "$(id -un) $FROM_HERE"', env={"FROM_HERE": "passed"})
    assert (who.code, who.out) == (0, "nobody passed\n"), who.err


def test_background_processes_ps_attach_and_kill(sbx):
    box = sbx.create()["id"]
    started = sbx("exec", "--detach", "-e", "N=3", box, "--", "sh", "-c",
                  'for i in $(seq "$N"); do echo "tick $i"; done; exit 7')
    assert started.code == 0, started.err
    pid = started.out.strip()
    assert pid.isdigit()
    attached = sbx("attach", box, pid)
    assert attached.code == 7, attached.err
    assert attached.out == "tick 1\ntick 2\ntick 3\n"
    listed = sbx("ps", box, "--json")
    assert [(p["pid"], p["running"], p["exit_code"]) for p in listed.json()] == [
        (int(pid), False, 7)]

    sleeper = sbx("exec", "-d", box, "--", "sleep", "300").out.strip()
    shown = sbx("ps", box)
    assert shown.code == 0 and f"{sleeper}" in shown.out and "running" in shown.out
    killed = sbx("kill", "-s", "TERM", box, sleeper)
    assert killed.code == 0, killed.err
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        views = {p["pid"]: p for p in sbx("ps", box, "--json").json()}
        if not views[int(sleeper)]["running"]:
            break
        time.sleep(0.2)
    assert views[int(sleeper)]["running"] is False


def test_bad_input_is_one_line_its_exit_code_and_changes_nothing(sbx, sbx_home, tmp_path):
    box = sbx.create()["id"]
    assert sbx("cp", str(Path(__file__)), f"{box}:/kept.py").code == 0
    before = table_rows(sbx_home, "events")
    (tmp_path / "local.txt").write_text("x")
    for args, code in (
            (("cp", "local.txt", "other.txt"), 2),              # no side in a sandbox
            (("cp", f"{box}:/a", f"{box}:/b"), 2),               # both sides
            (("cp", "local.txt", f"{box}:relative/path"), 2),    # not absolute
            (("cp", "local.txt", "sbx-nothere:/x"), 3),
            (("cp", "missing.txt", f"{box}:/x"), 2),
            (("cp", f"{box}:/missing", "."), 3),
            (("files", "cat", box, "/missing"), 3),
            (("files", "rm", box, "/missing"), 3),
            (("exec", "-e", "1BAD=x", box, "--", "true"), 2),
            (("exec", "--detach", "-i", box, "--", "cat"), 2),
            (("kill", "-s", "NOPE", box, "1"), 2),
            (("attach", box, "424242"), 3)):
        result = sbx(*args)
        assert result.code == code, (args, result.code, result.err)
        assert result.err.startswith("sbx: ") and result.err.count("\n") == 1, (args,
                                                                               result.err)
        assert "Traceback" not in result.err and str(sbx_home) not in result.err
    assert not (tmp_path / "other.txt").exists() and not (tmp_path / "missing").exists()
    assert table_rows(sbx_home, "events") == before
    assert sbx("files", "cat", box, "/kept.py").out == Path(__file__).read_text()


def test_the_same_round_trip_through_a_service(sbx, tmp_path):
    """`SBX_URL`: the CLI as a client of a real `sbx serve`, files and exec options carried
    over HTTP (a tree up as tar, the artefact down, a background process)."""
    from tests.service.live import start_process, stop_process

    token = sbx("api-keys", "create", "--scope", "write", "--owner", "agent").out.split()[-1]
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    remote = {"SBX_URL": url, "SBX_TOKEN": token}
    try:
        box = sbx.create(env=remote)["id"]
        project = tmp_path / "project"
        project.mkdir()
        (project / "main.sh").write_text('printf "%s" "$SECRET" | wc -c > "$PWD/len.txt"\n')
        assert sbx("cp", str(project), f"{box}:/srv/app", env=remote).code == 0
        ran = sbx("exec", "-e", "SECRET=abcdef", "-w", "/srv/app", box, "--", "sh", "main.sh",
                  env=remote)
        assert ran.code == 0, ran.err
        assert sbx("cp", f"{box}:/srv/app/len.txt", str(tmp_path), env=remote).code == 0
        assert (tmp_path / "len.txt").read_text().strip() == "6"
        piped = sbx("exec", "-i", box, "--", "wc", "-c", input="12345", env=remote)
        assert piped.out.strip() == "5", piped.err
        pid = sbx("exec", "-d", box, "--", "sh", "-c", "echo bg; exit 4", env=remote).out
        attached = sbx("attach", box, pid.strip(), env=remote)
        assert (attached.code, attached.out) == (4, "bg\n"), attached.err
    finally:
        stop_process(proc)


def test_exec_timeout_keeps_what_was_printed_and_ends_the_whole_tree(sbx):
    """The issue's case: `--timeout 2s -- sh -c 'echo before; sleep 30'` printed nothing
    useful after 5 s and left `sleep` running; now `before`, exit 124 soon after 2 s, and
    no process of that exec left in the sandbox."""
    box = sbx.create()["id"]
    started = time.monotonic()
    ran = sbx("exec", "--timeout", "2s", box, "--", "sh", "-c", "echo before; sleep 30")
    took = time.monotonic() - started
    assert ran.code == 124 and ran.out == "before\n", ran
    assert "timed out after 2s" in ran.err
    assert took < 2 + 0.5 + 2.0, took  # the deadline, its 0.5 s, and sbx's own start
    left = sbx("exec", box, "--", "sh", "-c", "ps -o args | grep -c '[s]leep 30' || true")
    assert left.out.strip() == "0", left.out
