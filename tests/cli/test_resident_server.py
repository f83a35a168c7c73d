"""`sbx server`: commands handed to a resident process behave exactly as one-shot commands.

Every test runs `sbx` as pip's script runs it (sandboxer_tui/resident/launcher.py) against a
real server started with `sbx server start` in the test's own SBX_HOME, and on the real Docker
engine where a sandbox is involved.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support import (
    RUN_LABEL,
    SBX,
    Launcher,
    SbxRunner,
    one_json,
    write_profile,
)

from tests.reliability.test_reliability import wait_until

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
CONDITION_LIMIT = 60  # s: how long a step may take on a busy machine before the test fails


@pytest.fixture
def via(sbx: SbxRunner) -> Launcher:
    launcher = Launcher(sbx.home, sbx.cwd)
    started = launcher("server", "start", "--json")
    assert started.code == 0, started.err
    pid = started.json()["pid"]
    yield launcher
    launcher("server", "stop")
    try:  # never leave our server behind, whatever the test did
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_commands_run_in_the_server_with_the_same_results(via: Launcher, sbx: SbxRunner) -> None:
    before = via.status()["served"]
    made = via("create", "--label", RUN_LABEL, "--name", "through-server", "--json")
    assert made.code == 0, made.err
    sandbox = one_json(made.out)
    ran = via("exec", sandbox["id"], "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (ran.code, ran.out, ran.err) == (3, "out\n", "err\n")
    missing = via("show", "sbx-nosuchthing")
    assert missing.code == 3 and missing.err.strip() == "sbx: no sandbox 'sbx-nosuchthing'"
    bad = via("create", "--ttl", "-5m")
    assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1
    # the server ran them (one child each), and the one-shot CLI sees the same inventory
    assert via.status()["served"] == before + 4
    served = via("ls", "--json").json()
    direct = sbx("ls", "--json", env={"SBX_NO_SERVER": "1"}).json()
    for a, b in zip(served, direct, strict=True):  # read a moment apart: the countdown moved
        assert abs(a.pop("ttl_left_s") - b.pop("ttl_left_s")) <= 2
    assert served == direct
    gone = via("destroy", "--yes", sandbox["id"])
    assert gone.code == 0, gone.err
    assert sbx("show", sandbox["id"], "--json").json()["state"] == "destroyed"


def test_the_callers_environment_and_folder_are_the_commands(via: Launcher, tmp_path: Path) -> None:
    """The server forks with the caller's env and cwd, not its own: a profile found only in
    the caller's ./.sbx/profiles and an SBX_ACTOR set for one call both take effect."""
    folder = tmp_path / "project"
    (folder / ".sbx" / "profiles").mkdir(parents=True)
    write_profile(folder / ".sbx" / "profiles", "local-only", "backend: docker\n")
    here = Launcher(via.home, folder, via.argv)
    assert here("profiles", "trust").code == 0  # a working folder's profiles need trust
    listed = here("profiles", "list", "--json")
    assert listed.code == 0, listed.err
    assert "local-only" in {p["name"] for p in listed.json()}
    assert "local-only" not in {p["name"] for p in via("profiles", "list", "--json").json()}
    made = here("create", "--profile", "local-only", "--label", RUN_LABEL, "--json",
                env={"SBX_ACTOR": "alice@ci"})
    assert made.code == 0, made.err
    assert made.json()["owner"] == "alice@ci"


def test_concurrent_commands_each_get_their_own_child(via: Launcher) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(
            lambda i: via("create", "--label", RUN_LABEL, "--name", f"par-{i}", "--json"), range(4)))
    assert all(r.code == 0 for r in results), [r.err for r in results]
    assert len({r.json()["id"] for r in results}) == 4
    assert {r.json()["state"] for r in results} == {"running"}


def test_ctrl_c_reaches_the_command_and_the_server_lives_on(via: Launcher) -> None:
    """Each step waits for what it expects, with limits a loaded machine keeps within (a fixed
    10 s for the interrupted command to end failed under load 7 on 2 cores)."""
    # as at a terminal, Ctrl-C is not ignored, even where the suite runs as a background job
    # (which ignores SIGINT for its children, and the launcher keeps an ignored SIGINT so)
    follower = subprocess.Popen([*via.argv, "events", "--follow"], cwd=via.cwd, env=via.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: via.status()["commands_running"] == 1, CONDITION_LIMIT,
                   "the server to run the command")
        follower.send_signal(signal.SIGINT)
        code = follower.wait(timeout=CONDITION_LIMIT)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert code in (1, 130), follower.stderr.read()
    wait_until(lambda: via.status()["commands_running"] == 0, CONDITION_LIMIT,
               "the server to see the command end")
    assert via("ls").code == 0


