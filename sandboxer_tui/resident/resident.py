"""`sbx server`: a resident process that runs each `sbx` command in a forked child.

The server imports the heavy modules once, opens nothing (no database, no engine client, no
thread), and forks one child per command: the child takes the caller's stdin/stdout/stderr,
environment, working folder and umask, runs the command exactly as `sbx` would, and exits.
Each command is still its own process with its own database connection, lease owner and
engine client, so every guarantee of a one-shot `sbx` holds; only the imports are shared.

The server answers only its own user (SO_PEERCRED), lives in `$SBX_HOME` (0700, checked as
the core checks it), declines a caller from another Python, and exits when its code changes
on disk, so it never runs stale code. It reads every request without waiting on it (a
connection that sends nothing holds up no one), with a size cap and a time limit, and no
request, however bad, ends it. Forking is safe because the server never starts a thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import json
import marshal
import os
import select
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandboxer.adapters.base import open_state_file, state_folder
from sandboxer_tui.server.launcher import (
    PROTOCOL,
    SOCKET_NAME,
    peer_uid_pid,
    send_request,
    socket_address,
)

PID_FILE = "server.pid"
LOG_FILE = "server.log"
LOCK_FILE = "server.lock"  # held by the one server of a folder
# A request is argv and the environment, which Linux caps at a few MiB together (ARG_MAX):
# a frame announcing more is declined before it is read.
MAX_REQUEST_BYTES = 16 * 1024**2
# A connection that has not sent its whole request by then is closed (a launcher sends it
# at once; the launchers give up waiting for an answer after launcher.ANSWER_WITHIN_S).
READ_REQUEST_WITHIN_S = 10.0
# What a request holds, by type; anything else is declined as a bad request.
REQUEST_FIELDS = {"protocol": int, "executable": str, "argv": list, "env": dict, "cwd": str,
                  "umask": int}
# Imported before serving: what every command needs, and the local backends. Cloud SDKs
# import in the child that needs them (they may start threads, which fork must not copy).
PRELOAD = (
    "sandboxer_tui.cli",
    "sandboxer",
    "sandboxer._local",
    "sandboxer.core.lifecycle.manager",
    "sandboxer.core.lifecycle.checkpoints",
    "sandboxer.core.rules.profiles",
    "sandboxer.core.reconcile.reaper",
    "sandboxer.core.rules.views",
    "sandboxer.core.store.inventory",
    "sandboxer.core.store.events",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "sandboxer.adapters.docker",
    "docker",
    "sandboxer.adapters.stub",
    "sandboxer.adapters.ssh",
    "platformdirs",
    "tomllib",
    "netrc",  # requests imports it on a client's first request
)
# The spare warms up once the server has had no command for this long: a burst of commands
# (a script) is never slowed by it, a command after a pause (an agent thinking) gains.
WARM_AFTER_IDLE_S = 0.05
LOCAL_BACKENDS = ("docker", "stub", "ssh")  # preloaded above; a spare reaches them ahead
_PACKAGES = ("sandboxer", "sandboxer_tui")


def _code_fingerprint() -> dict[str, float]:
    """Modification times of every project module this process has loaded, and of the
    folders on sys.path (installing or removing a package, an adapter say, changes them)."""
    stamps = {}
    for folder in sys.path:
        if folder and os.path.isdir(folder):
            stamps[folder] = os.stat(folder).st_mtime
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and name.split(".")[0] in _PACKAGES:
            with contextlib.suppress(OSError):
                stamps[path] = os.stat(path).st_mtime
    return stamps


def _changed(stamps: dict[str, float]) -> str | None:
    """The first module or folder that changed since the fingerprint, if any."""
    for path, mtime in stamps.items():
        try:
            if os.stat(path).st_mtime != mtime:
                return path
        except OSError:
            return path
    return None


def _warm_up(stop: Callable[[], bool] = lambda: False) -> None:
    """Take once, on throwaway state, the code paths every command takes, so each child
    starts with what Python and the libraries memoise on first use (SQLAlchemy's statement
    and class caches, pydantic) instead of paying it again. `stop` is asked between steps.
    Everything opened here is closed before serving: children inherit no connection."""
    import tempfile

    from sandboxer.core.store.db import Database

    with tempfile.TemporaryDirectory(prefix="sbx-warm-up-") as folder:
        db = Database(f"sqlite:///{folder}/warm.db")
        _warm_up_on(db, stop)
        db.dispose()


def _warm_up_on(db, stop: Callable[[], bool]) -> None:
    """The warm-up's commands, on the stub test double, through `db`."""
    import asyncio
    from datetime import timedelta

    from sandboxer.core.lifecycle.checkpoints import Checkpoints
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import Profile
    from sandboxer.core.rules.views import sandbox_view

    mgr = Manager(db, actor="warm-up", install_id="inst-warm-up",
                  adapters={"stub": _warm_up_adapter()})
    checkpoints = Checkpoints(mgr)

    async def commands() -> None:
        try:
            row = await mgr.create(Profile(name="warm-up", backend="stub"),
                                   labels={"a": "b"})
            steps = [lambda: mgr.resolve(row["id"]), lambda: sandbox_view(row, None),
                     lambda: mgr.list(include_all=True),
                     lambda: mgr.extend(row["id"], timedelta(minutes=1)),
                     lambda: mgr.exec(row["id"], ["true"]),
                     lambda: checkpoints.snapshot(row["id"]),
                     lambda: checkpoints.list(),
                     lambda: mgr.destroy(row["id"])]
            for step in steps:
                if stop():
                    return
                done = step()
                if asyncio.iscoroutine(done):
                    await done
        finally:
            await mgr.close()

    from sandboxer.core.observe import telemetry

    with telemetry.suppressed():  # throwaway state: nothing to trace, and no exporter thread
        asyncio.run(commands())


