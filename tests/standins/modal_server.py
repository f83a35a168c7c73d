"""A local stand-in for Modal's API, for testing the modal adapter through the real SDK.

Two gRPC services on 127.0.0.1, built on the servicer base classes the `modal` package ships:
the control plane (`modal_proto.api_grpc.ModalClientBase`) and the task command router
(`modal_proto.task_command_router_grpc.TaskCommandRouterBase`) that exec and filesystem
snapshots go to. Every RPC the stand-in does not implement answers UNIMPLEMENTED and is
recorded in `unimplemented`, so an SDK upgrade that calls something new fails loudly.

What a "sandbox" is here: a folder (its filesystem, the working directory of its commands)
and local `sh` processes. Commands run for real on this host (not in Docker), with real exit
codes, stdout and stderr; an exec with `pty=True` runs on a real pseudo-terminal of this host
(its output all on stdout, its stdin the terminal's keystrokes), as on Modal. A filesystem snapshot copies the folder into an image; a sandbox
created from that image starts from a copy. Server-side deadlines are real: a sandbox past its
`timeout` ends with the timed-out result (exit 124), as on Modal, and its processes are killed.

Volumes (V2, Modal's current volume filesystem), as the SDK speaks to them: VolumeGetOrCreate,
VolumeDelete, VolumeList, VolumeListFiles2, VolumeGetFile2, VolumePutFiles2 and
VolumeRemoveFile2 on the control plane, and the blocks over HTTP as on Modal: a put answers
the blocks it lacks with a `put_url` (an HTTP PUT of the block, checked against its SHA-256;
its answer is the `put_response` the next put carries), a get answers one `get_urls` entry
per 8 MiB block. A volume's files are a folder of the stand-in's temp folder
(`<root>/volumes/<volume id>`), the blocks a folder beside it. A V1 volume's file RPCs are
not implemented (UNIMPLEMENTED, recorded). A sandbox created with `volume_mounts` sees each
volume at its `mount_path`: since the stand-in's commands run on this host, every command of
such a sandbox runs in a mount namespace of its own (`unshare --mount`, private
propagation) in which the volume's folder is bind-mounted at that host path (remounted
read-only for `read_only`), so nothing of it is seen outside the sandbox's commands. A
missing mount point is made on the host while a sandbox uses it and removed after (this
needs root, as the tests run). Writes are seen in the volume at once (Modal commits a
sandbox's writes in the background and at its end).

Auth as on Modal: the token pair arrives as metadata on every control-plane call
(UNAUTHENTICATED when wrong), `AuthTokenGet` hands out a JWT-shaped token with an `exp` claim
that V2 calls carry, and the router wants the per-sandbox JWT it was given.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import sys
import termios
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import empty_pb2
from grpclib import GRPCError, Status
from grpclib.server import Server, Stream
from modal_proto import api_pb2
from modal_proto import task_command_router_pb2 as router_pb2
from modal_proto.api_grpc import ModalClientBase
from modal_proto.task_command_router_grpc import TaskCommandRouterBase

GenericResult = api_pb2.GenericResult
V1_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
TUNNEL_DOMAIN = "tunnels.modal.test"  # the hosts of the stand-in's tunnels (never reached)
BLOCK_SIZE = 8 * 1024 * 1024  # a volume file's blocks, as Modal's (modal._utils.blob_utils)
LIST_BATCH = 100  # VolumeListFiles2 entries per streamed message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jwt(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.{secrets.token_hex(8)}"


@dataclass
class Exec:
    """One command started in a sandbox, with its output as it arrives."""

    process: asyncio.subprocess.Process
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    closed: dict[int, bool] = field(default_factory=lambda: {0: False, 1: False})
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    exit_code: int | None = None
    exit_signal: int | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    stdin_offset: int = 0  # bytes of stdin written so far (a retried write repeats an offset)
    stdin_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    terminal: int | None = None  # exec(pty=True): the master end of its pseudo-terminal


@dataclass
class Sandbox:
    id: str
    task_id: str
    app_id: str
    created_at: float
    definition: api_pb2.Sandbox
    tags: dict[str, str]
    fs: Path
    env: dict[str, str]
    jwt: str
    version: int
    result: api_pb2.GenericResult | None = None
    last_activity: float = 0.0
    execs: dict[str, Exec] = field(default_factory=dict)
    entrypoint: asyncio.subprocess.Process | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    # volume_mounts: (the volume's folder, the mount path on this host, read-only)
    mounts: list[tuple[Path, str, bool]] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.result is None


@dataclass
class Call:
    """One RPC as the stand-in received it (metadata without token values)."""

    service: str
    method: str
    request: Any


class ModalStandin:
    """The stand-in's state and both servers, run on a loop in a thread of its own so the
    test process can serve the `sbx` subprocesses it starts and call the SDK itself."""

    def __init__(self, root: Path, token_id: str, token_secret: str, *, page_size: int = 3):
        self.root = root
        self.token_id = token_id
        self.token_secret = token_secret
        self.page_size = page_size
        self.calls: list[Call] = []
        self.unimplemented: list[str] = []
        self.creates: list[Any] = []  # SandboxCreateV2Request / SandboxCreateRequest, in order
        self.rejected_tokens = 0
        self.sandboxes: dict[str, Sandbox] = {}
        self.images: dict[str, Path | None] = {}
        self.registry_images: dict[str, list[str]] = {}  # image id -> Dockerfile commands
        self.deleted_images: list[str] = []
        self.apps: dict[str, str] = {}
        self.secrets: dict[str, dict[str, str]] = {}  # ephemeral secrets (V1 sandboxes' env)
        self.dict_ids: dict[str, str] = {}  # Dict name -> id
        self.dicts: dict[str, dict[bytes, bytes]] = {}  # Dict id -> serialized entries
        self.auth_tokens: set[str] = set()
        self.volumes: dict[str, StandinVolume] = {}  # volume id -> volume
        self.block_reads: dict[str, tuple[Path, int, int]] = {}  # token -> (file, start, len)
        self._mount_points: dict[Path, int] = {}  # mount points made here -> sandboxes using them
        self.blocks_port = _free_port()
        self._blocks_runner: Any = None
        self.api_port = _free_port()
        self.router_port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="modal-standin",
                                        daemon=True)
        self._servers: list[Server] = []

    # -- running ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def blocks_url(self) -> str:
        return f"http://127.0.0.1:{self.blocks_port}"

    def start(self) -> ModalStandin:
        self._thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        for handler, port in ((with_unimplemented(ControlPlane)(self), self.api_port),
                              (with_unimplemented(TaskRouter)(self), self.router_port)):
            server = Server([handler])
            await server.start("127.0.0.1", port)
            self._servers.append(server)
        await self._start_blocks()

    def stop(self) -> None:
        async def shutdown() -> None:
            for sandbox in list(self.sandboxes.values()):
                await self._end(sandbox, GenericResult.GENERIC_STATUS_TERMINATED)
            for server in self._servers:
                server.close()
                await server.wait_closed()
            if self._blocks_runner is not None:
                await self._blocks_runner.cleanup()

        self.call(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def call(self, coro: Awaitable[Any], timeout: float = 30) -> Any:
        """Run a coroutine on the stand-in's loop from the test's thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- what tests look at ----------------------------------------------------------------

    def methods(self) -> list[str]:
        return [c.method for c in self.calls]

    def create_of(self, sandbox_id: str) -> Any:
        """The create request that made the sandbox whose `sbx.id` tag is `sandbox_id`."""
        for request in self.creates:
            if {t.tag_name: t.tag_value for t in request.tags}.get("sbx.id") == sandbox_id:
                return request
        raise KeyError(sandbox_id)

    def sandbox_by_tag(self, sandbox_id: str) -> Sandbox:
        return next(s for s in self.sandboxes.values() if s.tags.get("sbx.id") == sandbox_id)

    def terminate_out_of_band(self, modal_id: str) -> None:
        self.call(self._end(self.sandboxes[modal_id], GenericResult.GENERIC_STATUS_TERMINATED))

    def forget(self, modal_id: str) -> None:
        """Modal no longer knows the sandbox at all (long gone)."""
        self.call(self._forget(modal_id))

    async def _forget(self, modal_id: str) -> None:
        sandbox = self.sandboxes[modal_id]
        await self._end(sandbox, GenericResult.GENERIC_STATUS_TERMINATED)
        del self.sandboxes[modal_id]

    def running_processes(self) -> int:
        return sum(1 for s in self.sandboxes.values() for e in s.execs.values()
                   if e.process.returncode is None)

    # -- sandboxes -------------------------------------------------------------------------

    def _new_sandbox(self, version: int, app_id: str, definition: api_pb2.Sandbox,
                     tags: dict[str, str], env: dict[str, str]) -> Sandbox:
        if version == 1:
            sandbox_id = "sb-" + "".join(secrets.choice(V1_ALPHABET) for _ in range(22))
        else:
            sandbox_id = f"sb-v2-{uuid.uuid4().hex[:16]}"
        image_id = definition.image_id
        if image_id not in self.images:
            raise GRPCError(Status.NOT_FOUND, f"Image {image_id} not found")
        mounts = self._mounts_of(definition)
        fs = self.root / "sandboxes" / sandbox_id
        source = self.images[image_id]
        if source is not None:
            shutil.copytree(source, fs, symlinks=True)
        else:
            fs.mkdir(parents=True)
        now = time.time()
        latest = max((s.created_at for s in self.sandboxes.values()), default=0.0)
        sandbox = Sandbox(
            id=sandbox_id, task_id=f"ta-{uuid.uuid4().hex[:12]}{'V' if version == 2 else ''}",
            app_id=app_id, created_at=max(now, latest + 1e-3), definition=definition, tags=tags,
            fs=fs, env=env, jwt=_jwt({"sub": sandbox_id, "exp": int(now) + 3600}),
            version=version, last_activity=now, mounts=mounts,
        )
        self._hold_mount_points(mounts)
        self.sandboxes[sandbox_id] = sandbox
        loop = asyncio.get_running_loop()
        if definition.timeout_secs:
            sandbox.timers.append(loop.call_later(
                definition.timeout_secs, self._end_soon, sandbox,
                GenericResult.GENERIC_STATUS_TIMEOUT))
        if definition.idle_timeout_secs:
            sandbox.timers.append(loop.call_later(1, self._check_idle, sandbox))
        if definition.entrypoint_args:
            loop.create_task(self._run_entrypoint(sandbox))
        return sandbox

    def _check_idle(self, sandbox: Sandbox) -> None:
        if not sandbox.running:
            return
        busy = any(e.exit_code is None and e.exit_signal is None for e in sandbox.execs.values())
        if not busy and time.time() - sandbox.last_activity >= sandbox.definition.idle_timeout_secs:
            self._end_soon(sandbox, GenericResult.GENERIC_STATUS_IDLE_TIMEOUT)
        else:
            sandbox.timers.append(asyncio.get_running_loop().call_later(
                1, self._check_idle, sandbox))

    async def _run_entrypoint(self, sandbox: Sandbox) -> None:
        sandbox.entrypoint = await self._spawn(sandbox, list(sandbox.definition.entrypoint_args),
                                               {}, capture=False)
        code = await sandbox.entrypoint.wait()
        if sandbox.running:
            await self._end(sandbox, GenericResult.GENERIC_STATUS_SUCCESS if code == 0
                            else GenericResult.GENERIC_STATUS_FAILURE, exitcode=code)

    def _end_soon(self, sandbox: Sandbox, status: int) -> None:
        asyncio.get_running_loop().create_task(self._end(sandbox, status))

    async def _end(self, sandbox: Sandbox, status: int, exitcode: int = 0) -> None:
        """The sandbox stops: its result is set and every process in it is killed."""
        if not sandbox.running:
            return
        sandbox.result = GenericResult(status=status, exitcode=exitcode,
                                       exception={3: "Sandbox terminated", 4: "Sandbox timed out",
                                                  7: "Sandbox idle timeout"}.get(status, ""))
        for timer in sandbox.timers:
            timer.cancel()
        processes = [e.process for e in sandbox.execs.values()]
        if sandbox.entrypoint is not None:
            processes.append(sandbox.entrypoint)
        for process in processes:
            if process.returncode is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for process in processes:
            await process.wait()
        self._release_mount_points(sandbox.mounts)
        sandbox.ended.set()

    async def _spawn(self, sandbox: Sandbox, argv: list[str], env: dict[str, str], *,
                     capture: bool, workdir: str = "") -> asyncio.subprocess.Process:
        """An entrypoint (no pipes) or an exec (stdin, stdout and stderr piped: stdin stays
        open until the client writes its EOF, as on Modal). `workdir`: a folder of this host
        (the stand-in's commands run here), else the sandbox's folder."""
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(sandbox.fs),
                    **sandbox.env, **env}
        pipe = asyncio.subprocess.PIPE if capture else asyncio.subprocess.DEVNULL
        if workdir and not Path(workdir).is_dir():
            raise GRPCError(Status.FAILED_PRECONDITION, f"workdir {workdir} is not a directory")
        try:
            return await asyncio.create_subprocess_exec(
                *_with_mounts(sandbox, argv), cwd=workdir or sandbox.fs, env=full_env, stdin=pipe,
                stdout=pipe, stderr=pipe, start_new_session=True)
        except OSError as exc:
            raise GRPCError(Status.FAILED_PRECONDITION, f"cannot start {argv[0]!r}: {exc}") from None

    async def _spawn_on_terminal(self, sandbox: Sandbox, argv: list[str], env: dict[str, str],
                                 workdir: str, pty: api_pb2.PTYInfo,
                                 ) -> tuple[asyncio.subprocess.Process, int]:
        """An exec with `pty=True`: the command on a real pseudo-terminal of this host (its
        controlling terminal, in a session of its own), of the size the client sent (0: the
        kernel's 0x0, as a client without a terminal of its own sends), TERM from it."""
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(sandbox.fs),
                    **({"TERM": pty.env_term} if pty.env_term else {}), **sandbox.env, **env}
        if workdir and not Path(workdir).is_dir():
            raise GRPCError(Status.FAILED_PRECONDITION, f"workdir {workdir} is not a directory")
        master, slave = os.openpty()
        fcntl.ioctl(master, termios.TIOCSWINSZ,
                    struct.pack("HHHH", pty.winsz_rows, pty.winsz_cols, 0, 0))
        try:
            process = await asyncio.create_subprocess_exec(
                *_with_mounts(sandbox, [sys.executable, "-c", _ON_TERMINAL, *argv]),
                cwd=workdir or sandbox.fs,
                env=full_env, stdin=slave, stdout=slave, stderr=slave)
        except OSError as exc:
            os.close(master)
            raise GRPCError(Status.FAILED_PRECONDITION, f"cannot start {argv[0]!r}: {exc}") from None
        finally:
            os.close(slave)
        return process, master

    def _sandbox(self, sandbox_id: str) -> Sandbox:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise GRPCError(Status.NOT_FOUND, f"Sandbox {sandbox_id} not found")
        return sandbox

    def _by_task(self, task_id: str) -> Sandbox:
        for sandbox in self.sandboxes.values():
            if sandbox.task_id == task_id:
                return sandbox
        raise GRPCError(Status.NOT_FOUND, f"Task {task_id} not found")

    def _info(self, sandbox: Sandbox) -> api_pb2.SandboxInfo:
        return api_pb2.SandboxInfo(
            id=sandbox.id, created_at=sandbox.created_at, app_id=sandbox.app_id,
            tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in sandbox.tags.items()],
            image_id=sandbox.definition.image_id, timeout_secs=sandbox.definition.timeout_secs,
            idle_timeout_secs=sandbox.definition.idle_timeout_secs,
            task_info=api_pb2.TaskInfo(id=sandbox.task_id, started_at=sandbox.created_at,
                                       result=sandbox.result, sandbox_id=sandbox.id),
            metadata=self._metadata(sandbox),
        )

    @staticmethod
    def _metadata(sandbox: Sandbox) -> api_pb2.SandboxHandleMetadata:
        return api_pb2.SandboxHandleMetadata(app_id=sandbox.app_id, result=sandbox.result)

    # -- volumes ---------------------------------------------------------------------------

    def volume_by_name(self, name: str) -> StandinVolume | None:
        return next((v for v in self.volumes.values() if v.name == name), None)

    def _volume(self, volume_id: str) -> StandinVolume:
        volume = self.volumes.get(volume_id)
        if volume is None:
            raise GRPCError(Status.NOT_FOUND, f"Volume {volume_id} not found")
        return volume

    def _mounts_of(self, definition: api_pb2.Sandbox) -> list[tuple[Path, str, bool]]:
        """A create's `volume_mounts`, checked as Modal checks them (the volume exists, the
        path is absolute and not /)."""
        mounts = []
        for mount in definition.volume_mounts:
            volume = self._volume(mount.volume_id)
            path = os.path.normpath(mount.mount_path)
            if not mount.mount_path.startswith("/") or path == "/":
                raise GRPCError(Status.INVALID_ARGUMENT,
                                f"mount path {mount.mount_path!r} must be absolute, not /")
            if os.path.lexists(path) and not os.path.isdir(path):
                raise GRPCError(Status.FAILED_PRECONDITION,
                                f"stand-in: {path} exists on this host and is not a folder")
            if mount.sub_path:
                raise GRPCError(Status.UNIMPLEMENTED, "stand-in: sub_path mounts")
            mounts.append((volume.folder, path, mount.read_only))
        if mounts and os.geteuid() != 0:
            raise GRPCError(Status.FAILED_PRECONDITION,
                            "stand-in: mounting a volume needs root (a bind mount)")
        return mounts

    def _hold_mount_points(self, mounts: list[tuple[Path, str, bool]]) -> None:
        """Make each missing mount point (and its missing parents) on this host; counted, so
        the last sandbox using one removes it."""
        for _, path, _ in mounts:
            made = []
            at = Path(path)
            while not at.exists():
                made.append(at)
                at = at.parent
            for folder in reversed(made):
                folder.mkdir()
                self._mount_points[folder] = 0
            for folder in [Path(path), *Path(path).parents]:
                if folder in self._mount_points:
                    self._mount_points[folder] += 1

    def _release_mount_points(self, mounts: list[tuple[Path, str, bool]]) -> None:
        for _, path, _ in mounts:
            for folder in [Path(path), *Path(path).parents]:
                if folder not in self._mount_points:
                    continue
                self._mount_points[folder] -= 1
                if self._mount_points[folder] <= 0:
                    del self._mount_points[folder]
                    with contextlib.suppress(OSError):
                        folder.rmdir()  # only while empty: nothing of anyone's is lost

    async def _start_blocks(self) -> None:
        """The blocks' HTTP server: PUT /put/<sha256 hex> stores a block (its body must have
        that digest), GET /get/<token> reads a byte range of a volume's file."""
        from aiohttp import web

        blocks = self.root / "blocks"
        blocks.mkdir(parents=True, exist_ok=True)

        async def put(request: web.Request) -> web.Response:
            digest = request.match_info["digest"]
            body = await request.read()
            if hashlib.sha256(body).hexdigest() != digest:
                return web.Response(status=400, text="block digest mismatch")
            (blocks / digest).write_bytes(body)
            return web.Response(body=f"put-{digest}".encode())

        async def get(request: web.Request) -> web.Response:
            read = self.block_reads.get(request.match_info["token"])
            if read is None:
                return web.Response(status=404, text="no such block")
            path, start, length = read
            with path.open("rb") as f:
                f.seek(start)
                data = f.read(length)
            return web.Response(body=data)

        app = web.Application(client_max_size=BLOCK_SIZE + 1024)
        app.router.add_put("/put/{digest}", put)
        app.router.add_get("/get/{token}", get)
        self._blocks_runner = web.AppRunner(app)
        await self._blocks_runner.setup()
        await web.TCPSite(self._blocks_runner, "127.0.0.1", self.blocks_port).start()

    def _block(self, digest: bytes) -> Path:
        return self.root / "blocks" / digest.hex()

    # -- images ----------------------------------------------------------------------------

    def add_image(self, files: dict[str, str] | None = None) -> str:
        """An image the account already has (what `Image.from_id` refers to)."""
        image_id = f"im-{uuid.uuid4().hex[:20]}"
        folder = None
        if files:
            folder = self.root / "images" / image_id
            folder.mkdir(parents=True)
            for name, text in files.items():
                (folder / name).write_text(text)
        self.images[image_id] = folder
        return image_id