def test_a_server_whose_code_changed_steps_aside(via: Launcher) -> None:
    """After an upgrade (a module's file changes), the old server runs nothing more: the
    command runs fresh in the caller and the server exits."""
    import sandboxer.core.rules.durations as module

    path = Path(module.__file__)
    stat = path.stat()
    try:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        result = via("profiles", "list", "--json")
        assert result.code == 0, result.err
        assert "default" in {p["name"] for p in result.json()}
        deadline = time.monotonic() + CONDITION_LIMIT
        while via.status().get("running") is not False and time.monotonic() < deadline:
            time.sleep(0.1)
        assert via.status() == {"running": False}
    finally:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_without_a_server_or_with_a_dead_one_commands_run_here(sbx: SbxRunner) -> None:
    launcher = Launcher(sbx.home, sbx.cwd)
    assert launcher("ls", "--json").json() == []
    sbx.home.mkdir(parents=True, exist_ok=True)
    (sbx.home / "server.sock").touch()  # a server killed with -9 leaves its socket behind
    result = launcher("profiles", "list", "--json")
    assert result.code == 0, result.err
    assert launcher("server", "status", "--json").json() == {"running": False}


def test_socket_is_private_and_nothing_of_the_environment_is_written(
        via: Launcher, tmp_path: Path) -> None:
    secret = "whsec-resident-" + os.urandom(8).hex()
    socket_mode = (via.home / "server.sock").stat().st_mode & 0o777
    assert socket_mode & 0o077 == 0, oct(socket_mode)
    assert (via.home.stat().st_mode & 0o777) == 0o700
    result = via("ls", env={"SBX_WEBHOOK_SECRET": secret})
    assert result.code == 0, result.err
    for path in via.home.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_a_long_home_path_still_reaches_the_server(sbx: SbxRunner, tmp_path: Path) -> None:
    """AF_UNIX paths are limited to 107 bytes; a deep SBX_HOME must not lose the server."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "sbx-home"
    launcher = Launcher(deep, sbx.cwd)
    started = launcher("server", "start", "--json")
    assert started.code == 0, started.err
    try:
        assert len(str(deep / "server.sock")) > 108
        assert launcher("ls", "--json").json() == []
        assert launcher.status()["served"] == 1
    finally:
        launcher("server", "stop")


def test_server_commands_are_idempotent_and_say_so(sbx: SbxRunner) -> None:
    launcher = Launcher(sbx.home, sbx.cwd)
    first = launcher("server", "start", "--json")
    try:
        again = launcher("server", "start", "--json")
        assert first.json()["started"] is True and again.json()["started"] is False
        assert first.json()["pid"] == again.json()["pid"]
    finally:
        stopped = launcher("server", "stop", "--json")
    assert stopped.json() == {"stopped": True, "pid": first.json()["pid"]}
    assert launcher("server", "stop", "--json").json() == {"stopped": False, "pid": None}
    assert not (sbx.home / "server.sock").exists()
    bad = launcher("server", "start", "--idle", "abc")
    assert bad.code == 2 and "--idle" in bad.err
    assert not (sbx.home / "server.sock").exists()


def test_idle_server_exits_by_itself(sbx: SbxRunner) -> None:
    launcher = Launcher(sbx.home, sbx.cwd)
    started = launcher("server", "start", "--idle", "1s", "--json")
    assert started.code == 0, started.err
    deadline = time.monotonic() + 15
    while (sbx.home / "server.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launcher.status() == {"running": False}
    assert "stopped after 0 commands" in (sbx.home / "server.log").read_text()


def test_json_status_is_one_document(via: Launcher) -> None:
    doc = json.loads(via("server", "status", "--json").out)
    assert doc["running"] is True and doc["python"] == sys.executable


# Where the folder comes from. The launcher writes platformdirs' rule out where all its
# releases agree, and asks it otherwise (blank, padded or relative XDG_DATA_HOME).
FOLDER_CASES = [
    {"SBX_HOME": "~/elsewhere/sbx"},
    {"XDG_DATA_HOME": "/srv/data"},
    {"XDG_DATA_HOME": "/srv/data/"},
    {"XDG_DATA_HOME": "  "},
    {"XDG_DATA_HOME": " /srv/data"},
    {"XDG_DATA_HOME": "srv/data"},
    {"HOME": "/home/"},
    {},
]


def folder_env(case: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A test's FOLDER_CASES entry made concrete: HOME is tmp_path, /srv and /home under it."""
    env = {"HOME": str(tmp_path)}
    env.update({name: value.replace("/srv", str(tmp_path / "srv"))
                .replace("/home", str(tmp_path / "home")) for name, value in case.items()})
    return env