def _warm_up_adapter():
    """The stub test double, able to snapshot as well, so that the warm-up takes the
    checkpoint paths too (on throwaway state; nothing reaches a real backend)."""
    from sandboxer.adapters import registry
    from sandboxer.adapters.base import Artifact, Capability

    stub = registry.load_class("stub")

    class WarmUpAdapter(stub):  # type: ignore[misc, valid-type]
        capabilities = stub.capabilities | {Capability.SNAPSHOT}

        async def snapshot(self, ref, labels):
            return Artifact(f"warm-up:{ref}", dict(labels), 0)

    return WarmUpAdapter()


def _read_frame(conn: socket.socket, max_fds: int = 3) -> tuple[bytes, list[int]]:
    """One whole frame from a blocking socket: between the server and its spare, which
    trust each other (the server reads callers' requests with `_Incoming`)."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, max_fds)
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        more = conn.recv(1 << 20)
        if not more:
            raise ValueError("request cut short")
        data += more
    return data[4 : 4 + int.from_bytes(data[:4], "big")], fds


def _reply(conn: socket.socket, word: str, payload: object) -> bool:
    """Whether the line went out (not when the caller has gone)."""
    try:
        conn.sendall(f"{word} {payload}\n".encode())
    except OSError:
        return False
    return True


@dataclasses.dataclass(eq=False)  # kept in a set, by identity
class _Incoming:
    """A caller's connection whose request is still arriving, read as it comes."""

    conn: socket.socket
    deadline: float
    data: bytearray = dataclasses.field(default_factory=bytearray)
    fds: list[int] = dataclasses.field(default_factory=list)

    def read_some(self) -> tuple[bytes, list[int]] | str | None:
        """The request's body and fds once it is whole; a reason to decline it; or None
        while more is to come. Raises EOFError when the caller went away."""
        try:
            data, fds, flags, _addr = socket.recv_fds(self.conn, 1 << 16, 3)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            raise EOFError(f"the caller's connection failed: {exc}") from None
        self.fds += fds
        if flags & socket.MSG_CTRUNC or len(self.fds) > 3:
            return "bad request (more than three fds)"
        if not data:
            raise EOFError("the caller went away before its request was whole")
        self.data += data
        if len(self.data) < 4:
            return None
        length = int.from_bytes(self.data[:4], "big")
        if length > MAX_REQUEST_BYTES:
            return f"request too large ({length} bytes; at most {MAX_REQUEST_BYTES})"
        if len(self.data) > 4 + length:
            return "bad request (bytes after the request)"
        if len(self.data) < 4 + length:
            return None
        fds, self.fds = self.fds, []
        return bytes(self.data[4:]), fds

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.conn.close()