@dataclass
class StandinVolume:
    """A volume: its files are the folder `folder`."""

    id: str
    name: str
    version: int
    folder: Path
    created_at: float


def _in_volume(volume: StandinVolume, path: str) -> Path:
    """A path of the volume (relative or absolute: / is its root) as a path of its folder;
    INVALID_ARGUMENT for one that leaves it."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise GRPCError(Status.INVALID_ARGUMENT, f"invalid path {path!r}")
    return volume.folder.joinpath(*parts)


# run as `unshare --mount --propagation private sh -c _MOUNT sbx-mount SRC DST RO ... -- ARGV`:
# each volume bind-mounted in the command's own mount namespace (read-only when RO is "ro")
_MOUNT = ('while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 126; '
          'if [ "$3" = ro ]; then mount -o remount,bind,ro "$2" || exit 126; fi; shift 3; done; '
          'shift; cd "$(pwd)"; exec "$@"')  # cd: a working folder under a mount is the volume's


def _with_mounts(sandbox: Sandbox, argv: list[str]) -> list[str]:
    """`argv`, run where the sandbox's volumes are mounted (as is, without mounts)."""
    if not sandbox.mounts:
        return argv
    spec = [x for folder, path, ro in sandbox.mounts for x in (str(folder), path,
                                                                "ro" if ro else "rw")]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT, "sbx-mount",
            *spec, "--", *argv]