@pytest.mark.parametrize("case", FOLDER_CASES)
def test_the_launcher_finds_the_folder_the_core_uses(case: dict[str, str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher spares itself platformdirs' import by writing its rule out; were the
    two to disagree, `sbx` would look for its server in the wrong folder."""
    from sandboxer.core.rules.settings import sbx_home
    from sandboxer_tui.resident import launcher

    for name in ("SBX_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in folder_env(case, tmp_path).items():
        monkeypatch.setenv(name, value)
    assert launcher.home() == str(sbx_home())


def test_text_that_is_not_utf8_reaches_the_command_unchanged(via: Launcher,
                                                             sbx: SbxRunner) -> None:
    """An argument that is not UTF-8 (a file name in Latin-1, say) is refused as the one-shot
    CLI refuses it; a variable that is not UTF-8 is passed on. Both go through the server."""
    before = via.status()["served"]
    through = subprocess.run([*via.argv, "show", b"sbx-caf\xe9"], cwd=via.cwd, env=via.env(),
                             capture_output=True)
    here = subprocess.run([*SBX, "show", b"sbx-caf\xe9"], cwd=sbx.cwd,
                          env=sbx.env({"SBX_NO_SERVER": "1"}), capture_output=True)
    assert (through.returncode, through.stdout, through.stderr) == (
        here.returncode, here.stdout, here.stderr) == (
        2, b"", b"sbx: argument 'sbx-caf\\udce9' is not UTF-8 text\n")
    env = {name.encode(): value.encode() for name, value in via.env().items()}
    env[b"LATIN1_NAME"] = b"caf\xe9"
    listed = subprocess.run([*via.argv, "ls", "--json"], cwd=via.cwd, env=env,
                            capture_output=True)
    assert (listed.returncode, listed.stdout.strip()) == (0, b"[]"), listed.stderr
    assert via.status()["served"] == before + 2


class FakeServer:
    """A socket where `sbx server` would listen, which records each request and answers
    `pid` (its own) then `exit 7`, or `answer`: what a launcher says, not what a server does
    with it."""

    def __init__(self, folder: Path, answer: bytes | None = None) -> None:
        import socket

        folder.mkdir(parents=True, exist_ok=True)
        self.answer = answer or f"pid {os.getpid()}\nexit 7\n".encode()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(folder / "server.sock"))
        self.listener.listen(4)
        self.listener.settimeout(30)

    def take(self) -> dict:
        import marshal

        from sandboxer_tui.resident.resident import _read_frame

        conn, _ = self.listener.accept()
        with conn:
            body, fds = _read_frame(conn)
            for fd in fds:
                os.close(fd)
            conn.sendall(self.answer)
        return marshal.loads(body)  # closed at once, as when a quick command has ended


@pytest.mark.parametrize("case", [
    {},
    {"LANG": "C"},  # Python coerces the C locale: LC_CTYPE=C.UTF-8 in what it sends
    {"LANG": None, "LC_ALL": None, "LC_CTYPE": None},
    {"LC_ALL": "C.UTF-8", "LC_CTYPE": "C"},
    {"SBX_NOTE": "café ☕", "EMPTY": ""},
])
def test_the_launcher_sends_the_callers_argv_environment_folder_and_umask(
        case: dict[str, str | None], tmp_path: Path) -> None:
    """What the server runs the command with is the caller's own, as the caller had it; and
    the launcher exits with the code it is told."""
    home = tmp_path / "home"
    server = FakeServer(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env["SBX_HOME"] = str(home)
    for name, value in case.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    with ThreadPoolExecutor(1) as pool:
        taken = pool.submit(server.take)
        code = subprocess.run([*SBX, "ls", "--name", "café", "--json"], cwd=tmp_path,
                              env=env, umask=0o027, timeout=30).returncode
        request = taken.result(timeout=30)
    assert code == 7
    assert request["argv"] == ["ls", "--name", "café", "--json"]
    assert (request["umask"], request["cwd"]) == (0o027, str(tmp_path))
    assert os.path.realpath(request["executable"]) == os.path.realpath(sys.executable)
    assert {name: request["env"].get(name) for name, value in case.items()
            if value is not None} == {name: value for name, value in case.items()
                                      if value is not None}


def test_a_command_that_ended_before_its_launcher_looked_is_not_run_again(
        tmp_path: Path) -> None:
    """The server may answer `pid` and `exit` and close before the launcher has finished
    sending; the launcher must not take that for a missing server and run the command
    itself too (a second `create`). A local run would print and exit 0, not 7."""
    home = tmp_path / "home"
    server = FakeServer(home)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SBX_")},
           "SBX_HOME": str(home)}
    with ThreadPoolExecutor(1) as pool:
        for _ in range(20):
            taken = pool.submit(server.take)
            run = subprocess.run([*SBX, "ls"], cwd=tmp_path, env=env, text=True,
                                 capture_output=True, timeout=30)
            taken.result(timeout=30)
            assert (run.returncode, run.stdout) == (7, ""), run.stderr


def test_sbx_serve_runs_where_it_is_started_not_in_the_server(via: Launcher) -> None:
    """`sbx serve` is a long-running service of its own: with a server running for its
    SBX_HOME it still runs in the process that started it, never as the server's child."""
    from tests.service.live import start_process, stop_process

    before = via.status()
    proc, _url = start_process(via.argv, via.env(), cwd=via.cwd)
    try:
        during = via.status()  # `sbx server status` itself is never handed to the server
        assert during["running"], (via.home / "server.log").read_text()
        assert (during["served"], during["commands_running"]) == (before["served"], 0)
    finally:
        stop_process(proc)


def test_sbx_no_server_runs_the_command_here(via: Launcher) -> None:
    before = via.status()["served"]
    result = via("ls", "--json", env={"SBX_NO_SERVER": "1"})
    assert (result.code, result.json()) == (0, [])
    assert via.status()["served"] == before


# -- trust: the folder, the listener, what the server answers -----------------------------

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root "
                                "(the suite runs as root)")


@pytest.mark.parametrize("how", ["group-writable", "others-writable", "another-owner"])
def test_a_launcher_hands_nothing_to_a_server_in_a_folder_others_can_write_to(
        via: Launcher, how: str) -> None:
    """Anyone who can write to the folder can put a socket of theirs where the server's is:
    the launcher does not connect there. It leaves the command to the core, which refuses the
    folder with one line (exit 2); the server running there serves nothing."""
    before = via.status()["served"]
    home = via.home
    if how == "another-owner":
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another user needs root (the suite runs as root)")
        os.chown(home, NOBODY, -1)
        says = f"is owned by uid {NOBODY}, not by you (uid 0)"
    else:
        mode = 0o720 if how == "group-writable" else 0o702
        home.chmod(mode)
        says = f"is writable by group or others (mode {mode:04o}); run chmod go-w {home}"
    try:
        result = via("ls")
    finally:
        os.chown(home, os.geteuid(), -1)
        home.chmod(0o700)
    assert result.code == 2, result.err
    assert result.err.splitlines() == [f"sbx: state folder {home} {says}"]
    assert via.status()["served"] == before


def test_a_state_folder_that_is_a_file_is_refused_in_one_line(
        sbx: SbxRunner, tmp_path: Path) -> None:
    home = tmp_path / "a-file"
    home.write_text("not a folder\n")
    result = Launcher(home, sbx.cwd)("ls")
    assert (result.code, result.out) == (2, ""), result.err
    assert result.err.splitlines() == [f"sbx: state folder {home} is not a folder"]
    assert home.read_text() == "not a folder\n"


# Binds as root in the test's own (root's, 0700) folder, then listens as uid 65534: a listener
# of another user where sbx's server would be. It reports what the first read brought.
LISTEN_AS_NOBODY = f"""
import os, socket, sys
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
os.setgroups([])
os.setresgid({NOBODY}, {NOBODY}, {NOBODY})
os.setresuid({NOBODY}, {NOBODY}, {NOBODY})
listener.listen(4)  # SO_PEERCRED names who called listen()
print("listening", flush=True)
listener.settimeout(60)
conn, _ = listener.accept()
conn.settimeout(60)
data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 8)
print(len(data), len(fds), flush=True)
"""


@needs_root
def test_a_listener_of_another_user_gets_nothing(sbx: SbxRunner) -> None:
    """The launcher sends no argv, environment or fds to a socket whose listener runs as
    another uid (SO_PEERCRED), even in a folder that looks right; the command runs here."""
    sbx.home.mkdir(mode=0o700)
    listener = subprocess.Popen([sys.executable, "-c", LISTEN_AS_NOBODY,
                                 str(sbx.home / "server.sock")], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline() == "listening\n"
        result = Launcher(sbx.home, sbx.cwd)("ls", "--json",
                                                            env={"SBX_NOTE": "for-server-only"})
        out, _ = listener.communicate(timeout=30)
    finally:
        listener.kill()
        listener.wait()
    assert (result.code, result.out.strip(), result.err) == (0, "[]", "")
    assert out.split() == ["0", "0"]  # it connected, saw uid 65534, and sent nothing


@pytest.mark.parametrize(("answer", "says"), [
    (b"pid 0\nexit 7\n", "no process id"),  # kill(0) would signal the launcher's own group
    (b"pid -1\nexit 7\n", "no process id"),  # kill(-1): every process it may signal
    (b"pid +5\nexit 7\n", "no process id"),
    (b"pid 12x\nexit 7\n", "no process id"),
    (b"pid\nexit 7\n", "no process id"),
    (f"pid {os.getpid()}\nexit seven\n".encode(), "no exit code"),
], ids=["pid-0", "pid-minus-1", "pid-plus-5", "pid-12x", "pid-missing", "exit-seven"])
def test_a_reply_that_is_not_a_process_or_a_code_is_refused(
        answer: bytes, says: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = FakeServer(home, answer)
    with ThreadPoolExecutor(1) as pool:
        taken = pool.submit(server.take)
        run = Launcher(home, tmp_path)("ls")
        taken.result(timeout=30)
    assert (run.code, run.out, run.err) == (1, "", f"sbx: the sbx server answered with {says}\n")


def test_a_server_that_never_answers_is_given_up_on(tmp_path: Path) -> None:
    """A listener that takes the connection (the kernel does, for a server that is stuck)
    and answers nothing: the launcher gives up after launcher.ANSWER_WITHIN_S, says so, and
    runs the command itself."""
    import socket

    from sandboxer_tui.resident.launcher import ANSWER_WITHIN_S

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stuck:
        stuck.bind(str(home / "server.sock"))
        stuck.listen(4)  # and never accepts
        run = Launcher(home, tmp_path)("ls", "--json", timeout=60)
    assert (run.code, run.out.strip()) == (0, "[]"), run.err
    assert run.err == (f"sbx: the sbx server did not answer within {ANSWER_WITHIN_S} s; "
                       "running the command here\n")


def test_a_command_given_up_on_is_not_run_again_by_the_server(via: Launcher,
                                                              sbx: SbxRunner) -> None:
    """A server stopped (SIGSTOP) while a `create` waits: the launcher gives up and creates
    the sandbox itself; when the server goes on, it takes the request, finds its caller gone
    and runs nothing. One sandbox, not two."""
    status = via.status()
    os.kill(status["pid"], signal.SIGSTOP)
    try:
        made = via("create", "--label", RUN_LABEL, "--json")
    finally:
        os.kill(status["pid"], signal.SIGCONT)
    assert made.code == 0, made.err
    assert "did not answer" in made.err
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = via.status()
        if now["served"] > status["served"] and now["commands_running"] == 0:
            break
        time.sleep(0.1)
    assert now["served"] == status["served"] + 1  # it took the request...
    assert [box["id"] for box in sbx("ls", "--json").json()] == [made.json()["id"]]  # ...only


def test_a_connection_that_sends_nothing_holds_up_no_command(via: Launcher) -> None:
    import socket

    before = via.status()["served"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.connect(str(via.home / "server.sock"))  # and sends nothing
        result = via("ls", "--json", timeout=60)
        assert (result.code, result.out.strip(), result.err) == (0, "[]", "")
        assert via.status()["served"] == before + 1


def test_bad_requests_are_declined_and_the_server_serves_the_next(via: Launcher) -> None:
    """Garbage, a frame announcing more than the cap, a request of the wrong shape, half a
    frame: each is declined or dropped, and the same server serves the next command."""
    import marshal
    import socket

    from sandboxer_tui.resident.launcher import PROTOCOL
    from sandboxer_tui.resident.resident import MAX_REQUEST_BYTES

    status = via.status()

    def exchange(data: bytes, fds: list[int] | None = None, then_close: bool = False) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect(str(via.home / "server.sock"))
            socket.send_fds(conn, [data], fds) if fds else conn.sendall(data)
            if then_close:
                conn.shutdown(socket.SHUT_WR)
            return conn.recv(4096)  # b"" when it closes without a word

    assert exchange(b"\x00\x00\x00\x08garbage!") == b"declined bad request\n"
    assert exchange(b"\xff\xff\xff\xff") == (  # and the connection kept open
        f"declined request too large (4294967295 bytes; at most {MAX_REQUEST_BYTES})\n".encode())
    request = {"protocol": PROTOCOL, "executable": sys.executable, "argv": ["ls"], "env": {},
               "cwd": "/", "umask": 0o022}
    wrong = marshal.dumps({**request, "argv": "ls"})
    assert exchange(len(wrong).to_bytes(4, "big") + wrong) == b"declined bad request\n"
    early = marshal.dumps(request)
    with open(os.devnull) as null:  # fds come only after `pid`
        assert exchange(len(early).to_bytes(4, "big") + early, [null.fileno()] * 3) == (
            b"declined bad request (fds come after `pid`)\n")
    assert exchange(b"\x00\x00\x01\x00half", then_close=True) == b""
    for argv in (["serve", "--listen", "127.0.0.1:0"], ["--url", "http://x", "tui"]):
        # a command that runs where it was typed is declined even from another launcher
        sent = marshal.dumps({**request, "argv": argv})
        assert exchange(len(sent).to_bytes(4, "big") + sent) == (
            b"declined a command that runs where it was typed\n")
    result = via("ls", "--json")
    assert (result.code, result.out.strip(), result.err) == (0, "[]", "")
    after = via.status()
    assert (after["pid"], after["served"]) == (status["pid"], status["served"] + 1)


@pytest.mark.parametrize("name", ["server.log", "server.pid"])
def test_a_link_planted_at_the_servers_files_is_refused_not_followed(
        sbx: SbxRunner, tmp_path: Path, name: str) -> None:
    sbx.home.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    planted = sbx.home / name
    planted.symlink_to(victim)
    result = Launcher(sbx.home, sbx.cwd)("server", "start")
    assert result.code == 2, result.err
    assert result.err.splitlines() == [
        f"sbx: {planted} is a symbolic link; sbx does not follow links in its state folder "
        "(remove it)"]
    assert not victim.exists() and not (sbx.home / "server.sock").exists()


def test_the_launchers_peer_check_is_the_cores() -> None:
    """The launcher writes out sandboxer.core.rules.peercred's rule (importing it would import
    the library): both read the same uid and pid of a peer."""
    import socket

    from sandboxer.core.rules.peercred import peer_uid_pid as cores
    from sandboxer_tui.resident.launcher import peer_uid_pid as launchers

    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert launchers(left) == cores(left) == (os.getuid(), os.getpid())


def test_only_sbxs_own_url_option_makes_a_command_remote(monkeypatch) -> None:
    from sandboxer_tui.resident.launcher import is_remote

    monkeypatch.delenv("SBX_URL", raising=False)
    assert is_remote(["--url", "http://127.0.0.1:1", "ls"])
    assert is_remote(["--url=http://127.0.0.1:1", "ls"])
    assert not is_remote(["exec", "box", "--", "curl", "--url", "http://127.0.0.1:1"])