def _run_child(conn: socket.socket, request: dict[str, Any]) -> None:
    """In the forked child: become the caller's `sbx` process, run the command, exit.

    The child answers both lines itself, in order: `pid N` before it runs anything (were the
    server to answer it, a quick command's `exit` could reach the caller first, and the
    caller would take the command as declined and run it again), and `exit N` after letting
    go of the caller's stdin/stdout/stderr, so the caller goes on while this process is torn
    down (a few ms for a process this size). The server answers `exit` too when it reaps the
    child, for a child killed by a signal; by then the caller has what it needs or is gone.
    Only then does the caller send its stdin/stdout/stderr; a caller that has gone instead
    (it gave up waiting, and ran the command itself) gets nothing run here: the command never
    runs twice."""
    if not _reply(conn, "pid", os.getpid()):
        os._exit(1)
    fds = _caller_fds(conn)
    if fds is None:
        os._exit(1)
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty())
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        sys.argv = ["sbx", *request["argv"]]
        from sandboxer_tui.cli import main

        try:
            main(request["argv"])
            code = 0
        except SystemExit as exc:
            code = int(exc.code) if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:
            print("sbx: aborted", file=sys.stderr)
            code = 130
    except BaseException:  # a bug: show it on the caller's stderr, never in the server
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        for fd in (0, 1, 2):
            with contextlib.suppress(OSError):
                os.close(fd)
        _reply(conn, "exit", code)
        os._exit(code)


def _caller_fds(conn: socket.socket) -> list[int] | None:
    """The caller's fds 0, 1 and 2, which it sends on seeing `pid`; None if it does not."""
    conn.settimeout(READ_REQUEST_WITHIN_S)
    try:
        data, fds, flags, _addr = socket.recv_fds(conn, 1, 3)
    except OSError:
        return None
    finally:
        conn.settimeout(None)
    if data == b"\0" and len(fds) == 3 and not flags & socket.MSG_CTRUNC:
        return fds
    for fd in fds:
        os.close(fd)
    return None