def with_unimplemented(cls: type) -> type:
    """`cls` with every abstract RPC it does not define answering UNIMPLEMENTED, recorded."""

    def unimplemented(name: str) -> Callable[..., Awaitable[None]]:
        async def handler(self: Any, stream: Stream) -> None:
            self.standin.unimplemented.append(name)
            self.standin.calls.append(Call(self.service, name, None))
            raise GRPCError(Status.UNIMPLEMENTED, f"the Modal stand-in does not implement {name}")

        return handler

    missing = {name: unimplemented(name) for name in cls.__abstractmethods__}
    return type(cls.__name__, (cls,), missing)


# run as `python -c _ON_TERMINAL PROGRAM ARGS...` with the terminal as stdin: no signal
# blocked (the server's thread that starts it blocks them all, and a child inherits that)
# nor ignored by Python's doing,
# a session of its own whose controlling terminal it is, then the program
_ON_TERMINAL = ("import fcntl, os, signal, sys, termios; "
                "signal.pthread_sigmask(signal.SIG_SETMASK, []); "
                "[signal.signal(n, signal.SIG_DFL) for n in (signal.SIGPIPE, signal.SIGXFSZ)]; "
                "os.setsid(); "
                "fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execvp(sys.argv[1], sys.argv[1:])")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Service:
    service = ""

    def __init__(self, standin: ModalStandin) -> None:
        self.standin = standin

    async def _unary(self, stream: Stream, name: str,
                     answer: Callable[[Any], Any | Awaitable[Any]]) -> None:
        request = await stream.recv_message()
        self.standin.calls.append(Call(self.service, name, request))
        self._authenticate(stream)
        response = answer(request)
        if asyncio.iscoroutine(response):
            response = await response
        await stream.send_message(response)

    def _authenticate(self, stream: Stream) -> None:
        raise NotImplementedError


