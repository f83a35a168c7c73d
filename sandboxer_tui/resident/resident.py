"""`sbx server`: a resident process that runs each `sbx` command in a forked child.

The server imports the heavy modules once, keeps nothing open (no database connection, no
engine client, no thread), and forks one child per command: the child takes the caller's
stdin/stdout/stderr, environment, working folder and umask, runs the command exactly as `sbx`
would, and exits. Each command is still its own process with its own database connection,
lease owner and engine client, so every guarantee of a one-shot `sbx` holds. Shared are the
imports and one thing more: `sbx ls`'s listing, which the server brings up to date after each
`sbx ls` (reading only what changed, on a connection it closes again) and the next `sbx ls`'s
child reads on from (`_keep_listing`).

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
import selectors
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sandboxer.core.rules.errors import ExitCode
from sandboxer.core.rules.settings import open_state_file
from sandboxer_tui.resident.control import LOCK_FILE, PID_FILE, server_folder
from sandboxer_tui.resident.launcher import (
    LOCAL_COMMANDS,
    PROTOCOL,
    SOCKET_NAME,
    command_word,
    peer_uid_pid,
    socket_address,
)

# A request is argv and the environment, which Linux caps at a few MiB together (ARG_MAX):
# a frame announcing more is declined before it is read.
MAX_REQUEST_BYTES = 16 * 1024**2
# A connection that has not sent its whole request by then is closed (a launcher sends it
# at once; the launcher gives up waiting for an answer after launcher.ANSWER_WITHIN_S).
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
    "sandboxer.core.follow.watch",
    "sandboxer.core.store.inventory",
    "sandboxer.core.store.events",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "sandboxer.adapters.docker",
    "docker",
    "sandboxer.adapters.stub",
    "sandboxer.adapters.ssh",
    # a reaper's look loads every adapter class (7 ms a command in the child): the modules
    # of the compose, E2B and Modal adapters, not their SDKs, which they import when used
    "sandboxer.adapters.compose",
    "sandboxer.adapters.e2b",
    "sandboxer.adapters.modal",
    "sandboxer.core.pools",
    "platformdirs",
    "tomllib",
    "netrc",  # requests imports it on a client's first request
)
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


def _read_frame(conn: socket.socket, max_fds: int = 3) -> tuple[bytes, list[int]]:
    """One whole frame from a blocking socket, for a stand-in server of the tests and the
    benchmarks (the server reads callers' requests as they come, with `_Incoming`)."""
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
        os._exit(ExitCode.FAILED)
    fds = _caller_fds(conn)
    if fds is None:
        os._exit(ExitCode.FAILED)
    code = ExitCode.FAILED
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
            code = ExitCode.OK
        except SystemExit as exc:
            code = int(exc.code) if isinstance(exc.code, int) else (
                ExitCode.OK if exc.code is None else ExitCode.FAILED)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:
            print("sbx: aborted", file=sys.stderr)
            code = ExitCode.INTERRUPTED
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


class Server:
    def __init__(self, folder: Path, idle_s: float | None = None) -> None:
        self.folder = folder
        self.idle_s = idle_s
        self.selector = selectors.DefaultSelector()
        # pidfd -> (conn, pid, whether the command was `sbx ls`)
        self.children: dict[int, tuple[socket.socket, int, bool]] = {}
        self.incoming: set[_Incoming] = set()  # callers whose request is on its way
        self.served = 0
        self.started = time.time()
        self.last_activity = time.monotonic()
        self.stamps: dict[str, float] = {}
        self.stopping = False
        self.listener: socket.socket | None = None  # while serving
        self.lock: int | None = None  # the folder's server lock (see run)

    def preload(self) -> None:
        for name in PRELOAD:
            importlib.import_module(name)
        from sandboxer.adapters import registry

        registry.names()  # reads every distribution's entry points once, for every child
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
        try:
            while not self.stopping:
                for key, _ in self.selector.select(1.0):
                    if key.data == "listener":
                        self._accept(listener)
                    elif isinstance(key.data, _Incoming):
                        self._read_request(key.data)
                    else:
                        self._reap(key.fileobj)
                self._drop_overdue_requests()
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
            pid = os.fork()
            if pid == 0:
                try:  # whatever happens, the child never goes back to serving
                    self._close_inherited(self.listener)
                    _run_child(conn, request)  # never returns
                finally:
                    os._exit(ExitCode.FAILED)
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
        self.children[pidfd] = (conn, pid, command_word(request["argv"]) == "ls")

    def _close_inherited(self, listener: socket.socket) -> None:
        """A child holds nothing of the server's but its own caller's connection: not the
        listener, nor other callers' connections, so a caller sees its server go away."""
        listener.close()
        if self.lock is not None:  # the server's alone: a child outliving it must not hold it
            os.close(self.lock)
        for incoming in self.incoming:
            incoming.close()
        for pidfd, (conn, _, _) in self.children.items():
            conn.close()
            os.close(pidfd)
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
        if command_word(request["argv"]) in LOCAL_COMMANDS:  # `sbx serve` runs where typed
            return "a command that runs where it was typed"
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
        conn, pid, listed = self.children.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        _reply(conn, "exit", code if code >= 0 else 128 - code)
        conn.close()
        if listed and not self.stopping:
            self._keep_listing()
        self.last_activity = time.monotonic()

    def _keep_listing(self) -> None:
        """After an `sbx ls`, once its caller has the answer: bring the listing up to date
        and keep it for the next `sbx ls`'s child, which then reads only the rows changed
        since, not every row (core/follow/watch.py keep_for_children; docs/design.md, "The
        resident server"). The connection is closed before the next fork; nothing is kept
        when the database is not current or cannot be read."""
        from sandboxer.core.follow.watch import keep_for_children
        from sandboxer.core.rules.settings import database_url

        try:
            keep_for_children(database_url())
        except Exception as exc:  # noqa: BLE001 (the child reads the database itself then)
            _log(f"could not keep the listing: {exc!r}")
        if threading.active_count() > 1:  # fork would copy a thread's locks, not the thread
            _log(f"keeping the listing started a thread, stepping aside: {threading.enumerate()}")
            self.stopping = True
        gc.freeze()  # the children's collections leave the kept listing's pages shared

    def status(self) -> dict[str, Any]:
        from sandboxer.core.follow.watch import kept_for_children

        return {"pid": os.getpid(), "served": self.served, "commands_running": len(self.children),
                "since": self.started, "python": sys.executable,
                "listings_kept": kept_for_children()}

    def _cleanup(self, listener: socket.socket, path: Path) -> None:
        """Stop taking commands; the ones running finish and answer their callers."""
        self.selector.unregister(listener)
        listener.close()
        for incoming in list(self.incoming):
            self._forget(incoming)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.folder / PID_FILE).unlink()
        while self.children:
            for key, _ in self.selector.select(1.0):
                self._reap(key.fileobj)


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", file=sys.stderr, flush=True)


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
