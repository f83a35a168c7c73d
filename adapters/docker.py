"""The Docker backend, on docker-py (the engine at `DOCKER_HOST`, else the local socket).

Containers are hardened by default: every capability dropped, no-new-privileges, no network
unless the profile asks (then a bridge of the installation's own, with no traffic between its
containers), memory (without swap), CPU and pids limits; on request a read-only root and
another user. docker-py is blocking, so each call runs in a worker thread; no database
transaction is open while it does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import posixpath
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar


def _import_docker_py() -> None:
    """docker-py imports paramiko (about 90 ms) whenever it is imported, for ssh:// engines
    alone. Unless this process's engine is one, it is imported without: `_ssh_transport`
    brings paramiko in if an ssh:// engine turns up later."""
    if "docker" in sys.modules or "paramiko" in sys.modules or \
            os.environ.get("DOCKER_HOST", "").startswith("ssh://"):
        return
    sys.modules["paramiko"] = None  # `import paramiko` fails: docker-py goes on without it
    try:
        import docker  # noqa: F401
    finally:
        del sys.modules["paramiko"]


_import_docker_py()

import docker  # noqa: E402
from docker import errors as docker_errors  # noqa: E402
from docker.tls import TLSConfig  # noqa: E402
from docker.utils import kwargs_from_env  # noqa: E402

from sandboxer.adapters.archives import BoundedTar, TooLarge, member_path  # noqa: E402
from sandboxer.adapters.base import (  # noqa: E402
    EXEC_MARK,
    KILL_MARKED,
    LABEL_CHECKPOINT,
    LABEL_COMPOSE,
    LABEL_ID,
    LABEL_INSTALL,
    LABEL_POD,
    LABEL_SERVICE,
    LABEL_VOLUME,
    Adapter,
    AdapterError,
    Artifact,
    ArtifactRefused,
    BackendObject,
    BackendObjectGone,
    BackendUnavailable,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    Endpoint,
    ExecResult,
    FileInfo,
    Health,
    InvalidRequest,
    MetricSample,
    NoSuchPath,
    PtyChannel,
    ServiceSpec,
    Stdin,
    VolumeMountSpec,
    one_line,
    stdin_chunks,
)

BASE_IMAGE = "sandboxer/base:busybox"
CHECKPOINT_REPOSITORY = "sandboxer/checkpoint"
# A checkpoint image is tagged once for each installation that holds it on this engine,
# `<checkpoint id>-<digest of the installation id>` (holder_tag): an installation removes only
# its own tag, and the image only once no other checkpoint tag is left on it. An archive names
# its image by the bare checkpoint id (transport_tag), which is loaded and then dropped again;
# checkpoints made before holder tags still hold their image by that name.
INSTALL_DIGEST_LEN = 12
# Keeps the container alive and exits at once on TERM; needs only a POSIX sh.
KEEPALIVE = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
# `network: full`: one user-defined bridge per installation, `sbx-<install id>`, made on first
# use and kept (a network holds no data; removing it would race the next create and the
# restart of a stopped container). Inter-container traffic is off on it, so sandboxes reach
# out but not each other, nor the containers on Docker's default bridge.
BRIDGE_PREFIX = "sbx-"
BRIDGE_ICC = "com.docker.network.bridge.enable_icc"
# `read_only: true`: the root is read-only, /tmp a tmpfs (in the container's memory limit;
# noexec, as Docker mounts a tmpfs by default: nothing written can be run directly)
READ_ONLY_TMPFS = {"/tmp": "rw,nosuid,nodev,noexec,mode=1777"}
# How long a successful ping stands for the next operation's own (ensure_available): an
# engine that stops answering is still met before anything is written, give or take this.
PING_FRESH_S = 1.0
# the engine keeps its last 256 events; more since a reaper's last full look may have lost some
ENGINE_EVENTS_TRUSTED = 200
# What an engine's event says happened to a container without changing what a reconcile
# compares: a command run in it (exec_create, exec_start, exec_die) or files copied in or out
# (extract-to-dir, archive-path). A cycle between full looks stays one after these
# (change_marker).
QUIET_ACTIONS = ("exec_", "extract-to-dir", "archive-path")
# A container of ours that stops with the engine comes back when the engine starts again;
# one stopped on purpose (`docker stop`, sbx's own remove) stays stopped.
RESTART_POLICY = {"Name": "unless-stopped"}
# A running container up for less than its age by more than this was started again (it is
# started within a second of being made; the listing's times are whole seconds).
RESTART_SLACK_S = 2.0
# What a person can do however sbx was installed (a pip install has no Makefile).
GVISOR_RUNTIME = "runsc"  # gVisor's OCI runtime, as `make gvisor` registers it


def gvisor_missing(where: str) -> str:
    """What a create asking for gVisor, and `sbx doctor`, say of an engine without runsc."""
    return (f"the Docker engine at {where} has no {GVISOR_RUNTIME} runtime, which isolation: "
            "gvisor needs (sbx never falls back to runc); run `make gvisor`, or install gVisor "
            "and register runsc in the engine's daemon.json `runtimes`")


START_HINT = (
    "start Docker (`sudo systemctl start docker`, or open Docker Desktop) or set DOCKER_HOST "
    "to an engine that runs; `sbx doctor` checks the setup"
)
# Why an engine did not answer, in plain words, by the error number underneath.
UNREACHABLE_BECAUSE = {
    errno.ENOENT: "no engine listens there (the socket does not exist)",
    errno.ECONNREFUSED: "nothing accepts connections there",
    errno.ECONNRESET: "the connection was cut",
    errno.EACCES: "permission denied (your user may not use that socket: add it to the docker "
                  "group, or run as a user who may)",
    errno.EPERM: "permission denied",
    errno.ETIMEDOUT: "it did not answer in time",
    errno.EHOSTUNREACH: "its host cannot be reached",
    errno.ENETUNREACH: "its network cannot be reached",
    errno.ENOTSOCK: "that is not a socket",
}


PLAINTEXT_ENV = "SBX_DOCKER_ALLOW_PLAINTEXT"  # =1: an engine over the network without TLS
NETWORK_SCHEMES = ("tcp://", "http://", "https://")
# Connections kept per engine URL: more than the threads that call at once (the library's 64
# sbx-io threads, the reaper's workers). docker-py keeps one urllib3 pool per request URL and
# closes the least recent past 25; a pool that overflows its size logs its qsize(), and an
# overflow racing that close is an AttributeError in the middle of a create.
ENGINE_CONNECTIONS = 128


def engine_url() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def engine_tls(base_url: str) -> TLSConfig | None:
    """The TLS to speak to `base_url`, from DOCKER_TLS_VERIFY / DOCKER_CERT_PATH as the docker
    CLI reads them (docker-py's kwargs_from_env). What sbx sends an engine includes secrets,
    so one over the network is refused (InvalidRequest, exit 2) unless TLS verifies its
    certificate, or the user accepts less with SBX_DOCKER_ALLOW_PLAINTEXT=1."""
    if not base_url.startswith(NETWORK_SCHEMES):
        return None  # a local socket, or ssh:// (encrypted, host keys checked by paramiko)
    try:
        tls = kwargs_from_env(environment=dict(os.environ)).get("tls")
    except docker_errors.TLSParameterError as exc:
        folder = os.environ.get("DOCKER_CERT_PATH") or "~/.docker"
        raise InvalidRequest(
            f"cannot speak TLS to the Docker engine at {base_url}: {_short(exc)} (DOCKER_CERT_PATH "
            f"{folder} must hold ca.pem, cert.pem and key.pem)") from None
    if (tls is not None and tls.verify) or os.environ.get(PLAINTEXT_ENV) == "1":
        return tls
    how = ("over TLS that does not verify its certificate (DOCKER_TLS_VERIFY is not set)"
           if tls is not None else "without TLS")
    raise InvalidRequest(
        f"refusing the Docker engine at {base_url}: it would be reached {how}, so secrets and "
        f"commands would cross the network unprotected; set DOCKER_TLS_VERIFY=1 and "
        f"DOCKER_CERT_PATH (ca.pem, cert.pem, key.pem) as for the docker CLI, or "
        f"{PLAINTEXT_ENV}=1 to accept it")


def _keep_engine_ca(api: docker.APIClient) -> None:
    """Verify the engine against DOCKER_CERT_PATH's ca.pem, as the docker CLI does: requests
    otherwise lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace a session's own CA (requests
    issue 3829), and the engine's certificate, from a private CA, fails verification."""
    merge = api.merge_environment_settings

    def merged(url: str, proxies: Any, stream: Any, verify: Any, cert: Any) -> dict[str, Any]:
        settings = merge(url, proxies, stream, verify, cert)
        settings["verify"] = api.verify if verify is None else verify
        return settings

    api.merge_environment_settings = merged  # type: ignore[method-assign]


def own_bridge(api: docker.APIClient, install: str) -> str:
    """The name of the installation's bridge, made if missing. One of that name that sbx did
    not make (another label, or traffic between containers allowed) is refused."""
    name = f"{BRIDGE_PREFIX}{install}"
    for _ in range(3):
        try:
            info = api.inspect_network(name)
        except docker_errors.NotFound:
            try:
                api.create_network(name, driver="bridge", options={BRIDGE_ICC: "false"},
                                   labels={LABEL_INSTALL: install}, check_duplicate=True)
            except docker_errors.APIError as exc:
                if exc.status_code != 409:  # 409: another create made it first
                    raise
            continue
        if (info.get("Name") != name or info.get("Driver") != "bridge"
                or (info.get("Labels") or {}).get(LABEL_INSTALL) != install
                or (info.get("Options") or {}).get(BRIDGE_ICC) != "false"):
            raise AdapterError(
                f"the Docker network {name} is not the one sbx makes (a bridge labelled "
                f"{LABEL_INSTALL}={install} with {BRIDGE_ICC}=false); remove it "
                f"(`docker network rm {name}`) and sbx makes its own")
        return name
    raise AdapterError(f"the Docker network {name} could not be made")



def _ssh_transport() -> None:
    """docker-py's ssh:// transport, imported now if docker-py was imported without it."""
    import docker.api.client
    import docker.transport

    if not hasattr(docker.transport, "SSHHTTPAdapter"):
        from docker.transport.sshconn import SSHHTTPAdapter  # paramiko, at last

        docker.transport.SSHHTTPAdapter = SSHHTTPAdapter
        docker.api.client.SSHHTTPAdapter = SSHHTTPAdapter