def _wait_as_spare(control: socket.socket, warm_now: int) -> None:
    """In a spare child, forked while no command waits: open the database and reach the
    local engine (sandboxer_tui.server.prepared), say so, then wait for a command.

    The fork, the database's first connection and the engine's ping then happen on no
    command's clock. The command takes what was opened only if its environment names the
    same database file and engine. When the server has no command running it writes to the
    `warm_now` pipe: the spare then runs the warm-up, so that its first touches of the memory
    it shares with the server (copied on write) and of the code paths are not paid by the
    next command. It stops warming as soon as a command arrives. (Warming while a command
    runs beside it was measured to slow that command by as much as it saved the next one.)
    A pipe rather than a signal: a signal raised at the wrong moment (say, while `ready` is
    being sent) ended the spare. The spare exits when the server closes its end (the server
    stopping, or dying)."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from sandboxer_tui.server.prepared import prepare

        prepare(LOCAL_BACKENDS)

        def waiting() -> bool:
            return bool(select.select([control], [], [], 0)[0])

        control.sendall(b"ready\n")
        while control not in select.select([control, warm_now], [], [])[0]:
            if not os.read(warm_now, 64):
                raise EOFError("the server went away")
            _warm_up(stop=waiting)  # on throwaway state
            if not waiting():
                with contextlib.suppress(OSError):  # a command may be on its way in
                    control.sendall(b"warm\n")
        body, fds = _read_frame(control, max_fds=1)
        if len(fds) != 1:
            raise ValueError("a command comes with its caller's connection")
        request = marshal.loads(body)
    except BaseException:
        os._exit(0)
    os.close(warm_now)
    control.close()
    conn = socket.socket(fileno=fds[0])
    _run_child(conn, request)  # never returns


@dataclasses.dataclass
class _Spare:
    pid: int
    pidfd: int
    control: socket.socket  # the server's end; the spare's ends when it closes
    warm_now: int  # the write end of the pipe that tells it to warm up
    ready: bool = False
    warming: bool = False  # told to warm up
    warm: bool = False  # and done


class Server:
    def __init__(self, folder: Path, idle_s: float | None = None) -> None:
        self.folder = folder
        self.idle_s = idle_s
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pidfd -> (conn, pid)
        self.incoming: set[_Incoming] = set()  # callers whose request is on its way
        self.served = 0
        self.started = time.time()
        self.last_activity = time.monotonic()
        self.stamps: dict[str, float] = {}
        self.stopping = False
        self.spare: _Spare | None = None
        self.listener: socket.socket | None = None  # while serving
        self.lock: int | None = None  # the folder's server lock (see run)
        self.spares_lost = 0  # spares that died unused: after a few, fork per command only

    def preload(self) -> None:
        for name in PRELOAD:
            importlib.import_module(name)
        from sandboxer.adapters import registry

        registry.names()  # reads every distribution's entry points once, for every child
        _warm_up()
        if threading.active_count() > 1:  # fork would copy a thread's locks, not the thread
            raise RuntimeError(f"a preloaded module started a thread: {threading.enumerate()}")
        self.stamps = _code_fingerprint()
        gc.collect()
        gc.freeze()  # children share these pages instead of copying them on the next sweep

    def serve(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = self.folder / SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        old = os.umask(0o077)
        try:
            listener.bind(socket_address(self.folder))
        finally:
            os.umask(old)
        listener.listen(64)
        listener.setblocking(False)
        pid_file = open_state_file(self.folder / PID_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(pid_file, "w") as out:
            out.write(f"{os.getpid()}\n")
        self.selector.register(listener, selectors.EVENT_READ, "listener")
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.listener = listener
        self.last_activity = time.monotonic()  # idle from now: preloading took a while
        self._fork_spare()
        try:
            while not self.stopping:
                timeout = self._until_warm_up() or 1.0
                for key, _ in self.selector.select(timeout):
                    if key.data == "listener":
                        self._accept(listener)
                    elif isinstance(key.data, _Incoming):
                        self._read_request(key.data)
                    elif key.data == "spare-says":
                        self._spare_says()
                    elif key.data == "spare-exit":
                        self._spare_lost()
                    else:
                        self._reap(key.fileobj)
                self._drop_overdue_requests()
                self._warm_spare_if_idle()
                if self._idle_expired():
                    break
                changed = None if self.children else _changed(self.stamps)
                if changed:
                    _log(f"{changed} changed: stepping aside")
                    break
        finally:
            self._cleanup(listener, path)

    def _stop(self, _signum, _frame) -> None:
        self.stopping = True

    def _idle_expired(self) -> bool:
        if self.idle_s is None or self.children:
            return False
        return time.monotonic() - self.last_activity > self.idle_s

    def _accept(self, listener: socket.socket) -> None:
        """Take a connection and read nothing of it yet: its request is read as it arrives
        (`_read_request`), so a caller that sends nothing holds up no other."""
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of fds, say: the caller sees its connection closed
            _log(f"cannot accept a connection: {exc!r}")
            return
        conn.setblocking(False)
        try:
            uid = peer_uid_pid(conn)[0]
        except OSError:
            conn.close()
            return
        if uid != os.geteuid():  # marshal is for trusted data: read nothing of another user's
            _reply(conn, "declined", "another user")
            conn.close()
            return
        incoming = _Incoming(conn, time.monotonic() + READ_REQUEST_WITHIN_S)
        self.incoming.add(incoming)
        self.selector.register(conn, selectors.EVENT_READ, incoming)

    def _read_request(self, incoming: _Incoming) -> None:
        try:
            got = incoming.read_some()
        except EOFError as exc:
            _log(f"request refused: {exc}")
            self._forget(incoming)
            return
        if got is None:
            return
        self.selector.unregister(incoming.conn)
        self.incoming.discard(incoming)
        if isinstance(got, str):
            _log(f"request declined: {got}")
            incoming.conn.setblocking(True)
            _reply(incoming.conn, "declined", got)
            incoming.close()
            return
        body, fds = got
        incoming.conn.setblocking(True)
        self._take(incoming.conn, body, fds)

    def _forget(self, incoming: _Incoming) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(incoming.conn)
        self.incoming.discard(incoming)
        incoming.close()

    def _drop_overdue_requests(self) -> None:
        now = time.monotonic()
        for incoming in [i for i in self.incoming if i.deadline < now]:
            _log(f"request refused: not sent within {READ_REQUEST_WITHIN_S:.0f} s")
            self._forget(incoming)

    def _take(self, conn: socket.socket, body: bytes, fds: list[int]) -> None:
        """Run, answer or decline one whole request."""
        pid: int | None = None
        try:
            try:
                request = marshal.loads(body)
            except (ValueError, EOFError, TypeError):
                request = None
            if not isinstance(request, dict):
                _log("request declined: bad request (not a marshalled dict)")
                _reply(conn, "declined", "bad request")
                return
            if request.get("op") == "status":  # not a command: the server stays idle
                _reply(conn, "status", json.dumps(self.status()))
                return
            self.last_activity = time.monotonic()
            reason = self._decline_reason(request, fds)
            if reason:
                _reply(conn, "declined", reason)
                return
            handed = self._hand_to_spare(conn, body)
            if handed:
                pid, pidfd = handed
            else:
                pid = os.fork()
                if pid == 0:
                    try:  # whatever happens, the child never goes back to serving
                        self._close_inherited(self.listener)
                        _run_child(conn, request)  # never returns
                    finally:
                        os._exit(1)
                pidfd = os.pidfd_open(pid)
                self.selector.register(pidfd, selectors.EVENT_READ, "child")
        except Exception as exc:  # noqa: BLE001 (one bad request never ends the server)
            _log(f"request refused: {exc!r}")
            return
        finally:
            for fd in fds:
                os.close(fd)
            if pid is None:
                conn.close()
        self.served += 1
        self.children[pidfd] = (conn, pid)
        self._fork_spare()

    # -- the spare ---------------------------------------------------------------------------

    def _fork_spare(self) -> None:
        if self.spare is not None or self.stopping or self.spares_lost >= 3:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        warm_read, warm_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:  # whatever happens, the spare never goes back to serving
                ours.close()
                os.close(warm_write)
                self._close_inherited(self.listener)
                _wait_as_spare(theirs, warm_read)  # never returns
            finally:
                os._exit(0)
        theirs.close()
        os.close(warm_read)
        pidfd = os.pidfd_open(pid)
        self.spare = _Spare(pid, pidfd, ours, warm_write)
        self.selector.register(pidfd, selectors.EVENT_READ, "spare-exit")
        self.selector.register(ours, selectors.EVENT_READ, "spare-says")

    def _spare_says(self) -> None:
        """`ready` (it has prepared) or `warm` (it has warmed up); nothing: it died, and
        its pidfd says so next."""
        spare = self.spare
        assert spare is not None
        try:
            said = spare.control.recv(64)
        except OSError:
            said = b""
        if not said:
            self.selector.unregister(spare.control)
            return
        spare.ready = spare.ready or b"ready\n" in said
        spare.warm = spare.warm or b"warm\n" in said

    def _until_warm_up(self) -> float | None:
        """Seconds until the spare is due to warm up; None when it is not to."""
        spare = self.spare
        if spare is None or not spare.ready or spare.warming or self.children:
            return None
        return max(0.001, self.last_activity + WARM_AFTER_IDLE_S - time.monotonic())

    def _warm_spare_if_idle(self) -> None:
        """Warm the spare up only after a pause with no command: never on a command's
        clock, nor while a burst of commands comes in."""
        spare = self.spare
        if spare is None or not spare.ready or spare.warming or self.children:
            return
        if time.monotonic() - self.last_activity < WARM_AFTER_IDLE_S:
            return
        with contextlib.suppress(OSError):  # it died: its pidfd says so next
            os.write(spare.warm_now, b"w")
        spare.warming = True

    def _hand_to_spare(self, conn: socket.socket, body: bytes) -> tuple[int, int] | None:
        """Give the command to the spare if one is ready: its pid and pidfd, else None."""
        spare = self.spare
        if spare is None or not spare.ready:
            return None
        self.spare = None
        try:
            socket.send_fds(spare.control, [len(body).to_bytes(4, "big") + body],
                            [conn.fileno()])
        except OSError:  # it died since it said ready
            self._end_spare(spare)
            return None
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(spare.control)
        spare.control.close()
        os.close(spare.warm_now)
        self.selector.modify(spare.pidfd, selectors.EVENT_READ, "child")
        return spare.pid, spare.pidfd

    def _spare_lost(self) -> None:
        spare = self.spare
        assert spare is not None
        self.spare = None
        self.spares_lost += 1
        self._end_spare(spare)
        _log(f"the spare child {spare.pid} exited unused")
        self._fork_spare()  # another, up to 3 lost in the server's life

    def _end_spare(self, spare: _Spare) -> None:
        """Close its end (it exits on seeing that) and reap it."""
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(spare.control)
        spare.control.close()
        os.close(spare.warm_now)
        self.selector.unregister(spare.pidfd)
        os.close(spare.pidfd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(spare.pid, 0)

    def _close_inherited(self, listener: socket.socket) -> None:
        """A child holds nothing of the server's but its own caller's connection: not the
        listener, nor other callers' connections, so a caller sees its server go away."""
        listener.close()
        if self.lock is not None:  # the server's alone: a child outliving it must not hold it
            os.close(self.lock)
        for incoming in self.incoming:
            incoming.close()
        if self.spare is not None:  # a command forked while the spare was not yet ready
            self.spare.control.close()
            os.close(self.spare.warm_now)
        for pidfd, (conn, _) in self.children.items():
            conn.close()
            os.close(pidfd)
        if self.spare is not None:
            self.spare.control.close()
            os.close(self.spare.pidfd)
        self.selector.close()

    def _decline_reason(self, request: dict[str, Any], fds: list[int]) -> str | None:
        if request.get("protocol") != PROTOCOL:
            return "another protocol"
        if fds:
            return "bad request (fds come after `pid`)"
        if (any(not isinstance(request.get(name), kind) for name, kind in REQUEST_FIELDS.items())
                or not all(isinstance(arg, str) for arg in request["argv"])
                or not all(isinstance(k, str) and isinstance(v, str)
                           for k, v in request["env"].items())):
            return "bad request"
        if os.path.realpath(request["executable"]) != os.path.realpath(sys.executable):
            return "another Python"
        changed = _changed(self.stamps)
        if changed:
            _log(f"{changed} changed: stepping aside")
            self.stopping = True  # our code changed on disk: let the caller run it fresh
            return "code changed"
        return None

    def _reap(self, pidfd: int) -> None:
        self.selector.unregister(pidfd)
        conn, pid = self.children.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        _reply(conn, "exit", code if code >= 0 else 128 - code)
        conn.close()
        self.last_activity = time.monotonic()

    def status(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "served": self.served, "commands_running": len(self.children),
                "spare": self.spare.pid if self.spare and self.spare.ready else None,
                "spare_warm": bool(self.spare and self.spare.warm),
                "since": self.started, "python": sys.executable}

    def _cleanup(self, listener: socket.socket, path: Path) -> None:
        """Stop taking commands; the ones running finish and answer their callers."""
        self.selector.unregister(listener)
        listener.close()
        for incoming in list(self.incoming):
            self._forget(incoming)
        if self.spare is not None:
            spare, self.spare = self.spare, None
            self._end_spare(spare)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.folder / PID_FILE).unlink()
        while self.children:
            for key, _ in self.selector.select(1.0):
                self._reap(key.fileobj)


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def server_folder() -> Path:
    """The state folder (the core's rule, which the launchers follow), checked: the server
    neither lives in, nor is looked for in, a folder another user can write to."""
    return state_folder()