class ControlPlane(_Service, ModalClientBase):
    service = "api"

    def _authenticate(self, stream: Stream) -> None:
        metadata = stream.metadata or {}
        if (metadata.get("x-modal-token-id") != self.standin.token_id
                or metadata.get("x-modal-token-secret") != self.standin.token_secret):
            self.standin.rejected_tokens += 1
            raise GRPCError(Status.UNAUTHENTICATED, "Token ID or secret is invalid")
        auth_token = metadata.get("x-modal-auth-token")
        if auth_token is not None and auth_token not in self.standin.auth_tokens:
            raise GRPCError(Status.UNAUTHENTICATED, "Invalid auth token")

    # -- session, apps, images -------------------------------------------------------------

    async def ClientHello(self, stream: Stream) -> None:
        await self._unary(stream, "ClientHello", lambda _: api_pb2.ClientHelloResponse())

    async def AuthTokenGet(self, stream: Stream) -> None:
        def answer(_: Any) -> api_pb2.AuthTokenGetResponse:
            token = _jwt({"sub": self.standin.token_id, "exp": int(time.time()) + 3600})
            self.standin.auth_tokens.add(token)
            return api_pb2.AuthTokenGetResponse(token=token)

        await self._unary(stream, "AuthTokenGet", answer)

    async def AppGetOrCreate(self, stream: Stream) -> None:
        def answer(request: api_pb2.AppGetOrCreateRequest) -> api_pb2.AppGetOrCreateResponse:
            app_id = self.standin.apps.setdefault(request.app_name, f"ap-{uuid.uuid4().hex[:20]}")
            return api_pb2.AppGetOrCreateResponse(app_id=app_id)

        await self._unary(stream, "AppGetOrCreate", answer)

    async def EnvironmentGetOrCreate(self, stream: Stream) -> None:
        """The default environment; a registry image asks it for its image builder version."""
        def answer(request: api_pb2.EnvironmentGetOrCreateRequest
                   ) -> api_pb2.EnvironmentGetOrCreateResponse:
            return api_pb2.EnvironmentGetOrCreateResponse(
                environment_id="en-standin", metadata=api_pb2.EnvironmentMetadata(
                    name=request.deployment_name or "main",
                    settings=api_pb2.EnvironmentSettings(image_builder_version="2025.06")))

        await self._unary(stream, "EnvironmentGetOrCreate", answer)

    async def ImageFromId(self, stream: Stream) -> None:
        def answer(request: api_pb2.ImageFromIdRequest) -> api_pb2.ImageFromIdResponse:
            if request.image_id not in self.standin.images:
                raise GRPCError(Status.NOT_FOUND, f"Image {request.image_id} not found")
            return api_pb2.ImageFromIdResponse(image_id=request.image_id,
                                               metadata=api_pb2.ImageMetadata())

        await self._unary(stream, "ImageFromId", answer)

    async def ImageGetOrCreate(self, stream: Stream) -> None:
        """A registry image: "pulled" at once, with an empty filesystem."""
        def answer(request: api_pb2.ImageGetOrCreateRequest) -> api_pb2.ImageGetOrCreateResponse:
            commands = list(request.image.dockerfile_commands)
            image_id = next((i for i, c in self.standin.registry_images.items() if c == commands),
                            None)
            if image_id is None:
                image_id = self.standin.add_image()
                self.standin.registry_images[image_id] = commands
            return api_pb2.ImageGetOrCreateResponse(
                image_id=image_id, result=GenericResult(status=GenericResult.GENERIC_STATUS_SUCCESS),
                metadata=api_pb2.ImageMetadata())

        await self._unary(stream, "ImageGetOrCreate", answer)

    async def ImageDelete(self, stream: Stream) -> None:
        def answer(request: api_pb2.ImageDeleteRequest) -> empty_pb2.Empty:
            if self.standin.images.pop(request.image_id, "gone") == "gone":
                raise GRPCError(Status.NOT_FOUND, f"Image {request.image_id} not found")
            self.standin.deleted_images.append(request.image_id)
            return empty_pb2.Empty()

        await self._unary(stream, "ImageDelete", answer)

    # -- dicts (the adapter's checkpoint registry) -----------------------------------------

    async def DictGetOrCreate(self, stream: Stream) -> None:
        def answer(request: api_pb2.DictGetOrCreateRequest) -> api_pb2.DictGetOrCreateResponse:
            name = request.deployment_name
            if name not in self.standin.dict_ids:
                if request.object_creation_type != api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING:
                    raise GRPCError(Status.NOT_FOUND, f"Dict {name!r} not found")
                dict_id = f"di-{uuid.uuid4().hex[:20]}"
                self.standin.dict_ids[name] = dict_id
                self.standin.dicts[dict_id] = {}
            return api_pb2.DictGetOrCreateResponse(
                dict_id=self.standin.dict_ids[name], metadata=api_pb2.DictMetadata(name=name))

        await self._unary(stream, "DictGetOrCreate", answer)

    def _dict(self, dict_id: str) -> dict[bytes, bytes]:
        if dict_id not in self.standin.dicts:
            raise GRPCError(Status.NOT_FOUND, f"Dict {dict_id} not found")
        return self.standin.dicts[dict_id]

    async def DictUpdate(self, stream: Stream) -> None:
        def answer(request: api_pb2.DictUpdateRequest) -> api_pb2.DictUpdateResponse:
            entries = self._dict(request.dict_id)
            created = False
            for entry in request.updates:
                if request.if_not_exists and entry.key in entries:
                    continue
                created = created or entry.key not in entries
                entries[entry.key] = entry.value
            return api_pb2.DictUpdateResponse(created=created)

        await self._unary(stream, "DictUpdate", answer)

    async def DictGet(self, stream: Stream) -> None:
        def answer(request: api_pb2.DictGetRequest) -> api_pb2.DictGetResponse:
            entries = self._dict(request.dict_id)
            if request.key not in entries:
                return api_pb2.DictGetResponse(found=False)
            return api_pb2.DictGetResponse(found=True, value=entries[request.key])

        await self._unary(stream, "DictGet", answer)

    async def DictPop(self, stream: Stream) -> None:
        def answer(request: api_pb2.DictPopRequest) -> api_pb2.DictPopResponse:
            entries = self._dict(request.dict_id)
            if request.key not in entries:
                return api_pb2.DictPopResponse(found=False)
            return api_pb2.DictPopResponse(found=True, value=entries.pop(request.key))

        await self._unary(stream, "DictPop", answer)

    async def DictContents(self, stream: Stream) -> None:
        """Server streaming: one entry per key."""
        request = await stream.recv_message()
        self.standin.calls.append(Call(self.service, "DictContents", request))
        self._authenticate(stream)
        for key, value in list(self._dict(request.dict_id).items()):
            await stream.send_message(api_pb2.DictEntry(key=key if request.keys else b"",
                                                        value=value if request.values else b""))

    # -- volumes (V2: files in blocks, as the SDK moves them) -------------------------------

    async def VolumeGetOrCreate(self, stream: Stream) -> None:
        def answer(request: api_pb2.VolumeGetOrCreateRequest) -> api_pb2.VolumeGetOrCreateResponse:
            name = request.deployment_name
            volume = self.standin.volume_by_name(name)
            how = request.object_creation_type
            if volume is not None and how == api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS:
                raise GRPCError(Status.ALREADY_EXISTS, f"Volume {name!r} already exists")
            if volume is None:
                if how not in (api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING,
                               api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS):
                    raise GRPCError(Status.NOT_FOUND, f"Volume {name!r} not found")
                volume_id = f"vo-{uuid.uuid4().hex[:20]}"
                version = request.version or api_pb2.VOLUME_FS_VERSION_V1  # Modal's default
                volume = StandinVolume(volume_id, name, version,
                                       self.standin.root / "volumes" / volume_id, time.time())
                volume.folder.mkdir(parents=True)
                self.standin.volumes[volume_id] = volume
            elif request.version and request.version != volume.version:
                raise GRPCError(Status.INVALID_ARGUMENT,
                                f"Volume {name!r} has another VolumeFS version")
            return api_pb2.VolumeGetOrCreateResponse(
                volume_id=volume.id, version=volume.version, metadata=api_pb2.VolumeMetadata(
                    version=volume.version, name=volume.name,
                    creation_info=api_pb2.CreationInfo(created_at=volume.created_at)))

        await self._unary(stream, "VolumeGetOrCreate", answer)

    async def VolumeDelete(self, stream: Stream) -> None:
        def answer(request: api_pb2.VolumeDeleteRequest) -> empty_pb2.Empty:
            volume = self.standin._volume(request.volume_id)
            del self.standin.volumes[volume.id]
            shutil.rmtree(volume.folder)
            return empty_pb2.Empty()

        await self._unary(stream, "VolumeDelete", answer)

    def _v2(self, volume_id: str) -> StandinVolume:
        volume = self.standin._volume(volume_id)
        if volume.version != api_pb2.VOLUME_FS_VERSION_V2:
            raise GRPCError(Status.INVALID_ARGUMENT, f"Volume {volume.name!r} is not a V2 volume")
        return volume

    async def VolumeListFiles2(self, stream: Stream) -> None:
        """Server streaming: the entry of a file, or what is in a folder (all the way down
        with `recursive`), paths relative to the volume's root, as Modal lists them."""
        request = await stream.recv_message()
        self.standin.calls.append(Call(self.service, "VolumeListFiles2", request))
        self._authenticate(stream)
        volume = self._v2(request.volume_id)
        top = _in_volume(volume, request.path)
        if not os.path.lexists(top):
            raise GRPCError(Status.NOT_FOUND, f"No such file or directory: {request.path}")
        found = [top] if not top.is_dir() or top.is_symlink() else sorted(
            top.rglob("*") if request.recursive else top.iterdir())
        entries = []
        for path in found:
            info = path.lstat()
            kind = (api_pb2.FileEntry.SYMLINK if path.is_symlink() else
                    api_pb2.FileEntry.DIRECTORY if path.is_dir() else api_pb2.FileEntry.FILE)
            entries.append(api_pb2.FileEntry(
                path=path.relative_to(volume.folder).as_posix(), type=kind,
                mtime=int(info.st_mtime), size=info.st_size if kind == api_pb2.FileEntry.FILE
                else 0))
        for at in range(0, len(entries), LIST_BATCH):
            await stream.send_message(
                api_pb2.VolumeListFiles2Response(entries=entries[at:at + LIST_BATCH]))

    async def VolumeGetFile2(self, stream: Stream) -> None:
        def answer(request: api_pb2.VolumeGetFile2Request) -> api_pb2.VolumeGetFile2Response:
            volume = self._v2(request.volume_id)
            path = _in_volume(volume, request.path)
            if not path.is_file():
                raise GRPCError(Status.NOT_FOUND, f"No such file: {request.path}")
            size = path.stat().st_size
            start = min(request.start, size)
            length = size - start if not request.len else min(request.len, size - start)
            urls, at = [], start
            while at < start + length:
                end = min(start + length, (at // BLOCK_SIZE + 1) * BLOCK_SIZE)
                token = secrets.token_hex(16)
                self.standin.block_reads[token] = (path, at, end - at)
                urls.append(f"{self.standin.blocks_url}/get/{token}")
                at = end
            return api_pb2.VolumeGetFile2Response(get_urls=urls, size=size, start=start,
                                                  len=length)

        await self._unary(stream, "VolumeGetFile2", answer)

    async def VolumePutFiles2(self, stream: Stream) -> None:
        """Files from blocks: the blocks the stand-in lacks are answered with a put_url each;
        once it holds them all, the files are written (parents made)."""
        def answer(request: api_pb2.VolumePutFiles2Request) -> api_pb2.VolumePutFiles2Response:
            volume = self._v2(request.volume_id)
            missing = [api_pb2.VolumePutFiles2Response.MissingBlock(
                file_index=i, block_index=j,
                put_url=f"{self.standin.blocks_url}/put/{block.contents_sha256.hex()}")
                for i, file in enumerate(request.files) for j, block in enumerate(file.blocks)
                if not self.standin._block(block.contents_sha256).exists()]
            if missing:
                return api_pb2.VolumePutFiles2Response(missing_blocks=missing)
            targets = [_in_volume(volume, file.path) for file in request.files]
            for file, target in zip(request.files, targets, strict=True):
                if target.is_dir():
                    raise GRPCError(Status.INVALID_ARGUMENT, f"{file.path} is a directory")
                if request.disallow_overwrite_existing_files and target.exists():
                    raise GRPCError(Status.ALREADY_EXISTS, f"{file.path} already exists")
            for file, target in zip(request.files, targets, strict=True):
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as out:
                    for block in file.blocks:
                        out.write(self.standin._block(block.contents_sha256).read_bytes())
                    out.truncate(file.size)
                target.chmod(file.mode & 0o7777 or 0o644)
            return api_pb2.VolumePutFiles2Response()

        await self._unary(stream, "VolumePutFiles2", answer)

    async def VolumeRemoveFile2(self, stream: Stream) -> None:
        def answer(request: api_pb2.VolumeRemoveFile2Request) -> empty_pb2.Empty:
            volume = self._v2(request.volume_id)
            path = _in_volume(volume, request.path)
            if path == volume.folder or not os.path.lexists(path):
                raise GRPCError(Status.NOT_FOUND, f"No such file or directory: {request.path}")
            if path.is_dir() and not path.is_symlink():
                if not request.recursive and any(path.iterdir()):
                    raise GRPCError(Status.INVALID_ARGUMENT, f"{request.path} is not empty")
                shutil.rmtree(path)
            else:
                path.unlink()
            return empty_pb2.Empty()

        await self._unary(stream, "VolumeRemoveFile2", answer)

    # -- sandboxes (V2, and V1 for GPU sandboxes) ------------------------------------------

    async def SandboxCreateV2(self, stream: Stream) -> None:
        def answer(request: api_pb2.SandboxCreateV2Request) -> api_pb2.SandboxCreateV2Response:
            self.standin.creates.append(request)
            env: dict[str, str] = {}
            for source in request.secret_sources:
                env.update(source.env.contents)
            sandbox = self.standin._new_sandbox(
                2, request.app_id, request.definition,
                {t.tag_name: t.tag_value for t in request.tags}, env)
            return api_pb2.SandboxCreateV2Response(
                sandbox_id=sandbox.id, task_id=sandbox.task_id,
                metadata=self.standin._metadata(sandbox),
                command_router_access=api_pb2.CommandRouterAccess(
                    url=self.standin.router_url, jwt=sandbox.jwt))

        await self._unary(stream, "SandboxCreateV2", answer)

    async def SecretGetOrCreate(self, stream: Stream) -> None:
        """An ephemeral secret: how a V1 (GPU) sandbox receives its environment."""
        def answer(request: api_pb2.SecretGetOrCreateRequest) -> api_pb2.SecretGetOrCreateResponse:
            secret_id = f"st-{uuid.uuid4().hex[:20]}"
            self.standin.secrets[secret_id] = dict(request.env_dict)
            return api_pb2.SecretGetOrCreateResponse(secret_id=secret_id)

        await self._unary(stream, "SecretGetOrCreate", answer)

    async def SandboxCreate(self, stream: Stream) -> None:
        def answer(request: api_pb2.SandboxCreateRequest) -> api_pb2.SandboxCreateResponse:
            self.standin.creates.append(request)
            env: dict[str, str] = {}
            for secret_id in request.definition.secret_ids:
                if secret_id not in self.standin.secrets:
                    raise GRPCError(Status.NOT_FOUND, f"Secret {secret_id} not found")
                env.update(self.standin.secrets[secret_id])
            sandbox = self.standin._new_sandbox(
                1, request.app_id, request.definition,
                {t.tag_name: t.tag_value for t in request.tags}, env)
            return api_pb2.SandboxCreateResponse(sandbox_id=sandbox.id,
                                                 metadata=self.standin._metadata(sandbox))

        await self._unary(stream, "SandboxCreate", answer)

    async def _wait(self, request: api_pb2.SandboxWaitRequest) -> api_pb2.SandboxWaitResponse:
        sandbox = self.standin._sandbox(request.sandbox_id)
        if sandbox.running and request.timeout > 0:
            try:
                await asyncio.wait_for(sandbox.ended.wait(), min(request.timeout, 5))
            except TimeoutError:
                pass
        return api_pb2.SandboxWaitResponse(result=sandbox.result,
                                           metadata=self.standin._metadata(sandbox))

    async def SandboxWaitV2(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxWaitV2", self._wait)

    async def SandboxWait(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxWait", self._wait)

    async def _terminate(self, request: api_pb2.SandboxTerminateRequest
                         ) -> api_pb2.SandboxTerminateResponse:
        sandbox = self.standin._sandbox(request.sandbox_id)
        existing = sandbox.result
        await self.standin._end(sandbox, GenericResult.GENERIC_STATUS_TERMINATED)
        return api_pb2.SandboxTerminateResponse(existing_result=existing)

    async def SandboxTerminateV2(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxTerminateV2", self._terminate)

    async def SandboxTerminate(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxTerminate", self._terminate)

    async def SandboxListV2(self, stream: Stream) -> None:
        """Newest first, a page at a time, before `before_timestamp`; as Modal pages."""
        def answer(request: api_pb2.SandboxListRequest) -> api_pb2.SandboxListResponse:
            want = {t.tag_name: t.tag_value for t in request.tags}
            found = [s for s in self.standin.sandboxes.values()
                     if (request.include_finished or s.running)
                     and (not request.app_id or s.app_id == request.app_id)
                     and want.items() <= s.tags.items()
                     and (not request.before_timestamp or s.created_at < request.before_timestamp)]
            found.sort(key=lambda s: s.created_at, reverse=True)
            return api_pb2.SandboxListResponse(
                sandboxes=[self.standin._info(s) for s in found[:self.standin.page_size]])

        await self._unary(stream, "SandboxListV2", answer)

    def _tags_get(self, request: api_pb2.SandboxTagsGetRequest) -> api_pb2.SandboxTagsGetResponse:
        sandbox = self.standin._sandbox(request.sandbox_id)
        return api_pb2.SandboxTagsGetResponse(
            tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in sandbox.tags.items()])

    async def SandboxTagsGetV2(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxTagsGetV2", self._tags_get)

    async def SandboxTagsGet(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxTagsGet", self._tags_get)

    def _tags_set(self, request: api_pb2.SandboxTagsSetRequest) -> empty_pb2.Empty:
        sandbox = self.standin._sandbox(request.sandbox_id)
        sandbox.tags = {t.tag_name: t.tag_value for t in request.tags}
        return empty_pb2.Empty()

    async def SandboxTagsSetV2(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxTagsSetV2", self._tags_set)

    async def SandboxTagsSet(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxTagsSet", self._tags_set)

    def _task_id(self, request: api_pb2.SandboxGetTaskIdRequest) -> api_pb2.SandboxGetTaskIdResponse:
        sandbox = self.standin._sandbox(request.sandbox_id)
        if not sandbox.running:
            return api_pb2.SandboxGetTaskIdResponse(task_result=sandbox.result)
        return api_pb2.SandboxGetTaskIdResponse(task_id=sandbox.task_id)

    async def SandboxGetTaskIdV2(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxGetTaskIdV2", self._task_id)

    async def SandboxGetTaskId(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxGetTaskId", self._task_id)

    def _tunnels(self, request: api_pb2.SandboxGetTunnelsRequest
                 ) -> api_pb2.SandboxGetTunnelsResponse:
        """A tunnel for each port the create opened (`encrypted_ports`), at a host of
        TUNNEL_DOMAIN (nothing listens there: the tests read the URL, send no traffic)."""
        sandbox = self.standin._sandbox(request.sandbox_id)
        tunnels = [api_pb2.TunnelData(container_port=spec.port, port=443,
                                      host=f"{sandbox.id}-{spec.port}.{TUNNEL_DOMAIN}")
                   for spec in sandbox.definition.open_ports.ports]
        return api_pb2.SandboxGetTunnelsResponse(
            result=GenericResult(status=GenericResult.GENERIC_STATUS_SUCCESS), tunnels=tunnels)

    async def SandboxGetTunnelsV2(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxGetTunnelsV2", self._tunnels)

    async def SandboxGetTunnels(self, stream: Stream) -> None:
        await self._unary(stream, "SandboxGetTunnels", self._tunnels)

    async def SandboxGetCommandRouterAccess(self, stream: Stream) -> None:
        def answer(request: api_pb2.SandboxGetCommandRouterAccessRequest
                   ) -> api_pb2.SandboxGetCommandRouterAccessResponse:
            sandbox = (self.standin._sandbox(request.sandbox_id) if request.sandbox_id
                       else self.standin._by_task(request.task_id))
            return api_pb2.SandboxGetCommandRouterAccessResponse(
                url=self.standin.router_url, jwt=sandbox.jwt)

        await self._unary(stream, "SandboxGetCommandRouterAccess", answer)

    async def TaskGetCommandRouterAccess(self, stream: Stream) -> None:
        def answer(request: api_pb2.TaskGetCommandRouterAccessRequest
                   ) -> api_pb2.TaskGetCommandRouterAccessResponse:
            sandbox = self.standin._by_task(request.task_id)
            return api_pb2.TaskGetCommandRouterAccessResponse(url=self.standin.router_url,
                                                              jwt=sandbox.jwt)

        await self._unary(stream, "TaskGetCommandRouterAccess", answer)


class TaskRouter(_Service, TaskCommandRouterBase):
    """The worker's command router: exec and filesystem snapshots of one task."""

    service = "router"

    def _authenticate(self, stream: Stream) -> None:
        header = (stream.metadata or {}).get("authorization", "")
        if not any(header == f"Bearer {s.jwt}" for s in self.standin.sandboxes.values()):
            raise GRPCError(Status.UNAUTHENTICATED, "invalid command router token")

    def _live(self, task_id: str) -> Sandbox:
        sandbox = self.standin._by_task(task_id)
        if not sandbox.running:
            raise GRPCError(Status.NOT_FOUND, f"Task {task_id} has finished")
        return sandbox

    async def TaskExecStart(self, stream: Stream) -> None:
        async def answer(request: router_pb2.TaskExecStartRequest) -> router_pb2.TaskExecStartResponse:
            sandbox = self._live(request.task_id)
            if request.exec_id in sandbox.execs:  # idempotent retry
                return router_pb2.TaskExecStartResponse()
            env = {e.key: e.value for e in request.env} if request.env else {}
            for source in request.secret_sources:  # exec(env=...): an inline secret
                env.update(source.env.contents)
            loop = asyncio.get_running_loop()
            if request.HasField("pty_info") and request.pty_info.pty_type == \
                    api_pb2.PTYInfo.PTY_TYPE_SHELL:
                process, master = await self.standin._spawn_on_terminal(
                    sandbox, list(request.command_args), env, request.workdir,
                    request.pty_info)
                job = Exec(process, terminal=master)
                job.closed[1] = True  # a terminal's output is all on stdout, as on Modal
                loop.create_task(self._pump_terminal(job))
            elif request.HasField("pty_info"):
                raise GRPCError(Status.INVALID_ARGUMENT, "stand-in: pty_info of another type")
            else:
                process = await self.standin._spawn(sandbox, list(request.command_args), env,
                                                    capture=True, workdir=request.workdir)
                job = Exec(process)
                loop.create_task(self._pump(job, process.stdout, 0))
                loop.create_task(self._pump(job, process.stderr, 1))
            sandbox.execs[request.exec_id] = job
            sandbox.last_activity = time.time()
            loop.create_task(self._reap(sandbox, job, request.timeout_secs))
            return router_pb2.TaskExecStartResponse()

        await self._unary(stream, "TaskExecStart", answer)

    @staticmethod
    async def _pump(job: Exec, pipe: asyncio.StreamReader, fd: int) -> None:
        while True:
            chunk = await pipe.read(65536)
            async with job.changed:
                if chunk:
                    (job.stdout if fd == 0 else job.stderr).extend(chunk)
                else:
                    job.closed[fd] = True
                job.changed.notify_all()
            if not chunk:
                return

    @staticmethod
    async def _pump_terminal(job: Exec) -> None:
        """A terminal's output until every holder of its other end is gone (EIO)."""
        while True:
            try:
                chunk = await asyncio.to_thread(os.read, job.terminal, 65536)
            except OSError:
                chunk = b""
            async with job.changed:
                if chunk:
                    job.stdout.extend(chunk)
                else:
                    job.closed[0] = True
                job.changed.notify_all()
            if not chunk:
                await job.process.wait()
                os.close(job.terminal)
                return

    @staticmethod
    async def _reap(sandbox: Sandbox, job: Exec, timeout_secs: int) -> None:
        try:
            code = await asyncio.wait_for(job.process.wait(), timeout_secs or None)
        except TimeoutError:
            os.killpg(job.process.pid, signal.SIGKILL)
            code = await job.process.wait()
        if code < 0:
            job.exit_signal = -code
        else:
            job.exit_code = code
        sandbox.last_activity = time.time()
        job.finished.set()

    async def TaskExecStdinWrite(self, stream: Stream) -> None:
        """Bytes at `offset` of the exec's stdin (a retry of bytes already written is
        skipped), then, with `eof`, its end."""
        async def answer(request: router_pb2.TaskExecStdinWriteRequest
                         ) -> router_pb2.TaskExecStdinWriteResponse:
            job = self._exec(request.task_id, request.exec_id)
            pipe = job.process.stdin
            if job.terminal is not None:  # keystrokes, to the terminal (EOF means nothing)
                async with job.stdin_lock:
                    if request.offset > job.stdin_offset:
                        raise GRPCError(Status.INVALID_ARGUMENT, f"stdin offset {request.offset} "
                                        f"is past {job.stdin_offset}")
                    data = request.data[job.stdin_offset - request.offset:]
                    if data and not job.closed[0]:
                        with contextlib.suppress(OSError):
                            await asyncio.to_thread(_write_all, job.terminal, data)
                    job.stdin_offset += len(data)
                return router_pb2.TaskExecStdinWriteResponse()
            async with job.stdin_lock:
                if request.offset > job.stdin_offset:
                    raise GRPCError(Status.INVALID_ARGUMENT,
                                    f"stdin offset {request.offset} is past {job.stdin_offset}")
                data = request.data[job.stdin_offset - request.offset:]
                if data and pipe is not None and not pipe.is_closing():
                    try:
                        pipe.write(data)
                        await pipe.drain()
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the command stopped reading, as a pipe drops it
                job.stdin_offset += len(data)
                if request.eof and pipe is not None and not pipe.is_closing():
                    pipe.close()
            return router_pb2.TaskExecStdinWriteResponse()

        await self._unary(stream, "TaskExecStdinWrite", answer)

    def _exec(self, task_id: str, exec_id: str) -> Exec:
        sandbox = self.standin._by_task(task_id)
        job = sandbox.execs.get(exec_id)
        if job is None:
            raise GRPCError(Status.NOT_FOUND, f"exec {exec_id} not found")
        return job

    async def TaskExecStdioRead(self, stream: Stream) -> None:
        """Server streaming: the output from `offset` on, until the stream closes."""
        request = await stream.recv_message()
        self.standin.calls.append(Call(self.service, "TaskExecStdioRead", request))
        self._authenticate(stream)
        job = self._exec(request.task_id, request.exec_id)
        fd = int(request.file_descriptor)
        buffer = job.stdout if fd == 0 else job.stderr
        offset = request.offset
        while True:
            async with job.changed:
                await job.changed.wait_for(
                    lambda at=offset: len(buffer) > at or job.closed[fd])
                data = bytes(buffer[offset:])
                done = job.closed[fd]
            if data:
                await stream.send_message(router_pb2.TaskExecStdioReadResponse(data=data))
                offset += len(data)
            elif done:
                return

    async def TaskExecWait(self, stream: Stream) -> None:
        async def answer(request: router_pb2.TaskExecWaitRequest) -> router_pb2.TaskExecWaitResponse:
            job = self._exec(request.task_id, request.exec_id)
            await job.finished.wait()
            if job.exit_signal is not None:
                return router_pb2.TaskExecWaitResponse(signal=job.exit_signal)
            return router_pb2.TaskExecWaitResponse(code=job.exit_code)

        await self._unary(stream, "TaskExecWait", answer)

    async def TaskExecPoll(self, stream: Stream) -> None:
        def answer(request: router_pb2.TaskExecPollRequest) -> router_pb2.TaskExecPollResponse:
            job = self._exec(request.task_id, request.exec_id)
            if job.exit_signal is not None:
                return router_pb2.TaskExecPollResponse(signal=job.exit_signal)
            if job.exit_code is not None:
                return router_pb2.TaskExecPollResponse(code=job.exit_code)
            return router_pb2.TaskExecPollResponse()

        await self._unary(stream, "TaskExecPoll", answer)

    async def TaskSnapshotFilesystem(self, stream: Stream) -> None:
        def answer(request: router_pb2.TaskSnapshotFilesystemRequest
                   ) -> router_pb2.TaskSnapshotFilesystemResponse:
            sandbox = self._live(request.task_id)
            image_id = f"im-{uuid.uuid4().hex[:20]}"
            folder = self.standin.root / "images" / image_id
            shutil.copytree(sandbox.fs, folder, symlinks=True)
            self.standin.images[image_id] = folder
            return router_pb2.TaskSnapshotFilesystemResponse(image_id=image_id)

        await self._unary(stream, "TaskSnapshotFilesystem", answer)