def build_base_image(api: docker.APIClient, tag: str = BASE_IMAGE) -> str:
    """Make the offline base image from the host's static busybox; no registry needed."""
    busybox = next((p for p in BUSYBOX_PATHS if os.path.isfile(p)), None)
    if busybox is None:
        raise AdapterError(
            f"cannot build {tag}: no busybox on this host (on Debian: apt-get install busybox-static)"
        )
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for folder in ("bin", "tmp", "etc", "root", "home", "work"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in applets.stdout.split():
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/sh\n"
        group = b"root:x:0:\nnogroup:x:65534:\n"
        for name, data in (("etc/passwd", passwd), ("etc/group", group)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    repository, _, version = tag.partition(":")
    api.import_image_from_data(
        buf.getvalue(), repository=repository, tag=version or "latest",
        changes=['CMD ["sh"]', "ENV PATH=/bin", "WORKDIR /work"],
    )
    return tag


_UP_FOR = re.compile(r"Up (Less than a second|About a minute|About an hour|"
                     r"(\d+) (second|minute|hour|day|week|month|year)s?)")
_UNIT_S = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400,
           "month": 30 * 86400, "year": 365 * 86400}


def _up_at_most(status: str | None) -> float | None:
    """How long a container has been up at most, from the listing's `Status` ("Up 5
    minutes", docker's HumanDuration of the time since it started); None if not said."""
    match = _UP_FOR.match(status or "")
    if match is None:
        return None
    phrase, count, unit = match.groups()
    if count is None:
        return {"Less than a second": 1, "About a minute": 120, "About an hour": 5400}[phrase]
    if unit == "hour":  # rounded to the nearest hour
        return (int(count) + 0.5) * 3600
    return (int(count) + 1) * _UNIT_S[unit]


def _maybe_restarted(info: Mapping[str, Any], now: float) -> bool:
    """The listing has no start time; a container up for clearly less than its age was
    started again (or the listing cannot say): worth one inspect."""
    up, created = _up_at_most(info.get("Status")), info.get("Created")
    if up is None or not created:
        return True
    return now - created - up > RESTART_SLACK_S


def _restarted_at(state: Mapping[str, Any]) -> datetime | None:
    """When a running container was started again: it has stopped once (FinishedAt is set)."""
    finished = state.get("FinishedAt") or ""
    if not state.get("Running") or not finished or finished.startswith("0001-"):
        return None
    return _parse_time(state.get("StartedAt"))


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00")
    except ValueError:
        return None


def _marked(env: Mapping[str, str] | None, timeout_s: float | None,
            ) -> tuple[str | None, dict[str, str] | None]:
    """An exec's mark and environment. Only an exec with a timeout can need killing, so only
    it carries the mark (docs/security.md); the engine takes about a millisecond longer to
    start an exec with an environment than one without."""
    if timeout_s is None:
        return None, dict(env) if env else None
    mark = uuid.uuid4().hex
    return mark, {**(env or {}), EXEC_MARK: mark}


# How an exec's bytes move (DockerAdapter._exec): its output at most EXEC_QUEUE pieces ahead
# of whoever reads it, each at most EXEC_READ bytes; stdin in pieces of at most STDIN_PIECE,
# at most STDIN_QUEUE of them on their way (a stream of any length is never held whole).
EXEC_QUEUE = 64
EXEC_READ = 64 * 1024
STDIN_PIECE = 256 * 1024
STDIN_QUEUE = 4
# A timed-out exec's result comes at most this long after its deadline (docs/adapters.md
# promises 0.5 s): the kill and the last of the output are waited for until then, no longer;
# the rest of the half second is left to a busy machine's scheduling (CI once saw 0.57 s
# with 0.4 here).
EXEC_TIMEOUT_RETURN_S = 0.3
# The exec's stream can end a moment before the engine records its exit code.
EXIT_CODE_WAIT_S = 2.0
# What the engine writes on the exec's stdout when the command never started: a working
# folder or a user the sandbox does not have comes back as exit 126 and one of these lines.
START_FAILURES = (b"OCI runtime exec failed", b"unable to find user", b"unable to find group")
_STREAMS = {1: "stdout", 2: "stderr"}
# Kills still finishing after the exec they were for returned (held so they are not dropped).
_BACKGROUND: set[asyncio.Future[Any]] = set()


def _start_failure(said: bytes, cwd: str | None, user: str | None) -> AdapterError | None:
    """What the engine's line about a command that never started means, or None when it is
    not about the working folder or the user."""
    text = said.decode(errors="replace")
    if cwd and "chdir to cwd" in text:
        if "no such file or directory" in text:
            return NoSuchPath(f"{cwd} does not exist in the sandbox (the command's working "
                              "folder)")
        return InvalidRequest(f"the command cannot run in {cwd}: not a folder it may enter")
    if user and ("unable to find user" in text or "unable to find group" in text):
        return InvalidRequest(f"user {user!r} does not exist in the sandbox")
    return None


async def _stdin_pieces(stdin: Stdin) -> AsyncIterator[bytes | memoryview]:
    """`stdin` in pieces of at most STDIN_PIECE bytes (bytes are sliced, not copied)."""
    async for chunk in stdin_chunks(stdin):
        view = memoryview(chunk)
        for at in range(0, len(view), STDIN_PIECE):
            yield view[at:at + STDIN_PIECE]


class _ExecSocket:
    """An exec's hijacked connection (`exec_start(socket=True)`): the command's stdin is
    written to it and its write side shut; its stdout and stderr come back as the engine's
    multiplexed frames (8 bytes: the stream, three zeros, the length big-endian; then the
    data). Read through the HTTP response's own buffer: bytes that came with the headers
    are there, not on the socket."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock  # socket.SocketIO (a local or TCP engine), or an ssh channel
        self._raw = getattr(sock, "_sock", sock)
        response = getattr(sock, "_response", None)
        buffered = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
        self._reader = buffered if hasattr(buffered, "read1") else None
        if hasattr(self._raw, "settimeout"):
            self._raw.settimeout(None)  # a command may be silent for longer than any timeout
        self._pending = b""
        self._left = 0  # bytes of the current frame not read yet
        self._stream = 1

    def _recv(self, n: int) -> bytes:
        if self._pending:
            data, self._pending = self._pending[:n], self._pending[n:]
            return data
        try:
            data = self._reader.read1(n) if self._reader is not None else self._raw.recv(n)
        except (OSError, ValueError):  # shut down or closed under us: the end
            return b""
        return data or b""

    def read(self) -> tuple[int, bytes] | None:
        """The next piece of output, (1 for stdout or 2 for stderr, bytes); None at the end."""
        while not self._left:
            header = b""
            while len(header) < 8:
                more = self._recv(8 - len(header))
                if not more:
                    return None
                header += more
            self._stream, self._left = struct.unpack(">BxxxL", header)
        data = self._recv(min(self._left, EXEC_READ))
        if not data:
            return None
        self._left -= len(data)
        return self._stream, data

    def read_raw(self) -> bytes:
        """The next bytes of a TTY exec's output (not framed: a terminal has one stream);
        b"" at the end."""
        return self._recv(EXEC_READ)

    def write(self, data: bytes | memoryview) -> None:
        self._raw.sendall(data)

    def close_stdin(self) -> None:
        """End the command's stdin (the engine closes its pipe on our half-close)."""
        shutdown_write = getattr(self._raw, "shutdown_write", None)  # a paramiko channel
        if shutdown_write is not None:
            shutdown_write()
        else:
            self._raw.shutdown(socket.SHUT_WR)

    def shutdown(self) -> None:
        """Both directions: a read or write blocked on the connection returns at once."""
        with contextlib.suppress(OSError, AttributeError, TypeError):
            self._raw.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for thing in (getattr(self._sock, "_response", None), self._sock, self._raw):
            with contextlib.suppress(Exception):
                if thing is not None:
                    thing.close()


class _Workers:
    """Daemon threads kept for the next exec's reader and writer. Starting a thread per exec
    costs round trips between cores (its start is waited for), which on an idle VM's cores is
    most of an exec's own overhead; a ThreadPoolExecutor would do, but its threads are joined
    at the interpreter's exit, and a reader blocked on a command that runs on must never hold
    up the exit of the process that started it."""

    KEEP = 32  # idle threads kept; more are started when more execs run at once

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child (a resident server's): none of the parent's threads are here."""
        self._lock = threading.Lock()
        self._idle = []

    def run(self, job: Callable[[], None]) -> None:
        """`job` on an idle thread, or a new one; it must report its own failures."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="sbx-exec",
                             daemon=True).start()
        inbox.put(job)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            job = inbox.get()
            with contextlib.suppress(BaseException):  # a job reports its own failures
                job()
            del job
            with self._lock:
                if len(self._idle) >= self.KEEP:
                    return
                self._idle.append(inbox)


_WORKERS = _Workers()

T = TypeVar("T")

# Questions to an engine being asked right now, by (event loop, engine URL, question): a
# caller asking the same meanwhile shares the answer (_asked_once). Done ones are not kept.
_IN_FLIGHT: dict[tuple[Any, ...], asyncio.Future[Any]] = {}


async def _asked_once(question: tuple[Any, ...], ask: Callable[[], Awaitable[T]]) -> T:
    """`ask()`'s answer, shared with whoever asks the same `question` before it comes."""
    key = (asyncio.get_running_loop(), *question)
    pending = _IN_FLIGHT.get(key)
    if pending is None:
        pending = _IN_FLIGHT[key] = asyncio.ensure_future(ask())

        def done(answer: asyncio.Future[Any]) -> None:
            _IN_FLIGHT.pop(key, None)
            if not answer.cancelled():
                answer.exception()  # seen here: no "never retrieved" when every asker left
        pending.add_done_callback(done)
    return await asyncio.shield(pending)


class _StartFailed(Exception):
    """The exec could not be created or started (its cause is the engine's error)."""


class _ExecPump:
    """Moves one exec's bytes between the event loop and its connection, on two threads
    (_WORKERS'; a read or a write that blocks for as long as the command runs never holds a
    thread of the loop's pool): output out, at most EXEC_QUEUE pieces ahead of `get`; stdin
    in, at most STDIN_QUEUE pieces ahead of the connection. The reader's thread also creates
    and starts the exec (`start`) and, once the output ended, runs `finish` (the exit code's
    inspect): each is a hand-off to the loop fewer than a call of its own."""

    def __init__(self, start: Callable[[], tuple[str, Any]], loop: asyncio.AbstractEventLoop,
                 stdin: Stdin, finish: Callable[[str], Any] | None = None,
                 start_failed: Callable[[BaseException], BaseException] = lambda exc: exc,
                 ) -> None:
        self.conn: _ExecSocket | None = None
        self._start_failed = start_failed  # what a failure of `start` is to the caller
        self.exec_id: str | None = None  # once started (read on the loop after an item)
        self.loop = loop
        self.reads = 0
        self._start = start
        self._out: asyncio.Queue[Any] = asyncio.Queue()
        self._slots = threading.Semaphore(EXEC_QUEUE)
        self._stopped = False
        self._feeder: asyncio.Task[None] | None = None
        self._writer_done: threading.Event | None = None
        self._pieces: queue.SimpleQueue[bytes | memoryview | None] = queue.SimpleQueue()
        self._finish = finish
        self.finished: Any = None
        self.finish_error: BaseException | None = None
        # stdin given as bytes is already held: its pieces go to the writer at once, which
        # then never wakes the loop
        self._held = isinstance(stdin, bytes | bytearray | memoryview)
        if stdin is not None:
            self._room = asyncio.Semaphore(STDIN_QUEUE)
            self._writing = True
            self._writer_done = threading.Event()
            if self._held:
                view = memoryview(stdin)
                for at in range(0, len(view), STDIN_PIECE):
                    self._pieces.put(view[at:at + STDIN_PIECE])
                self._pieces.put(None)
            else:
                self._feeder = loop.create_task(self._feed(stdin))
        _WORKERS.run(self._read)

    def _soon(self, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(fn, *args)

    async def _feed(self, stdin: Stdin) -> None:
        try:
            async for piece in _stdin_pieces(stdin):
                await self._room.acquire()
                if self._stopped or not self._writing:
                    return
                self._pieces.put(piece)
        finally:
            self._pieces.put(None)

    def _write(self) -> None:
        try:
            while (piece := self._pieces.get()) is not None and not self._stopped:
                self.conn.write(piece)
                if not self._held:
                    self._soon(self._room.release)
            if not self._stopped:
                self.conn.close_stdin()
        except OSError:
            pass  # the command ended without reading it all: the rest is not wanted
        finally:
            self._writing = False
            if not self._held:
                self._soon(self._room.release)  # a feeder waiting for room sees it is over
            self._writer_done.set()

    def _read(self) -> None:
        try:
            self.exec_id, sock = self._start()
        except BaseException as exc:  # noqa: BLE001 (handed to the reader, raised there)
            self._soon(self._out.put_nowait, _StartFailed(exc))
            if self._writer_done is not None:
                self._writer_done.set()
            return
        self.conn = _ExecSocket(sock)
        if self._writer_done is not None:
            _WORKERS.run(self._write)
        try:
            while True:
                self._slots.acquire()
                if self._stopped:
                    return
                item = self.conn.read()
                if item is None and self._finish is not None and not self._stopped:
                    try:
                        self.finished = self._finish(self.exec_id)
                    except BaseException as exc:  # noqa: BLE001 (kept for the reader)
                        self.finish_error = exc
                self._soon(self._out.put_nowait, item)
                if item is None:
                    return
        except Exception as exc:  # noqa: BLE001 (handed to the reader, raised there)
            self._soon(self._out.put_nowait, exc)
        finally:
            self.conn.shutdown()  # the exec is over: a write still blocked returns
            self._pieces.put(None)
            if self._writer_done is not None:
                self._writer_done.wait()
            self.conn.close()

    async def get(self) -> tuple[str, bytes] | None:
        """The next piece of output, ("stdout" | "stderr", bytes); None once it ended."""
        item = await self._out.get()
        self._slots.release()
        if isinstance(item, _StartFailed):
            cause = item.args[0]
            error = self._start_failed(cause)
            if error is cause:
                raise cause
            raise error from cause
        if isinstance(item, BaseException):
            raise AdapterError(f"docker exec failed: {one_line(item)}")
        if item is None:
            feeder = self._feeder
            if feeder is not None and feeder.done() and not feeder.cancelled() \
                    and feeder.exception() is not None:
                raise feeder.exception()  # the caller's stdin failed: not a short stdin
            return None
        self.reads += 1
        return _STREAMS.get(item[0], "stdout"), item[1]

    def abort(self) -> None:
        """Stop both threads and drop the connection (done when the exec's reader leaves)."""
        self._stopped = True
        if self._feeder is not None:
            self._feeder.cancel()
        self._pieces.put(None)
        self._slots.release()
        if self.conn is not None:  # else the reader sees `_stopped` once it has started
            self.conn.shutdown()


class _DockerPty(PtyChannel):
    """A terminal: an exec with Tty=true on its hijacked connection (raw bytes both ways, no
    frames). Its output is read by a thread of its own into a queue (as _ExecPump does);
    writes go in order on a worker thread; the exec carries a mark, so `close` kills what it
    started."""

    def __init__(self, adapter: DockerAdapter, ref: str, exec_id: str, conn: _ExecSocket,
                 mark: str) -> None:
        self._adapter, self._ref, self._exec_id, self._mark = adapter, ref, exec_id, mark
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._out: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self._writing = asyncio.Lock()
        self._ended = False
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="sbx-pty-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while data := self._conn.read_raw():
                self._soon(data)
        except Exception as exc:  # noqa: BLE001 (handed to the reader, raised there)
            self._soon(exc)
        self._soon(None)

    def _soon(self, item: bytes | BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(self._out.put_nowait, item)

    async def read(self) -> bytes:
        if self._ended:
            return b""
        item = await self._out.get()
        if isinstance(item, BaseException):
            item = None
        if item is None:
            self._ended = True
            self._conn.close()
            with contextlib.suppress(Exception):
                self.exit_code = await self._adapter._exit_code(self._exec_id)
                if self.exit_code < 0:  # the engine never said (the container went)
                    self.exit_code = None
            return b""
        return item

    async def write(self, data: bytes) -> None:
        if self._ended or self._closed:
            return
        async with self._writing:  # one at a time, in order
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._conn.write, data)

    async def resize(self, cols: int, rows: int) -> None:
        exec_id = self._exec_id
        with contextlib.suppress(docker_errors.APIError):  # it ended meanwhile
            await self._adapter._call(lambda api: api.exec_resize(exec_id, height=rows,
                                                                  width=cols))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._ended:
            with contextlib.suppress(Exception):
                await self._adapter._kill_exec(self._ref, self._exec_id, self._mark)
        self._conn.shutdown()  # the reader thread sees the end


# The engine's archive API: its tar stream is passed on in pieces of this size.
ARCHIVE_CHUNK = 1024 * 1024
ARCHIVE_AHEAD = 4  # pieces read ahead of their reader (get_archive)
PATH_STAT_HEADER = "X-Docker-Container-Path-Stat"
# mounts of every container that the archive API does not see into (and tmpfs mounts)
ARCHIVE_BLIND = ("/dev", "/proc", "/sys")
TRAITS_KEPT = 1024  # containers whose traits (DockerAdapter._archive_reaches) are remembered
# Go's os.FileMode type bits, as the engine's path stat gives them
_GO_DIR, _GO_SYMLINK = 1 << 31, 1 << 27
_GO_OTHER = (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)  # devices, pipes, sockets
_GO_SPECIAL = ((1 << 23, 0o4000), (1 << 22, 0o2000), (1 << 20, 0o1000))  # setuid, setgid, sticky


def _path_stat(api: docker.APIClient, ref: str, path: str) -> dict[str, Any]:
    """`HEAD /containers/REF/archive?path=`: the path's stat, from a header (base64 JSON)."""
    response = api.head(api._url("/containers/{0}/archive", ref), params={"path": path})
    api._raise_for_status(response)
    header = response.headers.get(PATH_STAT_HEADER)
    if not header:
        raise AdapterError(f"the Docker engine gave no stat for {path}")
    return json.loads(base64.b64decode(header))


def _file_info(path: str, found: Mapping[str, Any]) -> FileInfo:
    mode = int(found.get("mode") or 0)
    kind = ("symlink" if mode & _GO_SYMLINK else "dir" if mode & _GO_DIR
            else "other" if mode & _GO_OTHER else "file")
    bits = mode & 0o777
    for go, unix in _GO_SPECIAL:
        if mode & go:
            bits |= unix
    return FileInfo(path=path, name=posixpath.basename(path) or "/", type=kind,
                    size=int(found.get("size") or 0), mode=bits,
                    mtime=_go_time(found.get("mtime")),
                    target=(found.get("linkTarget") or None) if kind == "symlink" else None)


def _go_time(text: str | None) -> datetime:
    """A Go RFC 3339 time (nanoseconds, `Z` or an offset) as an aware UTC datetime."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?",
                         text or "")
    if match is None:
        return datetime.fromtimestamp(0, UTC)
    whole, fraction, zone = match.groups()
    offset = "+00:00" if zone in (None, "Z") else zone
    return datetime.fromisoformat(f"{whole}.{(fraction or '0')[:6]:0<6}{offset}").astimezone(UTC)



def _leaves_it_as_it_was(event: Mapping[str, Any]) -> bool:
    """An engine event of QUIET_ACTIONS ("exec_start: sh -c ..." names its command after
    the action)."""
    return (event.get("Type") == "container"
            and str(event.get("Action") or "").startswith(QUIET_ACTIONS))

class DockerAdapter(Adapter):
    name = "docker"
    description = "containers on a Docker engine (local socket or DOCKER_HOST)"
    capabilities = frozenset({Capability.EXEC, Capability.LOGS, Capability.METRICS,
                              Capability.PAUSE, Capability.SNAPSHOT, Capability.SERVICES,
                              Capability.READ_ONLY_ROOT, Capability.RUN_AS_USER,
                              Capability.FILES, Capability.PROCESSES, Capability.PTY,
                              Capability.PORTS, Capability.VOLUMES,
                              Capability.ISOLATION_GVISOR})

    def supports(self, capability: Capability) -> bool:
        if capability == Capability.MEMORY_CHECKPOINT:
            return self._criu_works()
        if capability == Capability.SHELL:  # through the docker CLI, when installed
            return self._docker_cli() is not None
        return super().supports(capability)

    def _criu_works(self) -> bool:
        """Memory checkpoints need an experimental daemon and a working CRIU: detect both."""
        import shutil

        try:
            if not self._client().info().get("ExperimentalBuild"):
                return False
        except Exception:
            return False
        criu = shutil.which("criu")
        return bool(criu) and subprocess.run([criu, "check"], capture_output=True).returncode == 0

    def __init__(self, base_url: str | None = None, timeout: float = 60) -> None:
        self.base_url = base_url or engine_url()
        self.timeout = timeout
        self._api: docker.APIClient | None = None
        self._making_client = threading.Lock()  # calls arriving at once make one client
        self._client_tries = 0  # attempts to make it that ended, and how the last one failed
        self._client_failure: BackendUnavailable | None = None
        self._pinged_at: float | None = None  # when the engine last answered a ping
        self._engine_id: str | None = None
        self._has_runsc = False  # the engine listed the runsc runtime (isolation: gvisor)
        # by container: (writes must not go as root, mounts the archive API does not see)
        self._traits: dict[str, tuple[bool, tuple[str, ...]]] = {}

    # -- plumbing ---------------------------------------------------------------------------

    def _client(self) -> docker.APIClient:
        """A client speaking the engine's own API version, learnt from one unversioned
        `/_ping` (what `docker version="auto"` learns from the slower `/version`). Made once,
        by the first of the calls that arrive at once (a reaper's ten destroys); when that
        attempt fails, the calls that waited for it fail with it, rather than each trying
        again in turn (an engine that never answers would hold the tenth for ten timeouts)."""
        if self._api is not None:
            return self._api
        tries = self._client_tries
        with self._making_client:
            if self._api is not None:
                return self._api
            if self._client_tries != tries and self._client_failure is not None:
                raise BackendUnavailable(str(self._client_failure))  # one ended meanwhile
            self._client_failure = None  # set by this attempt when it fails
            try:
                return self._make_client()
            finally:
                self._client_tries += 1

    def _make_client(self) -> docker.APIClient:
        """_client's one attempt, under its lock."""
        if self.base_url.startswith("ssh://"):
            _ssh_transport()
        tls = engine_tls(self.base_url)
        try:
            api = docker.APIClient(base_url=self.base_url, timeout=self.timeout,
                                   tls=tls or False,
                                   version=docker.constants.MINIMUM_DOCKER_API_VERSION,
                                   # ssh://user@host goes through paramiko, which reads
                                   # ~/.ssh/config and known_hosts. (docker-py's system-ssh
                                   # mode breaks pipes when exec streams close.)
                                   use_ssh_client=False,
                                   max_pool_size=ENGINE_CONNECTIONS)
            if tls is not None and tls.verify and tls.ca_cert:
                _keep_engine_ca(api)
            response = api._get(api.base_url + "/_ping")
            response.raise_for_status()
            api._version = response.headers.get("Api-Version") or api._version
        except (docker_errors.DockerException, OSError) as exc:  # refused, no socket...
            self._client_failure = self._unreachable(exc)
            raise self._client_failure from exc
        self._api, self._pinged_at = api, time.monotonic()
        return self._api

    async def _call(self, fn: Callable[[docker.APIClient], Any]) -> Any:
        return await asyncio.to_thread(self._engine_call, fn)

    def _engine_call(self, fn: Callable[[docker.APIClient], Any]) -> Any:
        """`fn(client)` on this thread: an answer notes the engine as reachable; no answer
        is BackendUnavailable saying where and why."""
        try:
            api = self._client()
            result = fn(api)
            self._pinged_at = time.monotonic()  # it answered: as good as a ping
            return result
        except docker_errors.APIError:  # the engine answered: the caller decides
            self._pinged_at = time.monotonic()
            raise
        except (docker_errors.DockerException, OSError) as exc:  # refused, socket gone
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: BaseException) -> BackendUnavailable:
        """The engine did not answer: where, why in plain words, and what to do."""
        return BackendUnavailable(f"Docker engine unreachable at {self.base_url}: "
                                  f"{_why_unreachable(exc)}; {START_HINT}")

    @staticmethod
    def _object(info: Mapping[str, Any]) -> BackendObject:
        if "Config" in info:  # inspect
            state = info.get("State", {})
            return BackendObject(
                ref=info["Id"], labels=info["Config"].get("Labels") or {},
                status=state.get("Status", "unknown"), running=bool(state.get("Running")),
                created_at=_parse_time(info.get("Created")), restarted_at=_restarted_at(state),
            )
        created = info.get("Created")
        return BackendObject(  # list entry
            ref=info["Id"], labels=info.get("Labels") or {}, status=info.get("State", "unknown"),
            running=info.get("State") == "running",
            created_at=datetime.fromtimestamp(created, UTC) if created else None,
        )

    # -- contract ---------------------------------------------------------------------------

    async def health(self) -> Health:
        try:
            version = await self._call(lambda api: api.version())
        except AdapterError as exc:
            return Health(False, True, str(exc))
        except Exception as exc:
            return Health(False, True, f"Docker engine at {self.base_url}: {_short(exc)}")
        return Health(True, True, f"Docker {version.get('Version')} at {self.base_url}")

    async def ensure_available(self) -> None:
        """Pings, unless the engine answered this past second (a ping, making the client,
        or any call): then there is nothing to ask, nor a thread to hop to."""
        if not self._answered_lately():
            made = self._api is None  # making the client is a ping (/_ping): not a second one
            await self._call(lambda api: None if made else api.ping())  # _call notes it

    def _answered_lately(self) -> bool:
        return self._pinged_at is not None and time.monotonic() - self._pinged_at < PING_FRESH_S

    async def instance_id(self) -> str | None:
        """The engine's own ID (`docker info`, asked once by each adapter), so a DOCKER_HOST
        that reaches another engine cannot mistake this one's containers for gone."""
        return await self._asked_engine_id() or None

    async def _asked_engine_id(self) -> str:
        """The engine's ID ("" when it gives none), asked once by this adapter; adapters of
        one engine asking at the same time (the docker and compose backends, in a reaper's
        look) share one `docker info`, dockerd's slowest answer after an image listing."""
        if self._engine_id is None:
            self._engine_id = await _asked_once(
                (self.base_url, "info"),
                lambda: self._call(lambda api: api.info().get("ID") or ""))
        return self._engine_id

    async def change_marker(self, labels: Mapping[str, str], since: float) -> str | None:
        """The engine's ID while its event log holds nothing about containers carrying
        `labels` since `since`; a fresh value when it does, or when that log may have lost
        some (the engine keeps its last 256 events: more than ENGINE_EVENTS_TRUSTED since
        `since` is not trusted). None for an engine reached over the network, whose clock may
        not be this host's. An engine restart empties its log: the reaper's periodic full
        reconcile (SBX_RECONCILE_EVERY) is what notices sandboxes stopped by one."""
        if not self.base_url.startswith("unix://"):
            return None
        wanted = frozenset(dict(labels).items())

        def ask(api: docker.APIClient) -> tuple[int, bool]:
            until = f"{time.time():.9f}"  # the API's seconds.nanoseconds
            found = list(api.events(since=f"{since:.9f}", until=until, decode=True))
            ours = any(wanted <= (((e.get("Actor") or {}).get("Attributes")) or {}).items()
                       and not _leaves_it_as_it_was(e) for e in found)
            return len(found), ours

        # the events and the ID asked at once; the same question asked meanwhile by another
        # adapter of this engine (a compose backend's) is asked once
        events, engine = await asyncio.gather(
            _asked_once((self.base_url, "events", wanted, since), lambda: self._call(ask)),
            self._asked_engine_id(), return_exceptions=True)
        for answer in (events, engine):  # both awaited: a failure of each is seen
            if isinstance(answer, BaseException):
                raise answer
        seen, ours = events
        if ours or seen > ENGINE_EVENTS_TRUSTED:
            return f"changed:{uuid.uuid4().hex}"
        return f"engine:{engine}"

    async def ensure_isolation(self, isolation: str) -> None:
        """`gvisor` needs the engine's `runsc` runtime (`docker info` Runtimes), asked each
        time until it is there: `make gvisor` may register it while sbx runs."""
        if isolation == "gvisor" and not self._has_runsc:
            runtimes = (await self._call(lambda api: api.info())).get("Runtimes") or {}
            if GVISOR_RUNTIME not in runtimes:
                raise BackendUnavailable(gvisor_missing(self.base_url))
            self._has_runsc = True

    def validate(self, request: CreateRequest) -> None:
        if request.network == "full" and not request.labels.get(LABEL_INSTALL):
            raise InvalidRequest(f"network mode 'full' needs the {LABEL_INSTALL} label, "
                                 "which names the installation's bridge")
        if request.network == "egress":
            raise CapabilityNotSupported(
                "the docker backend cannot restrict egress (network mode 'egress'); use "
                "'none' or 'full'"
            )
        if request.resources.disk_bytes is not None:
            raise CapabilityNotSupported("the docker backend cannot limit disk (resources.disk)")
        if request.resources.gpu is not None:
            raise CapabilityNotSupported("the docker backend offers no GPU (resources.gpu)")
        if request.options:
            raise CapabilityNotSupported(
                f"the docker backend has no options (got {', '.join(sorted(request.options))})")
        if request.ports and request.network == "none":  # published ports: a bridge network
            raise InvalidRequest(f"ports {list(request.ports)} cannot be published with network "
                                 "mode 'none'; use network mode 'full'")

    async def create(self, request: CreateRequest) -> BackendObject:
        return await self._create(request)

    async def _create(self, request: CreateRequest, *,
                      checkpoint_image: bool = False) -> BackendObject:
        image = request.image or BASE_IMAGE
        limits = request.resources

        def host_config(api: docker.APIClient, network_mode: str,
                        **hardening: Any) -> dict[str, Any]:
            return api.create_host_config(
                network_mode=network_mode,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit=limits.memory_bytes,
                memswap_limit=limits.memory_bytes,  # no swap beyond the memory limit
                nano_cpus=int(limits.cpu * 1e9) if limits.cpu else None,
                pids_limit=limits.pids,
                init=False,
                # isolation: gvisor, its services too; ensure_isolation saw the runtime
                runtime=GVISOR_RUNTIME if request.isolation == "gvisor" else None,
                **hardening,
                restart_policy=RESTART_POLICY,
            )

        def make(api: docker.APIClient) -> str:
            if request.network == "none":
                mode = "none"
            else:  # "full"
                mode = own_bridge(api, request.labels[LABEL_INSTALL])
            hardening = {"read_only": True, "tmpfs": READ_ONLY_TMPFS} if request.read_only else {}
            if request.ports:  # each on publish_address, the host port the engine's choice
                hardening["port_bindings"] = {port: (request.publish_address,)
                                              for port in request.ports}
            if request.mounts:  # named volumes (docs/volumes.md)
                hardening["mounts"] = _volume_mounts(request.mounts)
            spec = dict(
                image=image, command=list(request.command or KEEPALIVE), name=request.sandbox_id,
                labels=dict(request.labels), environment=dict(request.env),
                host_config=host_config(api, mode, **hardening), detach=True,
                user=request.user, ports=list(request.ports) or None,
            )
            try:
                created = api.create_container(**spec)
            except docker_errors.ImageNotFound:
                if checkpoint_image:  # never pulled: a registry's image of that name is not it
                    raise BackendObjectGone(
                        f"checkpoint {_checkpoint_named(image)} is lost: its image {image} is "
                        "no longer on the Docker engine") from None
                self._provide_image(api, image)
                created = api.create_container(**spec)
            container_id = created["Id"]
            try:
                api.start(container_id)
                for service in request.services:
                    start_service(api, container_id, service)
            except BaseException:
                for made in _pod_members(api, container_id):
                    _remove_quietly(api, made)
                _remove_quietly(api, container_id)
                raise
            return container_id

        def start_service(api: docker.APIClient, pod: str, service: ServiceSpec) -> None:
            """Beside the main container, in its network namespace: localhost reaches it,
            and it has no network the main container does not have."""
            spec = dict(image=service.image, command=list(service.command or KEEPALIVE),
                        name=f"{request.sandbox_id}-{service.name}",
                        labels={**request.labels, LABEL_SERVICE: service.name, LABEL_POD: pod},
                        environment=dict(service.env),
                        host_config=host_config(api, f"container:{pod}"), detach=True)
            try:
                made = api.create_container(**spec)
            except docker_errors.ImageNotFound:
                self._provide_image(api, service.image)
                made = api.create_container(**spec)
            api.start(made["Id"])

        try:
            container_id = await self._call(make)
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker refused to create the container: {_short(exc)}") from exc
        return BackendObject(ref=container_id, labels=dict(request.labels), status="running",
                             running=True)

    @staticmethod
    def _provide_image(api: docker.APIClient, image: str) -> None:
        if image == BASE_IMAGE:
            build_base_image(api)
            return
        try:
            api.pull(image)
        except docker_errors.APIError as exc:
            raise AdapterError(f"image {image!r} is not on the engine and cannot be pulled: "
                               f"{_short(exc)}") from exc

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        """`services=False` (the core knows the sandbox was made without any): no looking
        for them, which is a container listing as long as the removal's own call."""
        def remove(api: docker.APIClient) -> None:
            for member in _pod_members(api, ref) if services else ():  # services first
                remove_one(api, member)
            remove_one(api, ref)

        def remove_one(api: docker.APIClient, ref: str) -> None:
            deadline = time.monotonic() + 30
            while True:
                try:
                    api.remove_container(ref, force=True, v=True)
                    return
                except docker_errors.NotFound:
                    return  # already gone: success
                except docker_errors.APIError as exc:
                    # "removal ... already in progress" (409): wait for the other remover
                    if exc.status_code != 409 or time.monotonic() > deadline:
                        raise AdapterError(f"docker refused to remove {ref[:12]}: {_short(exc)}") from exc
                    time.sleep(0.2)

        await self._call(remove)

    async def get(self, ref: str) -> BackendObject | None:
        try:
            return self._object(await self._call(lambda api: api.inspect_container(ref)))
        except docker_errors.NotFound:
            return None

    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        """The sandboxes' main containers. A service container stands for its sandbox only
        when its main container is gone, so that reconcile removes it rather than leak it.
        (A service carries every label of its main container, so a filter that finds a
        service finds its main one too, while it exists.)"""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}

        def listing(api: docker.APIClient) -> tuple[list[dict], dict[str, datetime]]:
            found = [info for info in api.containers(all=True, filters=filters)
                     if LABEL_COMPOSE not in (info.get("Labels") or {})]  # the compose backend's
            restarted = {}
            for info in found:  # inspected only when the listing says it was started again
                main = LABEL_POD not in (info.get("Labels") or {})
                if main and info.get("State") == "running" and _maybe_restarted(info, time.time()):
                    with contextlib.suppress(docker_errors.NotFound):
                        at = _restarted_at(api.inspect_container(info["Id"]).get("State", {}))
                        if at is not None:
                            restarted[info["Id"]] = at
            return found, restarted

        found, restarted = await self._call(listing)
        ids = {info["Id"] for info in found}
        objects = []
        for info in found:
            pod = (info.get("Labels") or {}).get(LABEL_POD)
            if pod is None:
                objects.append(replace(self._object(info), restarted_at=restarted.get(info["Id"])))
            elif pod not in ids:  # its sandbox is gone: never report it as a live sandbox
                objects.append(dataclasses.replace(self._object(info), status="exited",
                                                   running=False))
        return objects

    async def exec(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                   user: str | None = None, stdin: Stdin = None) -> ExecResult:
        out, err = bytearray(), bytearray()
        async for item in self._exec(ref, argv, timeout_s, env, cwd, user, stdin):
            if isinstance(item, ExecResult):
                return replace(item, stdout=bytes(out), stderr=bytes(err))
            (out if item[0] == "stdout" else err).extend(item[1])
        raise AdapterError("docker exec ended without a result")  # never: _exec ends with one

    async def exec_stream(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                          env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                          user: str | None = None, stdin: Stdin = None,
                          ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        async for item in self._exec(ref, argv, timeout_s, env, cwd, user, stdin):
            yield item

    async def _exec(self, ref: str, argv: Sequence[str], timeout_s: float | None,
                    env: Mapping[str, str] | None, cwd: str | None, user: str | None,
                    stdin: Stdin) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """One exec on its hijacked connection (`exec_start(socket=True)`): stdin streamed in
        while stdout and stderr stream out, then the ExecResult (its outputs empty). On the
        deadline the exec's whole process tree is killed, what it wrote until then is still
        given, and the result (exit 124) comes within EXEC_TIMEOUT_RETURN_S of the deadline."""
        if stdin is not None and self._over_tls():
            raise CapabilityNotSupported(
                "the docker backend cannot send stdin to a command over a TLS connection to "
                "the engine (Python cannot half-close it to end the stdin)")
        started = time.perf_counter()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        mark, environment = _marked(env, timeout_s)

        def start(api: docker.APIClient) -> tuple[str, Any]:
            exec_id = api.exec_create(ref, list(argv), stdout=True, stderr=True,
                                      stdin=stdin is not None, environment=environment,
                                      workdir=cwd, user=user or "")["Id"]
            return exec_id, api.exec_start(exec_id, socket=True)

        def start_failed(exc: BaseException) -> BaseException:
            if isinstance(exc, docker_errors.NotFound):
                return BackendObjectGone(f"container {ref[:12]} is gone")
            if isinstance(exc, docker_errors.APIError):
                if exc.status_code == 409:
                    return BackendObjectGone(f"container {ref[:12]} is not running")
                return AdapterError(f"docker exec failed: {_short(exc)}")
            return exc

        # created and started on the reader's thread; without a deadline, the exit code is
        # asked for there too as the output ends (with one, a timed-out exec's end must not
        # wait on it)
        pump = _ExecPump(lambda: self._engine_call(start), asyncio.get_running_loop(), stdin,
                         finish=None if deadline is not None else self._exit_code_now,
                         start_failed=start_failed)
        held: bytes | None = None  # a first line that may be the engine's own start failure
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                try:
                    if left is not None and left <= 0:
                        raise TimeoutError
                    item = await asyncio.wait_for(pump.get(), left)
                except TimeoutError:
                    if held is not None:
                        yield "stdout", held
                    async for item in self._time_out(ref, pump.exec_id, mark, user, pump,
                                                     deadline or 0.0, timeout_s or 0.0,
                                                     started):
                        yield item
                    return
                if item is None:
                    break
                stream, data = item
                if pump.reads == 1 and stream == "stdout" and data.startswith(START_FAILURES):
                    held = data
                    continue
                if held is not None:
                    yield "stdout", held
                    held = None
                yield stream, data
            if pump.finish_error is not None:
                error = pump.finish_error
                if isinstance(error, docker_errors.APIError):
                    raise AdapterError(f"docker exec failed: {_short(error)}") from error
                if isinstance(error, (docker_errors.DockerException, OSError)):
                    raise self._unreachable(error) from error
                raise error
            code = pump.finished if pump.finished is not None else \
                await self._exit_code(pump.exec_id)
            if held is not None:
                failure = _start_failure(held, cwd, user) if code == 126 else None
                if failure is not None:
                    raise failure
                yield "stdout", held
            yield ExecResult(code, b"", b"", time.perf_counter() - started)
        finally:
            pump.abort()

    async def open_pty(self, ref: str, argv: Sequence[str], *, cols: int = 80, rows: int = 24,
                       env: Mapping[str, str] | None = None, cwd: str | None = None,
                       ) -> PtyChannel:
        """`docker exec -it`: an exec with Tty=true and stdin attached, on its hijacked
        connection; sized by the exec resize endpoint once started."""
        mark = uuid.uuid4().hex  # so that close ends what the terminal started
        environment = {"TERM": "xterm-256color", **(env or {}), EXEC_MARK: mark}

        def start(api: docker.APIClient) -> tuple[str, Any]:
            exec_id = api.exec_create(ref, list(argv), stdout=True, stderr=True, stdin=True,
                                      tty=True, environment=environment, workdir=cwd)["Id"]
            sock = api.exec_start(exec_id, socket=True, tty=True)
            with contextlib.suppress(docker_errors.APIError):
                api.exec_resize(exec_id, height=rows, width=cols)
            return exec_id, sock

        try:
            exec_id, sock = await self._call(start)
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"container {ref[:12]} is gone") from exc
        except docker_errors.APIError as exc:
            if exc.status_code == 409:
                raise BackendObjectGone(f"container {ref[:12]} is not running") from exc
            raise AdapterError(f"docker exec failed: {_short(exc)}") from exc
        return _DockerPty(self, ref, exec_id, _ExecSocket(sock), mark)

    def _over_tls(self) -> bool:
        return self.base_url.startswith(NETWORK_SCHEMES) and engine_tls(self.base_url) is not None

    async def _time_out(self, ref: str, exec_id: str, mark: str | None, user: str | None,
                        pump: _ExecPump, deadline: float, timeout_s: float, started: float,
                        ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """Past the deadline: kill the exec's processes while still passing on what they
        wrote, until its stream ends or EXEC_TIMEOUT_RETURN_S after the deadline."""
        killing = asyncio.ensure_future(self._kill_exec(ref, exec_id, mark, user))
        until = deadline + EXEC_TIMEOUT_RETURN_S
        ended = False
        while (left := until - time.monotonic()) > 0:
            try:
                item = await asyncio.wait_for(pump.get(), left)
            except TimeoutError:
                break
            if item is None:
                ended = True  # every process holding its output is gone
                break
            yield item
        if not killing.done():
            await asyncio.wait({killing}, timeout=max(0.0, until - time.monotonic()))
        if killing.done():
            killed = ended or (not killing.cancelled() and killing.exception() is None
                               and killing.result())
        else:  # it finishes on its own; the caller is not kept waiting
            killed = ended
            _BACKGROUND.add(killing)
            killing.add_done_callback(_BACKGROUND.discard)
        note = "" if killed else " (the process may still run inside the sandbox)"
        yield "stderr", f"sbx: timed out after {timeout_s:g}s{note}\n".encode()
        yield ExecResult(124, b"", b"", time.perf_counter() - started, timed_out=True)

    def _exit_code_now(self, exec_id: str, api: docker.APIClient | None = None) -> int:
        """The exec's exit code, on the calling thread. Its stream can end a moment before
        the engine has it."""
        api = api or self._client()
        give_up = time.monotonic() + EXIT_CODE_WAIT_S
        pause = 0.0005  # the engine usually has it within a millisecond or two
        while True:
            info = api.exec_inspect(exec_id)
            code = info.get("ExitCode")
            if code is not None and not info.get("Running"):
                return int(code)
            if time.monotonic() > give_up:
                return -1
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    async def _exit_code(self, exec_id: str) -> int:
        """The exec's exit code. Its stream can end a moment before the engine has it."""
        try:
            return await self._call(lambda api: self._exit_code_now(exec_id, api))
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker exec failed: {_short(exc)}") from exc

    async def _kill_exec(self, ref: str, exec_id: str | None, mark: str | None,
                         user: str | None = None) -> bool:
        """Kill a timed-out exec and everything it started: every process of the container
        whose environment carries the exec's mark, killed from inside the container (as the
        exec's user: with every capability dropped, only it may). Without the mark (or a
        shell in the image) the exec's own process is killed from this host, once /proc
        shows it is a process of this container: the engine reports its pid as the engine
        sees it, a pid of this host only when the engine runs here, natively."""
        if not exec_id:
            return False
        if mark is not None and await self._kill_marked(ref, mark, user):
            return True
        try:
            info = await self._call(lambda api: api.exec_inspect(exec_id))
        except (AdapterError, docker_errors.APIError):
            return False
        if not info.get("Running", True):
            return True  # it ended on its own meanwhile
        container = info.get("ContainerID") or ref
        pid = info.get("Pid")
        return isinstance(pid, int) and pid > 0 and kill_if_in_container(pid, container)

    async def _kill_marked(self, ref: str, mark: str, user: str | None = None) -> bool:
        """`kill -KILL` inside the container, of every process whose environment carries
        the exec's mark (the exec's process and what it started), pass after pass until a
        pass finds none (a process forked during one is found by the next). Needs a shell,
        `tr` and `grep` in the image (the base image has them)."""
        def kill(api: docker.APIClient) -> bool:
            killer = api.exec_create(ref, ["sh", "-c", KILL_MARKED, mark, EXEC_MARK],
                                     stdout=True, stderr=True, user=user or "")["Id"]
            api.exec_start(killer)
            return api.exec_inspect(killer).get("ExitCode") == 0

        try:
            return bool(await self._call(kill))
        except (AdapterError, docker_errors.APIError):
            return False

    # -- files: the engine's archive API (`docker cp`'s) ---------------------------------------

    async def put_archive(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> None:
        """Streamed into the engine as the request's body (chunked), never held whole; the
        folder `path` is made first, with its parents, when missing. What is unpacked
        belongs to the sandbox's user (`copyUIDGID`), as a file the command writes does."""
        path = posixpath.normpath(path)
        if not await self._archive_reaches(ref, path, write=True):
            await super().put_archive(ref, path, tar)
            return
        await self._make_folders(ref, path)
        loop = asyncio.get_running_loop()
        pieces: queue.SimpleQueue[bytes | BaseException | None] = queue.SimpleQueue()
        room = asyncio.Semaphore(ARCHIVE_AHEAD)
        stopped = False

        async def feed() -> None:
            # the caller's chunks (64 KiB each from a service's request body, say) gathered
            # into pieces of about ARCHIVE_CHUNK, up to ARCHIVE_AHEAD ahead of the sending
            # thread: one hop a piece, and the next ones read while one is sent
            held: list[bytes] = []
            size = 0
            try:
                async for chunk in tar:
                    if chunk:
                        held.append(chunk)
                        size += len(chunk)
                    if size >= ARCHIVE_CHUNK:
                        await room.acquire()
                        if stopped:
                            return
                        pieces.put(b"".join(held))
                        held, size = [], 0
                if held:
                    pieces.put(b"".join(held))
                pieces.put(None)
            except BaseException as exc:  # handed to the sending thread, raised there
                pieces.put(exc)
                if not isinstance(exc, Exception):
                    raise

        def free() -> None:
            room.release()

        def body() -> Iterator[bytes]:
            while (piece := pieces.get()) is not None:
                if isinstance(piece, BaseException):
                    raise piece
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody feeds
                    loop.call_soon_threadsafe(free)
                yield piece

        def put(api: docker.APIClient) -> None:
            response = api._put(api._url("/containers/{0}/archive", ref), data=body(),
                                params={"path": path, "copyUIDGID": "1"})
            api._raise_for_status(response)

        feeder = loop.create_task(feed())
        try:
            await self._on_path(ref, path, put, "write to")
        finally:
            stopped = True
            room.release()  # a feeder waiting for room sees it is over
            if not feeder.done():  # the engine answered before the body's end: a refusal
                feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)  # its end, not ours

    async def get_archive(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """The engine's tar of `path` (one top entry, its base name), passed on as it comes."""
        path = posixpath.normpath(path)
        if not await self._archive_reaches(ref, path, write=False):
            async for chunk in super().get_archive(ref, path):
                yield chunk
            return

        def start(api: docker.APIClient) -> Any:
            response = api._get(api._url("/containers/{0}/archive", ref),
                                params={"path": path}, stream=True,
                                headers={"Accept-Encoding": "identity"})  # not gzipped
            api._raise_for_status(response)
            return response

        response = await self._on_path(ref, path, start, "read")
        try:
            # the raw body read in pieces of a MiB (iter_content gives the engine's 32 KiB
            # HTTP chunks, a hop each), ahead of the reader so the engine's tar and the
            # unpacking overlap
            reader = _read_ahead(response.raw.read)
            try:
                async for chunk in reader:
                    yield chunk
            finally:
                await reader.aclose()  # its thread stops now, not when this is collected
        finally:
            await asyncio.to_thread(response.close)

    async def stat_file(self, ref: str, path: str) -> FileInfo | None:
        """From the engine's `HEAD /archive` (what `docker cp` reads): no command runs, so
        it works in an image without a shell. A symbolic link is not followed."""
        path = posixpath.normpath(path)
        if not await self._archive_reaches(ref, path, write=False):
            return await super().stat_file(ref, path)
        try:
            found = await self._on_path(ref, path, lambda api: _path_stat(api, ref, path),
                                        "look at")
        except NoSuchPath:
            return None
        info = _file_info(path, found)
        if info.type == "symlink":  # the engine gives where it leads, resolved, not the link
            return await super().stat_file(ref, path)
        return info

    async def _make_folders(self, ref: str, path: str) -> None:
        """Make the folder `path` and its missing parents (a tar of the missing folders,
        unpacked into the deepest one that exists); InvalidRequest when it is not a folder."""
        missing: list[str] = []
        at = path
        while True:
            found = await self.stat_file(ref, at)
            if found is not None:
                break
            missing.append(posixpath.basename(at))
            at = posixpath.dirname(at)
        if found.type not in ("dir", "symlink"):  # a link: the engine follows it, or refuses
            raise InvalidRequest(f"{at} is not a folder in the sandbox")
        if not missing:
            return
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as folders:
            for depth in range(len(missing), 0, -1):
                info = tarfile.TarInfo("/".join(reversed(missing[depth - 1:])))
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
                folders.addfile(info)

        def put(api: docker.APIClient) -> None:
            response = api._put(api._url("/containers/{0}/archive", ref), data=buf.getvalue(),
                                params={"path": at, "copyUIDGID": "1"})
            api._raise_for_status(response)

        await self._on_path(ref, at, put, "write to")

    async def _archive_reaches(self, ref: str, path: str, *, write: bool) -> bool:
        """Whether the engine's archive API reaches `path` as a command in the sandbox
        would. It sees the root filesystem and volumes, not tmpfs mounts (the /tmp of a
        read-only sandbox) nor /dev, /proc and /sys; and it writes as root, past a read-only
        root. There the base's defaults (`tar` run in the sandbox, as its user) serve."""
        traits = self._traits.get(ref)
        if traits is None:
            try:
                info = await self._call(lambda api: api.inspect_container(ref))
            except docker_errors.NotFound as exc:
                raise BackendObjectGone(f"container {ref[:12]} is gone") from exc
            host = info.get("HostConfig") or {}
            mounts = [*ARCHIVE_BLIND, *(host.get("Tmpfs") or {}),
                      *(m.get("Destination", "") for m in info.get("Mounts") or []
                        if m.get("Type") == "tmpfs")]
            if host.get("Runtime") == GVISOR_RUNTIME:  # gVisor has a /tmp of its own and
                mounts = ["/"]  # caches the root: the sandbox's tar serves every path
            traits = (bool((info.get("Config") or {}).get("User") or host.get("ReadonlyRootfs")),
                      tuple(m.rstrip("/") for m in mounts if m))
            if len(self._traits) >= TRAITS_KEPT:
                self._traits.pop(next(iter(self._traits)))
            self._traits[ref] = traits
        not_as_root, blind = traits
        if write and not_as_root:
            return False
        return not any(path == m or path.startswith(m + "/") for m in blind)

    async def _container_exists(self, ref: str) -> bool:
        try:
            await self._call(lambda api: api.inspect_container(ref))
        except docker_errors.NotFound:
            return False
        return True

    async def _on_path(self, ref: str, path: str, fn: Callable[[docker.APIClient], Any],
                       verb: str) -> Any:
        """`fn` on the container's archive API, its refusals said in sbx's terms: a missing
        path NoSuchPath, a missing container BackendObjectGone."""
        try:
            return await self._call(fn)
        except docker_errors.NotFound as exc:
            if not await self._container_exists(ref):  # a HEAD's 404 does not say which
                raise BackendObjectGone(f"container {ref[:12]} is gone") from exc
            raise NoSuchPath(f"{path} does not exist in the sandbox") from exc
        except docker_errors.APIError as exc:
            if exc.status_code == 400:
                raise InvalidRequest(f"cannot {verb} {path} in the sandbox: "
                                     f"{_short(exc)}") from exc
            raise AdapterError(f"docker could not {verb} {path} in the sandbox: "
                               f"{_short(exc)}") from exc

    async def logs(self, ref: str, follow: bool = False,
                   tail: int | None = None) -> AsyncIterator[bytes]:
        def open_stream(api: docker.APIClient) -> Iterator[bytes]:
            return api.logs(ref, stream=True, follow=follow, stdout=True, stderr=True,
                            tail="all" if tail is None else tail)

        try:
            stream = await self._call(open_stream)
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"container {ref[:12]} is gone") from exc
        async for chunk in _in_thread(stream):
            yield chunk

    async def pause(self, ref: str) -> None:
        def pause(api: docker.APIClient) -> None:
            api.pause(ref)
            for member in _pod_members(api, ref):
                api.pause(member)
            _until_paused_is(api, ref, True)

        await self._on_container(ref, pause, "pause")

    async def resume(self, ref: str) -> None:
        def resume(api: docker.APIClient) -> None:
            for member in _pod_members(api, ref):
                api.unpause(member)
            api.unpause(ref)
            _until_paused_is(api, ref, False)

        await self._on_container(ref, resume, "resume")

    async def _on_container(self, ref: str, fn: Callable[[docker.APIClient], Any], verb: str) -> Any:
        try:
            return await self._call(fn)
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"container {ref[:12]} is gone") from exc
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not {verb} {ref[:12]}: {_short(exc)}") from exc

    async def snapshot(self, ref: str, labels: Mapping[str, str]) -> Artifact:
        """`docker commit`: the filesystem, not memory or volumes. The image is labelled, and
        tagged for the installation that made it (holder_tag)."""
        changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in labels.items()]
        checkpoint = labels.get(LABEL_CHECKPOINT) or f"sbx-{int(time.time() * 1000)}"
        install = labels.get(LABEL_INSTALL)
        name = holder_tag(checkpoint, install) if install else transport_tag(checkpoint)

        def commit(api: docker.APIClient) -> Artifact:
            # tagged, so removing a checkpoint whose image has children (a checkpoint of a
            # sandbox restored from it) untags it instead of failing
            repository, _, tag = name.rpartition(":")
            api.commit(ref, repository=repository, tag=tag, changes=changes)
            return Artifact(name, dict(labels), api.inspect_image(name).get("Size"))

        return await self._on_container(ref, commit, "snapshot")

    async def restore(self, artifact: str, request: CreateRequest) -> BackendObject:
        """As create, from the checkpoint's image, which is never pulled from a registry: an
        image gone from the engine is BackendObjectGone, naming the checkpoint."""
        return await self._create(replace(request, image=artifact), checkpoint_image=True)

    async def missing_artifacts(self, artifacts: Sequence[str]) -> set[str]:
        def check(api: docker.APIClient) -> set[str]:
            gone = set()
            for ref in set(artifacts):
                try:
                    api.inspect_image(ref)
                except docker_errors.NotFound:
                    gone.add(ref)
            return gone

        try:
            return await self._call(check)
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not look up checkpoint images: {_short(exc)}") from exc

    async def delete_artifact(self, artifact: str) -> None:
        """Let go of a checkpoint's image: untag `artifact`, and remove the image only when no
        other checkpoint tag is left on it (another installation still holds it), as the
        engine says just before. An image id (an image nobody holds, from list_artifacts)
        is removed only while it still has no tag, never forced. Already gone is success."""
        def remove(api: docker.APIClient) -> None:
            for _ in range(3):
                try:
                    info = api.inspect_image(artifact)
                    if artifact.startswith("sha256:"):
                        if not _tags(info):  # tagged since: held again, not ours to remove
                            api.remove_image(artifact)
                        return
                    if [t for t in _checkpoint_tags(info) if t != artifact]:
                        api.remove_image(artifact, noprune=True)  # untagged, nothing more
                    else:
                        api.remove_image(artifact, force=True)  # the last holder
                    return
                except docker_errors.NotFound:
                    return  # already gone: success
                except docker_errors.APIError as exc:
                    # 409: the other holder let go in between, and a container uses the image
                    # (an untag without force is refused then): look again
                    if exc.status_code != 409 or artifact.startswith("sha256:"):
                        raise
            raise AdapterError(f"docker kept refusing to remove image {artifact}")

        try:
            await self._call(remove)
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not remove image {artifact[:71]}: "
                               f"{_short(exc)}") from exc

    async def list_artifacts(self, labels: Mapping[str, str]) -> list[Artifact]:
        """Checkpoint images with `labels`. With `sbx.install`, the artifacts that installation
        holds: its own tags (labelled with the checkpoint each names), and the bare tags of
        checkpoints it made before holder tags; and every untagged checkpoint image that no
        container uses (held=False), which no installation holds any more."""
        install = labels.get(LABEL_INSTALL)
        wanted = {k: v for k, v in labels.items() if k != LABEL_INSTALL or install is None}
        if wanted:
            filters = {"label": [LABEL_CHECKPOINT, *(f"{k}={v}" for k, v in wanted.items())]}
            images = await self._call(lambda api: api.images(filters=filters))
        else:
            images = await self.checkpoint_images()
        loose = install is not None and any(not _tags(i) for i in images)
        used = {c.get("ImageID") for c in await self._call(
            lambda api: api.containers(all=True))} if loose else set()
        found = []
        for info in images:
            marks, size = info.get("Labels") or {}, info.get("Size")
            if install is None:
                if LABEL_COMPOSE not in marks:  # the compose backend's
                    found.append(Artifact(next(iter(_checkpoint_tags(info)), info["Id"]),
                                          marks, size))
                continue
            if not _tags(info):
                if info["Id"] not in used:
                    found.append(Artifact(info["Id"], marks, size, held=False))
                continue
            if LABEL_COMPOSE in marks:
                continue
            for tag in _checkpoint_tags(info):
                checkpoint = _held_by(tag, install)
                if checkpoint is not None:  # made here (its labels), or brought in (ours)
                    own = marks if marks.get(LABEL_INSTALL) == install else {
                        LABEL_INSTALL: install}
                    found.append(Artifact(tag, {**own, LABEL_CHECKPOINT: checkpoint}, size))
                elif (marks.get(LABEL_INSTALL) == install and marks.get(LABEL_CHECKPOINT)
                      and tag == transport_tag(marks[LABEL_CHECKPOINT])):
                    found.append(Artifact(tag, marks, size))  # made before holder tags
        return found

    async def checkpoint_images(self) -> list[dict]:
        """The engine's checkpoint images (every installation's, the compose backend's too),
        as `docker images` describes them: one listing, shared by the adapters of this engine
        asking at once (a reaper's look asks the docker and compose backends together, and an
        image listing is dockerd's slowest answer)."""
        filters = {"label": [LABEL_CHECKPOINT]}
        return await _asked_once((self.base_url, "checkpoint images"),
                                 lambda: self._call(lambda api: api.images(filters=filters)))

    async def export_artifact(self, artifact: str, path: str) -> None:
        """`docker save` of the image, named in the file by its checkpoint's transport tag
        whichever installation's tag it was saved by: the file names no installation, so a
        load of it moves no installation's tag."""
        def save(api: docker.APIClient) -> None:
            info = api.inspect_image(artifact)
            checkpoint = (info["Config"].get("Labels") or {}).get(LABEL_CHECKPOINT)
            if not checkpoint:
                raise AdapterError(f"image {artifact} is not a checkpoint image (no "
                                   f"{LABEL_CHECKPOINT} label)")
            saved = f"{path}.saved"
            try:
                with open(saved, "wb") as out:
                    for chunk in api.get_image(artifact):
                        out.write(chunk)
                _rename_saved_image(saved, path, artifact, transport_tag(checkpoint))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(saved)

        try:
            await self._call(save)
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"image {artifact} is no longer on the Docker engine") from exc
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not save image {artifact}: {_short(exc)}") from exc

    async def import_artifact(self, path: str, checkpoint_id: str, *, install: str | None = None,
                              as_checkpoint: str | None = None) -> str:
        """Load the archive's image (named by the transport tag), check it, tag it for the
        installation (as `as_checkpoint`: a child image relabelled as that checkpoint), and
        drop the transport tag again unless it was here before the load."""
        name = transport_tag(checkpoint_id)
        _check_saved_image(path, name)
        as_checkpoint = as_checkpoint or checkpoint_id
        own = holder_tag(as_checkpoint, install) if install else name

        def load(api: docker.APIClient) -> str:
            images_before = api.images()
            tags_before = {tag: info["Id"] for info in images_before
                           for tag in info.get("RepoTags") or []}
            loaded_here = True

            def put_back(tag: str) -> None:
                repository, _, version = tag.rpartition(":")
                if tag in tags_before:
                    api.tag(tags_before[tag], repository, version, force=True)
                else:
                    api.remove_image(tag, force=tag == name, noprune=tag != name)

            def undo(info: Mapping[str, Any], moved: Sequence[str]) -> None:
                for tag in (*moved, name):
                    put_back(tag)
                if loaded_here:
                    with contextlib.suppress(docker_errors.APIError):
                        api.remove_image(info["Id"])

            with open(path, "rb") as data:
                for _ in api.load_image(data):
                    pass
            # The check above should leave nothing to find here; if an engine names images
            # in a way it does not know, every tag the load moved goes back before we refuse.
            info = api.inspect_image(name)
            loaded_here = info["Id"] not in {i["Id"] for i in images_before}
            moved = [t for t in info.get("RepoTags") or []  # tags the load gave it
                     if t != name and tags_before.get(t) != info["Id"]]
            labels = info["Config"].get("Labels") or {}
            problem = (f"it also names {', '.join(moved)}" if moved else
                       f"this engine already holds another image as {name}"
                       if tags_before.get(name, info["Id"]) != info["Id"] else
                       f"the image in the archive is not checkpoint {checkpoint_id}"
                       if labels.get(LABEL_CHECKPOINT) != checkpoint_id else
                       "the image claims to be a service of a pod (sbx.pod, sbx.service)"
                       if labels.get(LABEL_POD) or labels.get(LABEL_SERVICE) else None)
            if problem:
                undo(info, moved)
                raise ArtifactRefused(f"the artifact is refused: {problem}")
            try:
                if as_checkpoint != checkpoint_id:
                    _relabelled(api, info, own, {LABEL_CHECKPOINT: as_checkpoint})
                elif own != name:
                    repository, _, version = own.rpartition(":")
                    api.tag(info["Id"], repository, version, force=True)
            except BaseException:
                with contextlib.suppress(docker_errors.APIError):
                    undo(info, [])
                raise
            if own != name and name not in tags_before:
                with contextlib.suppress(docker_errors.NotFound):  # the image stays, as `own`
                    api.remove_image(name, noprune=True)
            return own

        try:
            return await self._call(load)
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not load the checkpoint: {_short(exc)}") from exc

    # -- ports (Capability.PORTS) ----------------------------------------------------------

    async def port_endpoints(self, ref: str) -> dict[int, Endpoint]:
        """The container's published TCP ports as the engine reports them (inspect's
        NetworkSettings.Ports), each reached at its host address; one published on every
        address (0.0.0.0) at this host's loopback, or the engine's host when it is remote."""
        try:
            info = await self._call(lambda api: api.inspect_container(ref))
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"container {ref[:12]} is gone") from exc
        found: dict[int, Endpoint] = {}
        for key, bindings in ((info.get("NetworkSettings") or {}).get("Ports") or {}).items():
            port, _, proto = key.partition("/")
            usable = [b for b in bindings or () if str(b.get("HostPort") or "").isdigit()]
            if proto != "tcp" or not port.isdigit() or not usable:
                continue  # exposed but not published, or not TCP
            usable.sort(key=lambda b: ":" in (b.get("HostIp") or ""))  # IPv4 first
            found[int(port)] = Endpoint(int(port), self._reach(usable[0].get("HostIp") or ""),
                                        int(usable[0]["HostPort"]))
        return found

    def _reach(self, host_ip: str) -> str:
        """The address a published port is reached at from this host."""
        if host_ip in ("", "0.0.0.0", "::"):
            remote = urllib.parse.urlsplit(self.base_url).hostname \
                if self.base_url.startswith((*NETWORK_SCHEMES, "ssh://")) else None
            return remote or ("::1" if host_ip == "::" else "127.0.0.1")
        return host_ip

    async def expose_port(self, ref: str, port: int) -> Endpoint:
        raise CapabilityNotSupported(
            f"the docker backend cannot publish port {port} while the sandbox runs (Docker "
            f"publishes a container's ports when it is made): add {port} to the profile's "
            "ports: and create the sandbox again")

    async def metrics(self, ref: str) -> AsyncIterator[MetricSample]:
        """The engine's stats stream (a sample a second); the first has no CPU figure. Under
        gVisor no pids: the engine counts gVisor's own threads, not the sandbox's processes
        (docs/security.md, "Isolation levels")."""
        def open_stats(api: docker.APIClient) -> tuple[bool, Any]:
            runtime = (api.inspect_container(ref).get("HostConfig") or {}).get("Runtime")
            return runtime == GVISOR_RUNTIME, api.stats(ref, stream=True, decode=True)

        try:
            gvisor, stream = await self._call(open_stats)
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"container {ref[:12]} is gone") from exc
        async for stats in _in_thread(stream):
            if str(stats.get("read", "")).startswith("0001-"):
                return  # the engine's empty reading: the container is not running
            sample = sample_from_stats(stats)
            yield replace(sample, pids=None) if gvisor else sample

    async def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

    @staticmethod
    def _docker_cli() -> str | None:
        import shutil

        return shutil.which("docker")

    # -- volumes (docs/volumes.md): named volumes labelled sbx.volume and sbx.install ---------

    async def create_volume(self, volume_id: str, labels: Mapping[str, str]) -> str:
        name = f"sbx-{volume_id}"
        try:
            made = await self._call(lambda api: api.create_volume(name=name, labels=dict(labels)))
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker refused to make the volume: {_short(exc)}") from exc
        return made["Name"]

    async def remove_volume(self, ref: str) -> None:
        """Only a volume carrying sbx.volume is removed: never one sbx did not make."""
        def remove(api: docker.APIClient) -> None:
            try:
                info = api.inspect_volume(ref)
            except docker_errors.NotFound:
                return
            if not (info.get("Labels") or {}).get(LABEL_VOLUME):
                raise InvalidRequest(f"docker volume {ref} is not one of sbx's: left alone")
            try:
                api.remove_volume(ref)
            except docker_errors.NotFound:
                return
            except docker_errors.APIError as exc:
                if exc.status_code == 409:  # a container (not a live sandbox of ours) holds it
                    raise AdapterError(f"docker volume {ref} is in use by a container: "
                                       f"{_short(exc)}") from exc
                raise

        await self._call(remove)

    async def volume_size(self, ref: str) -> int | None:
        """The engine's own figure (`docker system df -v`); None when it has none."""
        def size(api: docker.APIClient) -> int | None:
            response = api._get(api._url("/system/df"), params={"type": "volume"})
            api._raise_for_status(response)
            for volume in response.json().get("Volumes") or []:
                if volume.get("Name") == ref:
                    used = (volume.get("UsageData") or {}).get("Size")
                    return used if isinstance(used, int) and used >= 0 else None
            return None

        try:
            return await self._call(size)
        except docker_errors.APIError:
            return None

    async def list_volumes(self, labels: Mapping[str, str]) -> list[str]:
        found = await self._call(lambda api: api.volumes(
            filters={"label": [f"{k}={v}" for k, v in labels.items()]}))
        return [v["Name"] for v in (found or {}).get("Volumes") or []]

    async def open_volume(self, ref: str, labels: Mapping[str, str]) -> str:
        """A container made (never started: the archive API needs no process) from the base
        image, network none, the volume at /volume; labelled sbx.volume but not sbx.install,
        so reconcile never takes it for a sandbox. close_volume removes it by id."""
        def make(api: docker.APIClient) -> str:
            spec = dict(image=BASE_IMAGE, command=list(KEEPALIVE), labels=dict(labels),
                        network_disabled=True, host_config=api.create_host_config(
                            network_mode="none", cap_drop=["ALL"],
                            security_opt=["no-new-privileges"],
                            mounts=_volume_mounts([VolumeMountSpec(ref, "/volume")])))
            try:
                return api.create_container(**spec)["Id"]
            except docker_errors.ImageNotFound:
                build_base_image(api)
                return api.create_container(**spec)["Id"]

        try:
            return await self._call(make)
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not reach the volume: {_short(exc)}") from exc

    async def close_volume(self, helper: str) -> None:
        await self._call(lambda api: _remove_quietly(api, helper))
        self._traits.pop(helper, None)

    def shell_argv(self, ref: str) -> list[str]:
        """`docker exec -it REF sh` on this adapter's engine (`--host`: DOCKER_HOST or the
        local socket, even where a docker context names another); the docker CLI reads
        DOCKER_TLS_VERIFY and DOCKER_CERT_PATH as docker-py does."""
        docker_cli = self._docker_cli()
        if docker_cli is None:
            raise CapabilityNotSupported("an interactive shell needs the docker CLI on PATH")
        return [docker_cli, "--host", self.base_url, "exec", "-it", ref, "sh"]