def query_status(folder: Path) -> dict[str, Any] | None:
    """The running server's status, or None when none answers. Only a listener of this user
    counts, and only with its own process id (SO_PEERCRED's): `stop` signals that pid."""
    if not (folder / SOCKET_NAME).exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        try:
            sock.connect(socket_address(folder))
            uid, pid = peer_uid_pid(sock)
            if uid != os.geteuid():
                return None
            send_request(sock, {"op": "status"})
            line = sock.makefile("r").readline()
        except OSError:
            return None
    word, _, payload = line.partition(" ")
    try:
        status = json.loads(payload) if word == "status" else None
    except ValueError:
        return None
    return status if isinstance(status, dict) and status.get("pid") == pid else None


def spawn(folder: Path, idle_s: float | None) -> Path:
    """A detached server for `folder`, started without waiting for it; its log's path."""
    import subprocess

    log = folder / LOG_FILE
    with os.fdopen(open_state_file(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as out:
        os.fchmod(out.fileno(), 0o600)
        subprocess.Popen(
            [sys.executable, "-m", "sandboxer_tui.server.resident", "" if idle_s is None else str(idle_s)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            cwd="/", close_fds=True)
    return log


def start(idle_s: float | None = None, wait_s: float = 30.0) -> tuple[dict[str, Any], bool]:
    """Start a detached server unless one answers. Returns its status and whether it is new."""
    folder = server_folder()
    running = query_status(folder)
    if running and "pid" in running:
        return running, False
    if os.path.islink(folder / PID_FILE):  # the server would refuse it: say so here, at once
        os.close(open_state_file(folder / PID_FILE, os.O_RDONLY))
    log = spawn(folder, idle_s)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        status = query_status(folder)
        if status and "pid" in status:
            return status, True
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
    raise RuntimeError(f"the sbx server did not start within {wait_s:.0f} s: {tail[0]} (see {log})")


def stop(wait_s: float = 30.0) -> dict[str, Any] | None:
    """Stop the server (running commands finish first). None when none was running."""
    folder = server_folder()
    status = query_status(folder)
    if not status or "pid" not in status:
        return None
    os.kill(status["pid"], signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (folder / SOCKET_NAME).exists():
        time.sleep(0.05)
    return status


def run(idle_s: float | None = None) -> None:
    """Serve in the foreground until SIGTERM, idleness or a code change. One server per
    folder: a second one (two first commands starting one at once) leaves at once."""
    import fcntl

    folder = server_folder()
    lock = open_state_file(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _log("another sbx server serves this folder")
        return
    server = Server(folder, idle_s)
    server.lock = lock
    server.preload()
    _log(f"serving {folder / SOCKET_NAME} (pid {os.getpid()})")
    server.serve()
    _log(f"stopped after {server.served} commands")


if __name__ == "__main__":
    idle = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None
    run(idle)