def install_digest(install: str) -> str:
    """The installation's mark in a checkpoint tag: its id hashed, so any id fits a tag."""
    return hashlib.sha256(install.encode()).hexdigest()[:INSTALL_DIGEST_LEN]


def holder_tag(checkpoint_id: str, install: str) -> str:
    """The tag by which the installation `install` holds checkpoint `checkpoint_id`'s image."""
    return f"{CHECKPOINT_REPOSITORY}:{checkpoint_id}-{install_digest(install)}"


def transport_tag(checkpoint_id: str) -> str:
    """The name an archive gives the checkpoint's image."""
    return f"{CHECKPOINT_REPOSITORY}:{checkpoint_id}"


def _tags(info: Mapping[str, Any]) -> list[str]:
    """An image's tags (an engine lists an untagged image's as `<none>:<none>`, or none)."""
    return [t for t in info.get("RepoTags") or [] if t != "<none>:<none>"]


def _checkpoint_tags(info: Mapping[str, Any]) -> list[str]:
    return [t for t in _tags(info) if t.startswith(CHECKPOINT_REPOSITORY + ":")]


def _held_by(tag: str, install: str) -> str | None:
    """The checkpoint `tag` holds for the installation `install`; None if not its tag."""
    suffix = f"-{install_digest(install)}"
    version = tag.removeprefix(CHECKPOINT_REPOSITORY + ":")
    if version != tag and version.endswith(suffix) and len(version) > len(suffix):
        return version.removesuffix(suffix)
    return None


def _checkpoint_named(tag: str) -> str:
    """The checkpoint a holder or transport tag names (for messages)."""
    version = tag.rpartition(":")[2]
    held = re.fullmatch(rf"(.+)-[0-9a-f]{{{INSTALL_DIGEST_LEN}}}", version)
    return held.group(1) if held else version


def _relabelled(api: docker.APIClient, info: Mapping[str, Any], tag: str,
                labels: Mapping[str, str]) -> None:
    """A child of the image that differs only in `labels`, tagged `tag`: the commit of a
    container made from it that never runs. While it exists the container carries no
    installation's labels, so no reconcile takes it for one of its own."""
    kept = {k: v for k, v in (info["Config"].get("Labels") or {}).items()
            if k in (LABEL_INSTALL, LABEL_ID)}
    box = api.create_container(info["Id"], labels={LABEL_INSTALL: "", LABEL_ID: ""},
                               network_disabled=True,
                               host_config=api.create_host_config(network_mode="none"))["Id"]
    try:
        repository, _, version = tag.rpartition(":")
        api.commit(box, repository=repository, tag=version, changes=[
            f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in {**kept, **labels}.items()])
    finally:
        _remove_quietly(api, box)


def _rename_saved_image(saved: str, path: str, old: str, new: str) -> None:
    """Copy the `docker save` archive `saved` to `path` with its image named `new` instead of
    `old` in every file the engine reads names from (the layers are copied as they are), then
    check the result as an import would."""
    old_version, new_version = old.rpartition(":")[2], new.rpartition(":")[2]

    def swap(value: Any) -> Any:
        if isinstance(value, str):
            if value == old_version:
                return new_version
            return value[:-len(old)] + new if value.endswith(old) else value
        if isinstance(value, dict):
            return {swap(k): swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    with tarfile.open(saved) as src, open(path, "wb") as raw, \
            tarfile.open(fileobj=raw, mode="w", format=src.format) as dst:
        for member in src:
            if member.isfile() and member_path(member) in NAMING_MEMBERS and old != new:
                data = json.dumps(swap(json.loads(src.extractfile(member).read()))).encode()
                member.size = len(data)
                dst.addfile(member, io.BytesIO(data))
            else:
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    _check_saved_image(path, new)


# What `docker load` reads names from: only these, at the top of the archive. Each must be a
# plain file of at most SAVED_IMAGE_JSON_MAX, and name `name` alone.
NAMING_MEMBERS = ("manifest.json", "repositories", "index.json", "oci-layout")
SAVED_IMAGE_JSON_MAX = 1024 * 1024
SAVED_IMAGE_MAX_MEMBERS = 100_000  # `docker save` writes 4 a layer, and 127 layers at most


def _check_saved_image(path: str, name: str) -> None:
    """A `docker save` archive holding exactly one image, tagged `name` and nothing else, in
    every file the engine reads names from (manifest.json; repositories and index.json, which
    other engines and versions honour): loading anything more could retag images sbx does not
    own. Read within bounds, as a file from outside is."""
    found: dict[str, Any] = {}
    links: set[str] = set()
    try:
        with open(path, "rb") as raw:
            tar = BoundedTar(raw, max_members=SAVED_IMAGE_MAX_MEMBERS)
            for member in tar:
                where = member_path(member)
                parents = {"/".join(where.split("/")[:i]) for i in range(1, where.count("/") + 1)}
                if parents & links:  # written through a link: could land anywhere
                    raise ArtifactRefused(f"the artifact is refused: {member.name!r} is "
                                          "inside a link")
                if member.issym() or member.islnk():
                    links.add(where)
                if where not in NAMING_MEMBERS:
                    tar.accept(member)
                    continue
                if where in found or not member.isfile() or member.size > SAVED_IMAGE_JSON_MAX:
                    raise ArtifactRefused(f"the artifact is refused: {member.name!r} must be "
                                          f"one plain file of at most {SAVED_IMAGE_JSON_MAX} "
                                          "bytes")
                found[where] = json.loads(tar.read(member))
            tar.close()
    except ArtifactRefused:
        raise
    except TooLarge as exc:
        raise ArtifactRefused(f"the artifact is refused: {exc}") from None
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise ArtifactRefused(f"the artifact is not a docker image archive: {exc}") from None
    if "manifest.json" not in found:
        raise ArtifactRefused("the artifact is not a docker image archive: no manifest.json")
    tagged, named = _names_in_saved_image(found)
    if tagged != [name] or any(other != name for other in named):
        listed = sorted(set(tagged + named) - {name}) or ["an untagged image"]
        raise ArtifactRefused(f"the artifact must hold exactly the image {name}, "
                              f"not {', '.join(listed)}")


def _names_in_saved_image(found: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The tags manifest.json gives its image, and every name repositories and index.json
    give, each as `repository:tag` (`docker.io/` dropped); a file of the wrong shape, or
    more than one image, names "?"."""

    def short(ref: Any) -> str:
        return str(ref).removeprefix("docker.io/").removeprefix("library/")

    manifest = found["manifest.json"]
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        return ["?"], []
    tagged = [short(t) for t in manifest[0].get("RepoTags") or []]
    named: list[str] = []
    repositories = found.get("repositories", {})
    if not isinstance(repositories, dict):
        return tagged, ["?"]
    for repository, tags in repositories.items():
        if not isinstance(tags, dict):
            return tagged, ["?"]
        named += [f"{short(repository)}:{tag}" for tag in tags]
    index = found.get("index.json", {})
    entries = (index.get("manifests") or []) if isinstance(index, dict) else None
    if not isinstance(entries, list) or len(entries) > 1:
        return tagged, ["?"]
    for entry in entries:
        notes = (entry.get("annotations") or {}) if isinstance(entry, dict) else None
        if not isinstance(notes, dict):
            return tagged, ["?"]
        if "io.containerd.image.name" in notes:
            named.append(short(notes["io.containerd.image.name"]))
        ref = notes.get("org.opencontainers.image.ref.name")
        if ref is not None:  # a tag of our repository, or a whole name
            ref = str(ref)
            named.append(short(ref if "/" in ref or ":" in ref
                               else f"{CHECKPOINT_REPOSITORY}:{ref}"))
    if "oci-layout" in found and not isinstance(found["oci-layout"], dict):
        return tagged, ["?"]
    return tagged, named


def sample_from_stats(stats: Mapping[str, Any]) -> MetricSample:
    """CPU % and memory as `docker stats` computes them (memory without the page cache)."""
    cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
    cpu_pct = None
    if pre.get("system_cpu_usage") and cpu.get("system_cpu_usage"):
        used = cpu["cpu_usage"]["total_usage"] - pre["cpu_usage"]["total_usage"]
        system = cpu["system_cpu_usage"] - pre["system_cpu_usage"]
        cores = cpu.get("online_cpus") or len(cpu["cpu_usage"].get("percpu_usage") or [1])
        cpu_pct = round(used / system * cores * 100, 2) if system > 0 else None
    memory = stats.get("memory_stats") or {}
    usage = memory.get("usage")
    if usage is not None:
        detail = memory.get("stats") or {}
        usage -= detail.get("total_inactive_file", detail.get("inactive_file", 0))
    networks = (stats.get("networks") or {}).values()
    return MetricSample(
        time=_parse_time(stats.get("read")) or datetime.now(UTC),
        cpu_pct=cpu_pct,
        memory_bytes=usage,
        memory_limit=memory.get("limit"),
        net_rx_bytes=sum(n["rx_bytes"] for n in networks) if networks else None,
        net_tx_bytes=sum(n["tx_bytes"] for n in networks) if networks else None,
        pids=(stats.get("pids_stats") or {}).get("current"),
    )


async def _read_ahead(read: Callable[[int], bytes]) -> AsyncIterator[bytes]:
    """Pieces of up to ARCHIVE_CHUNK from the blocking `read(n)` (b"" at the end), read by a
    thread of its own at most ARCHIVE_AHEAD pieces ahead of the reader: bounded memory, and
    the sender does not wait for each piece to be used."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
    slots = threading.Semaphore(ARCHIVE_AHEAD)
    stopped = False

    def soon(item: bytes | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(pieces.put_nowait, item)

    def pump() -> None:
        try:
            while True:
                slots.acquire()
                if stopped:
                    return
                data = read(ARCHIVE_CHUNK)
                soon(bytes(data))
                if not data:
                    return
        except Exception as exc:  # noqa: BLE001 (handed to the reader, raised there)
            soon(exc)

    threading.Thread(target=pump, name="sbx-archive-read", daemon=True).start()
    try:
        while True:
            item = await pieces.get()
            slots.release()
            if isinstance(item, BaseException):
                raise item
            if not item:
                return
            yield item
    finally:
        stopped = True
        slots.release()  # a pump waiting for room sees it is over


async def _in_thread(iterator: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Drain a blocking iterator from a worker thread, one item at a time."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, iterator, done)
        if item is done:
            return
        yield item


# how long pause and resume wait for the engine's own record to agree (see _until_paused_is)
PAUSE_SETTLES_WITHIN_S = 10.0


def _until_paused_is(api: docker.APIClient, ref: str, paused: bool) -> None:
    """Return once the engine reports `ref` paused (or not), so that what the caller reads
    next agrees with what it asked: under gVisor on a busy host, inspect right after an
    answered unpause has read the container as not running (likely dockerd handling the
    runtime's pause event after the unpause; the resume's own event puts it right). Past
    the limit, the call returns as it is."""
    deadline = time.monotonic() + PAUSE_SETTLES_WITHIN_S
    while bool(api.inspect_container(ref).get("State", {}).get("Paused")) != paused:
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)


def _pod_members(api: docker.APIClient, ref: str) -> list[str]:
    """The service containers of the sandbox whose main container is `ref`."""
    found = api.containers(all=True, filters={"label": [f"{LABEL_POD}={ref}"]})
    return [info["Id"] for info in found]


def _volume_mounts(mounts: Sequence[VolumeMountSpec]) -> list[docker.types.Mount]:
    return [docker.types.Mount(target=m.path, source=m.ref, type="volume",
                               read_only=m.read_only, no_copy=True) for m in mounts]


def _remove_quietly(api: docker.APIClient, container_id: str) -> None:
    try:
        api.remove_container(container_id, force=True, v=True)
    except docker_errors.DockerException:
        pass


def in_container(pid: int, container_id: str) -> bool:
    """Whether the process `pid` of this host is in the container: its cgroup path names the
    container's full id (cgroup v1 and v2, docker's cgroupfs and systemd drivers)."""
    if not re.fullmatch(r"[0-9a-f]{64}", container_id):
        return False
    try:
        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return re.search(rf"(?<![0-9a-f]){container_id}(?![0-9a-f])", cgroups) is not None


def kill_if_in_container(pid: int, container_id: str) -> bool:
    """SIGKILL `pid` if it is a process of the container. The process is held by a pidfd
    before it is checked, so a pid reused in between is never the one signalled."""
    if not hasattr(os, "pidfd_open"):  # not Linux: the engine runs in a VM anyway
        return False
    try:
        handle = os.pidfd_open(pid)
    except OSError:
        return False  # gone, or not a pid of this host
    try:
        if not in_container(pid, container_id):
            return False
        signal.pidfd_send_signal(handle, signal.SIGKILL)
        return True
    except OSError:  # not ours to kill (EPERM), or it ended since (ESRCH)
        return False
    finally:
        os.close(handle)


# An address in an engine's message (`lookup registry-1.docker.io on 10.0.2.3:53`, `dial tcp
# 172.17.0.1:443`): the engine's network, nothing a person acts on, never stored or shown.
_ADDRESS = re.compile(r"(?:\s+on)?\s*(?:\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]|"
                      r"\b(?:\d{1,3}\.){3}\d{1,3}\b)(?::\d+)?")


def _short(exc: BaseException) -> str:
    """The engine's own explanation of an API error, on one line, without network addresses:
    what an error stored in a record or an event says."""
    explanation = getattr(exc, "explanation", None)
    text = str(explanation or exc).strip()
    line = text.splitlines()[0] if text else ""
    line = " ".join(_ADDRESS.sub("", line).split()).replace(" :", ":")
    return line or type(exc).__name__


def _why_unreachable(exc: BaseException) -> str:
    """Why the engine did not answer, in plain words (never an exception's repr): from the
    error number found under docker-py's, requests' and urllib3's wrappers."""
    import ssl

    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    timed_out = False
    while stack:
        found = stack.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, ssl.SSLError):
            return ("the TLS handshake failed (check DOCKER_CERT_PATH and DOCKER_TLS_VERIFY "
                    "against the engine's certificate)")
        if isinstance(found, OSError) and found.errno in UNREACHABLE_BECAUSE:
            return UNREACHABLE_BECAUSE[found.errno]
        if isinstance(found, TimeoutError) or "Timeout" in type(found).__name__:
            timed_out = True
        if "NameResolution" in type(found).__name__ or isinstance(found, socket.gaierror):
            return "its host name does not resolve"
        inner = [a for a in getattr(found, "args", ()) if isinstance(a, BaseException)]
        inner += [getattr(found, "reason", None), found.__cause__, found.__context__]
        stack += [e for e in inner if isinstance(e, BaseException)]
    return "it did not answer in time" if timed_out else "it did not answer as a Docker engine does"
