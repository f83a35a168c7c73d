"""The adapter contract every backend implements.

The core speaks only to this interface. Adapters never import the core: they get plain
requests in and return plain results, and signal trouble with the exceptions below, which
the core maps to the CLI's exit codes in one place (`sandboxer.core.rules.errors`).
"""

from __future__ import annotations

import abc
import enum
import errno
import os
import posixpath
import stat
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar


class Capability(enum.StrEnum):
    """What a backend can do beyond create/get/list/destroy. The front ends offer only these."""

    EXEC = "exec"
    LOGS = "logs"
    PAUSE = "pause"
    SNAPSHOT = "snapshot"
    MEMORY_CHECKPOINT = "memory-checkpoint"
    SET_DEADLINE = "set-deadline"
    METRICS = "metrics"
    SERVICES = "services"  # containers beside the main one, sharing its network (a pod)
    # what a profile may ask of the sandbox itself; the core refuses the request (nothing
    # written) on a backend that does not declare it, rather than ignore it
    READ_ONLY_ROOT = "read-only-root"  # `read_only: true`: a read-only root, a writable /tmp
    RUN_AS_USER = "run-as-user"  # `user:` the main process and every exec run as
    SHELL = "shell"  # an interactive shell a person's terminal can be handed to (shell_argv)
    # work inside the sandbox (exec's env, cwd and stdin come with EXEC; its `user=` needs
    # RUN_AS_USER)
    FILES = "files"  # files and trees in and out, list/stat/remove/mkdir/rename
    PROCESSES = "processes"  # background processes (needs EXEC and a POSIX sh in the sandbox)
    # reach into it (docs/terminals-and-ports.md)
    # `isolation: gvisor`: the sandbox runs under gVisor (runsc), a kernel of its own
    # (docs/security.md); a backend without it refuses such a profile at validation
    ISOLATION_GVISOR = "isolation-gvisor"
    PTY = "pty"  # a terminal: open_pty, a program on a pseudo-terminal, resizable
    PORTS = "ports"  # a sandbox's TCP ports reachable from this host: port_endpoints/expose_port
    # named storage that outlives a sandbox (docs/volumes.md): create_volume, remove_volume,
    # volume_size, list_volumes, open_volume/close_volume, and CreateRequest.mounts
    VOLUMES = "volumes"


# Labels sbx puts on every backend object; the `sbx.` prefix is reserved for them.
LABEL_ID = "sbx.id"
LABEL_INSTALL = "sbx.install"
LABEL_HARD_DEADLINE = "sbx.hard-deadline"
LABEL_CHECKPOINT = "sbx.checkpoint"
LABEL_SERVICE = "sbx.service"  # a service container: its name in the profile
LABEL_POD = "sbx.pod"  # a service container: the backend ref of the main container
# every container, network, volume and checkpoint image of a Compose project (the compose
# backend): the sandbox's backend ref; the docker backend leaves such objects alone
LABEL_COMPOSE = "sbx.compose"
LABEL_POOL = "sbx.pool"  # a warm pool member: the profile whose pool it was made for
LABEL_VOLUME = "sbx.volume"  # a volume (or a helper reaching into one): the volume's id
RESERVED_LABEL_PREFIX = "sbx."


def one_line(exc: BaseException) -> str:
    """The one-line message a person sees for any error, never a traceback: its text with
    every run of whitespace (newlines too) made one space, else its class's name."""
    return " ".join(str(exc).split()) or type(exc).__name__


class AdapterError(Exception):
    """The backend refused or failed an operation (exit 1)."""


class BackendUnavailable(AdapterError):
    """Engine unreachable, credentials missing or SDK absent (exit 5). Say how to fix it."""


class InvalidRequest(AdapterError):
    """The request or the backend's own configuration is wrong (exit 2; nothing written)."""


class CapabilityNotSupported(AdapterError):
    """The backend does not offer this action (exit 4)."""


class ArtifactRefused(AdapterError):
    """An imported artifact is not what its archive says it is (exit 2; nothing loaded)."""


class BackendObjectGone(AdapterError):
    """The backend no longer has the object (it was removed out of band)."""


class NoSuchPath(AdapterError):
    """A path in the sandbox does not exist (exit 3, HTTP 404)."""


@dataclass(frozen=True)
class ResourceLimits:
    cpu: float | None = None
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    pids: int | None = None
    gpu: str | None = None


@dataclass(frozen=True)
class ServiceSpec:
    """One `services:` entry of a profile."""

    name: str
    image: str
    command: Sequence[str] | None = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class CreateRequest:
    """Everything a backend needs to make one sandbox; built by the core from a resolved profile."""

    sandbox_id: str
    labels: Mapping[str, str]
    image: str | None = None
    command: Sequence[str] | None = None
    resources: ResourceLimits = field(default_factory=ResourceLimits)
    network: str = "none"
    network_allow: Sequence[str] = ()
    # may hold secrets; while tracing is on, also TRACEPARENT, added after `validate` (a
    # backend that cannot set a sandbox's environment drops that, and refuses only the rest)
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    hard_deadline: datetime | None = None
    # the soft deadline: a backend with a timer of its own (E2B) ends the sandbox there even
    # if sbx never runs again; `set_deadline` moves it on extend
    deadline: datetime | None = None
    # the profile's idle limit: a backend with an idle clock of its own (Modal) gets it, and
    # `touch` tells it about activity sbx records
    idle: timedelta | None = None
    services: Sequence[ServiceSpec] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    # asked only of a backend declaring READ_ONLY_ROOT / RUN_AS_USER
    read_only: bool = False
    user: str | None = None  # "UID", "UID:GID", "NAME" or "NAME:GROUP"
    isolation: str = "container"  # the profile's; "gvisor" asked only with ISOLATION_GVISOR
    # the profile's `compose:` (file as an absolute path, or project; service; allow), for
    # the compose backend
    compose: Mapping[str, Any] | None = None
    # the profile's `ports:`, asked only of a backend declaring PORTS: TCP ports in the
    # sandbox made reachable from this host at `publish_address` (loopback unless the
    # profile opts into another address); a backend that publishes chooses the host port
    ports: Sequence[int] = ()
    publish_address: str = "127.0.0.1"
    # volumes to mount, asked only of a backend declaring VOLUMES (docs/volumes.md)
    mounts: Sequence[VolumeMountSpec] = ()


@dataclass(frozen=True)
class VolumeMountSpec:
    """A volume in a sandbox: the backend's reference of the volume (create_volume's)."""

    ref: str
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class BackendObject:
    """What the backend reports about one sandbox it holds."""

    ref: str
    labels: Mapping[str, str]
    status: str
    running: bool
    created_at: datetime | None = None
    # when the backend last started it again after it had stopped (an engine restart
    # brings it back); None while it has run without a stop since it was made
    restarted_at: datetime | None = None


@dataclass(frozen=True)
class Artifact:
    """A checkpoint's backend artifact (on Docker, a committed image)."""

    ref: str
    labels: Mapping[str, str] = field(default_factory=dict)
    size_bytes: int | None = None
    # False: an artifact no installation holds any more (on Docker, an untagged checkpoint
    # image no container uses), which reconcile removes whatever its labels say
    held: bool = True


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool = False


# What a command reads on its standard input: bytes, or chunks as they come (streamed, never
# gathered whole); None: its standard input is empty (closed at once).
Stdin = bytes | AsyncIterator[bytes] | None


async def stdin_chunks(stdin: Stdin) -> AsyncIterator[bytes]:
    """`stdin` as chunks, whichever form it came in (empty chunks left out)."""
    if stdin is None:
        return
    if isinstance(stdin, bytes | bytearray | memoryview):
        if stdin:
            yield bytes(stdin)
        return
    async for chunk in stdin:
        if chunk:
            yield bytes(chunk)


class CallerStdin:
    """The caller's stdin as chunks, for an adapter to send on. A failure of the caller's own
    iterator ends the input (the command's stdin is closed all the same) and is kept, to be
    raised once the command has ended (`raise_if_failed`): never taken for a short input."""

    def __init__(self, stdin: Stdin) -> None:
        self._stdin = stdin
        self.error: Exception | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in stdin_chunks(self._stdin):
                yield chunk
        except Exception as exc:
            self.error = exc

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


def exec_options(cwd: str | None = None, user: str | None = None,
                 stdin: Stdin = None) -> dict[str, Any]:
    """The keyword options of `exec` that were given: the core passes only these, so an
    adapter written before cwd/user/stdin existed still runs a command without them."""
    return {k: v for k, v in (("cwd", cwd), ("user", user), ("stdin", stdin)) if v is not None}


@dataclass(frozen=True)
class FileInfo:
    """One entry of a sandbox's filesystem."""

    path: str  # absolute path in the sandbox
    name: str  # base name
    type: str  # "file" | "dir" | "symlink" | "other"
    size: int
    mode: int  # permission bits, e.g. 0o644
    mtime: datetime  # aware, UTC
    target: str | None = None  # a symlink's target


@dataclass(frozen=True)
class Endpoint:
    """Where a sandbox's port is reached from this host (Capability.PORTS)."""

    port: int  # the port inside the sandbox
    host: str  # e.g. "127.0.0.1" for a port Docker published on loopback
    host_port: int
    scheme: str = "http"  # "http" or "https" (a cloud backend's tunnel)
    # headers a client must send (a cloud backend's tunnel token); never logged
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = {"http": 80, "https": 443}.get(self.scheme)
        return (f"{self.scheme}://{host}" if self.host_port == default
                else f"{self.scheme}://{host}:{self.host_port}")


class PtyChannel(abc.ABC):
    """A program on a pseudo-terminal in a sandbox (Capability.PTY), as the adapter opened
    it. One reader (the core's pump) and any number of writers; the core keeps the replay
    buffer, the sessions and the events, the adapter only moves bytes."""

    @abc.abstractmethod
    async def read(self) -> bytes:
        """The terminal's next output, as raw bytes as soon as there are any; b"" once the
        program has ended and its output is drained (then `exit_code` is known, or None if
        the backend cannot tell)."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Keystrokes (raw bytes, as a terminal sends them) to the program's terminal."""

    @abc.abstractmethod
    async def resize(self, cols: int, rows: int) -> None:
        """The terminal's new size; the program sees SIGWINCH (`stty size` changes)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the program (its terminal hangs up) and release what the channel holds;
        idempotent, and safe after the program ended by itself."""

    exit_code: int | None = None


@dataclass(frozen=True)
class MetricSample:
    """One reading. None means the backend does not know, never zero by default."""

    time: datetime
    cpu_pct: float | None = None  # of one core: 200 = two cores busy
    memory_bytes: int | None = None
    memory_limit: int | None = None
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None
    pids: int | None = None


@dataclass(frozen=True)
class Health:
    reachable: bool
    credentials: bool
    detail: str


class Adapter(abc.ABC):
    """One backend. Operations are idempotent where the contract says so (destroy)."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    # A test double (the stub) says so, and `sbx doctor` shows it as one.
    test_double: ClassVar[bool] = False
    # Objects live in an account every installation reaches (a cloud), not on one host's
    # engine: in a fleet, any reaper may end an expired one, whoever made it.
    shared: ClassVar[bool] = False

    def supports(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def _unsupported(self, what: str) -> CapabilityNotSupported:
        return CapabilityNotSupported(f"the {self.name} backend cannot {what}")

    @abc.abstractmethod
    async def create(self, request: CreateRequest) -> BackendObject:
        """Make and start the sandbox, carrying `request.labels`. Return its reference."""

    @abc.abstractmethod
    async def destroy(self, ref: str, *, services: bool = True) -> None:
        """Remove the sandbox. Already gone, or being removed, is success. `services=False`:
        the core knows it was made without services (its profile declared none), so a
        backend that would look for them beside it need not."""

    @abc.abstractmethod
    async def get(self, ref: str) -> BackendObject | None:
        """The object, or None when the backend no longer has it."""

    @abc.abstractmethod
    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        """Every object carrying all of `labels` (all pages)."""

    @abc.abstractmethod
    async def health(self) -> Health:
        """Reachable? Credentials present? Never raises."""

    async def instance_id(self) -> str | None:
        """Which engine or account this adapter reaches (None: only one can exist). A sandbox
        made on one instance is never judged by an adapter that reaches another."""
        return None

    async def change_marker(self, labels: Mapping[str, str], since: float) -> str | None:
        """A marker that stays the same while nothing carrying `labels` changes on the backend
        after `since` (a Unix time), and changes when something may have. The reaper notes it
        after a full look that found nothing to do, and while it is unchanged (and so is the
        database) skips the full look until its next full reconcile is due. None, the
        default: the backend cannot tell, so every cycle looks in full."""
        return None

    async def touch(self, ref: str) -> None:  # noqa: B027 (optional hook)
        """Activity sbx recorded (`sbx touch`): a backend with an idle clock of its own resets
        it, so it never ends a sandbox sbx still counts as in use."""

    def sees(self, ref: str) -> bool:
        """Whether `list()` in this process covers the sandbox `ref` (a per-profile key that
        is not set here hides it). One it does not see is never judged gone by its absence."""
        return True

    def validate(self, request: CreateRequest) -> None:  # noqa: B027 (optional hook)
        """Refuse (CapabilityNotSupported) what this backend cannot enforce, before anything
        is written: a limit silently ignored is a sandbox that is not what was asked for."""

    async def ensure_available(self) -> None:
        """Raise BackendUnavailable with a way out, before the core writes an intent."""
        health = await self.health()
        if not (health.reachable and health.credentials):
            raise BackendUnavailable(health.detail)

    async def ensure_isolation(self, isolation: str) -> None:  # noqa: B027 (optional hook)
        """Raise BackendUnavailable, naming the fix, when the engine cannot contain a sandbox as
        `isolation` asks (a backend declaring ISOLATION_GVISOR: no runsc runtime), before the
        core writes an intent: a sandbox never falls back to a weaker isolation."""

    async def exec(
        self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
        env: Mapping[str, str] | None = None, *, cwd: str | None = None,
        user: str | None = None, stdin: Stdin = None,
    ) -> ExecResult:
        """Run `argv`; `env`: variables added to this command's environment only (the core
        passes the trace context, TRACEPARENT, this way; the conformance kit checks it).
        `cwd`: an absolute folder to run in; `user`: whom to run as ("UID", "UID:GID",
        "NAME", "NAME:GROUP"; a backend without RUN_AS_USER raises CapabilityNotSupported
        naming itself); `stdin`: written to the command's standard input, then closed
        (streamed: an iterator is never gathered whole; None: empty).
        On `timeout_s` the exec's whole process tree is ended and, within 0.5 s of the
        deadline, an ExecResult comes back with exit code 124, `timed_out=True` and the output
        produced until then (stderr ending with the "sbx: timed out after Ns" note)."""
        raise self._unsupported("run commands")

    async def exec_stream(
        self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
        env: Mapping[str, str] | None = None, *, cwd: str | None = None,
        user: str | None = None, stdin: Stdin = None,
    ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """A command's output as it comes, `("stdout" | "stderr", bytes)` pairs, then its
        ExecResult (whose stdout and stderr are empty: they were sent). A backend that
        cannot stream keeps this default: the whole output once the command ends. The
        options are exec's."""
        result = await self.exec(ref, argv, timeout_s, env=env,
                                 **exec_options(cwd, user, stdin))
        for stream, data in (("stdout", result.stdout), ("stderr", result.stderr)):
            if data:
                yield stream, data
        yield ExecResult(result.exit_code, b"", b"", result.duration_s, result.timed_out)

    def logs(self, ref: str, follow: bool = False, tail: int | None = None) -> AsyncIterator[bytes]:
        raise self._unsupported("show logs")

    # -- files (Capability.FILES) -----------------------------------------------------------
    # Paths are absolute POSIX paths in the sandbox (the core refuses others before it calls).
    # The defaults below run POSIX tools (sh, tar, find, stat, rm, mkdir, mv) through `exec`
    # with streamed stdin, so they work in any image that has them (busybox and Debian do); a
    # backend with an API of its own for files (Docker's archive API, SFTP, E2B's files) may
    # override them.

    async def _files_sh(self, ref: str, script: str, *args: str,
                        stdin: Stdin = None) -> ExecResult:
        """`sh -c script sh args...` (arguments never spliced into the script), its output
        gathered; a missing path (the script's `exit 3`) raised as NoSuchPath."""
        if not self.supports(Capability.FILES):
            raise self._unsupported("read or write files")
        options = {"stdin": stdin} if stdin is not None else {}
        result = await self.exec(ref, ["sh", "-c", script, "sh", *args], **options)
        _files_check(result, args[0] if args else "")
        return result

    async def put_archive(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> None:
        """Unpack the tar stream into the folder `path` (made, with parents, if missing)."""
        await self._files_sh(ref, _PUT_ARCHIVE, path, stdin=tar)

    async def get_archive(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """`path` (a file or a folder) as a tar stream whose one top entry is its base name.
        NoSuchPath when it does not exist."""
        if not self.supports(Capability.FILES):
            raise self._unsupported("read or write files")
        parent, name = posixpath.split(posixpath.normpath(path))
        stderr = bytearray()
        async for item in self.exec_stream(ref, ["sh", "-c", _GET_ARCHIVE, "sh", path,
                                                 parent or "/", name or "."]):
            if isinstance(item, ExecResult):
                _files_check(ExecResult(item.exit_code, b"", bytes(stderr), item.duration_s,
                                        item.timed_out), path)
            elif item[0] == "stdout":
                yield item[1]
            elif len(stderr) < 4096:
                stderr += item[1]

    async def list_files(self, ref: str, path: str, depth: int = 1) -> list[FileInfo]:
        """What is under the folder `path`, `depth` levels down (a file: itself).
        NoSuchPath when it does not exist."""
        if not self.supports(Capability.FILES):
            raise self._unsupported("read or write files")
        result = await self.exec(ref, ["sh", "-c", _LIST, "sh", path, str(max(1, depth)),
                                       str(LIST_MAX_BYTES + 1)])
        if len(result.stdout) > LIST_MAX_BYTES:  # cut in the sandbox: never held whole
            raise InvalidRequest(f"{path}: the listing passes {LIST_MAX_BYTES >> 20} MiB: "
                                 "list fewer levels or a folder further down")
        _files_check(result, path)
        return _parse_listing(result.stdout)

    async def stat_file(self, ref: str, path: str) -> FileInfo | None:
        """`path` itself (a symbolic link is not followed), or None when it does not exist."""
        try:
            result = await self._files_sh(ref, _STAT, path)
        except NoSuchPath:
            return None
        found = _parse_listing(result.stdout)
        return found[0] if found else None

    async def remove_file(self, ref: str, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a link or an empty folder (`recursive`: a folder and all in it).
        NoSuchPath when it does not exist."""
        await self._files_sh(ref, _REMOVE, path, "1" if recursive else "")

    async def make_dir(self, ref: str, path: str, *, parents: bool = True) -> None:
        """Make the folder `path` (`parents`: its missing parents too, and an existing folder
        is success). NoSuchPath when its parent is missing and `parents` is False."""
        try:
            await self._files_sh(ref, _MKDIR, path, "1" if parents else "")
        except NoSuchPath:
            raise NoSuchPath(f"{posixpath.dirname(path)} does not exist in the sandbox (make "
                             "it first, or make the parents too)") from None

    async def rename_file(self, ref: str, src: str, dst: str) -> None:
        """Move `src` to `dst` (into it, when `dst` is an existing folder). NoSuchPath when
        `src` does not exist."""
        await self._files_sh(ref, _RENAME, src, dst)

    async def set_deadline(self, ref: str, deadline: datetime) -> None:
        """Make the backend end the sandbox at `deadline` by itself (E2B's timeout, say)."""
        raise self._unsupported("set a deadline of its own")

    async def pause(self, ref: str) -> None:
        raise self._unsupported("pause")

    async def resume(self, ref: str) -> None:
        raise self._unsupported("resume")

    async def snapshot(self, ref: str, labels: Mapping[str, str]) -> Artifact:
        """Save the sandbox's filesystem as an artifact carrying `labels`."""
        raise self._unsupported("snapshot")

    async def restore(self, artifact: str, request: CreateRequest) -> BackendObject:
        """A new sandbox from an artifact (as create, with the artifact as its image)."""
        raise self._unsupported("restore")

    async def delete_artifact(self, artifact: str) -> None:
        """Remove an artifact; already gone is success."""
        raise self._unsupported("delete checkpoints")

    async def list_artifacts(self, labels: Mapping[str, str]) -> list[Artifact]:
        raise self._unsupported("list checkpoints")

    async def missing_artifacts(self, artifacts: Sequence[str]) -> set[str]:
        """Those of `artifacts` the backend no longer has (checked now). A backend that
        cannot tell answers none: its restore says so when it fails."""
        return set()

    async def export_artifact(self, artifact: str, path: str) -> None:
        """Write the artifact to a file another host can import."""
        raise self._unsupported("export checkpoints")

    async def import_artifact(self, path: str, checkpoint_id: str, *, install: str | None = None,
                              as_checkpoint: str | None = None) -> str:
        """Load an exported artifact, refusing (ArtifactRefused) one that is not exactly the
        artifact of `checkpoint_id` before anything is loaded; held by the installation
        `install`, as the checkpoint `as_checkpoint` (a re-import under a new id) if given."""
        raise self._unsupported("import checkpoints")

    def metrics(self, ref: str) -> AsyncIterator[MetricSample]:
        """Samples as the backend produces them, until the caller stops reading."""
        raise self._unsupported("report metrics")

    async def close(self) -> None:  # noqa: B027 (optional hook, not abstract)
        """Release clients and threads."""

    # -- reach into it (Capability.PTY, Capability.PORTS) -----------------------------------

    async def open_pty(self, ref: str, argv: Sequence[str], *, cols: int = 80, rows: int = 24,
                       env: Mapping[str, str] | None = None, cwd: str | None = None,
                       ) -> PtyChannel:
        """Start `argv` in the sandbox on a new pseudo-terminal of `cols` x `rows` (TERM set
        to xterm-256color unless `env` names one), with exec's meaning of `env` and `cwd`.
        The core chooses the argv (a login shell when the caller names none)."""
        raise self._unsupported("open a terminal")

    async def port_endpoints(self, ref: str) -> dict[int, Endpoint]:
        """Where each of the sandbox's reachable ports is reached from this host, by the
        port inside the sandbox: those the profile declared and those `expose_port` added."""
        raise self._unsupported("publish ports")

    async def expose_port(self, ref: str, port: int) -> Endpoint:
        """Make `port` reachable at run time; idempotent (an exposed port's endpoint again).
        A backend that can publish only at create (Docker) raises CapabilityNotSupported
        saying so, and the core names the profile's `ports:` instead."""
        raise self._unsupported("publish a port while the sandbox runs")

    # -- volumes (Capability.VOLUMES, docs/volumes.md) -----------------------------------------

    async def create_volume(self, volume_id: str, labels: Mapping[str, str]) -> str:
        """Make an empty volume carrying `labels`; its reference."""
        raise self._unsupported("keep volumes")

    async def remove_volume(self, ref: str) -> None:
        """Remove a volume and what it holds (already gone is success)."""
        raise self._unsupported("keep volumes")

    async def volume_size(self, ref: str) -> int | None:
        """Bytes the volume holds, as far as the backend can tell (None: it cannot)."""
        return None

    async def list_volumes(self, labels: Mapping[str, str]) -> list[str]:
        """References of the volumes carrying every one of `labels`."""
        raise self._unsupported("keep volumes")

    async def open_volume(self, ref: str, labels: Mapping[str, str]) -> str:
        """A short-lived object of this backend with the volume mounted at /volume, on which
        the file primitives (put_archive, get_archive) work; close_volume removes it."""
        raise self._unsupported("reach a volume's files without a sandbox")

    async def close_volume(self, helper: str) -> None:
        raise self._unsupported("reach a volume's files without a sandbox")

    def shell_argv(self, ref: str) -> list[str]:
        """The command line that opens an interactive shell in the sandbox `ref` on this
        host's terminal (the dashboard's `e` runs it): a program of the backend's own that
        reaches the same engine or account as this adapter."""
        raise self._unsupported("open an interactive shell")


# An exec that may need ending carries a mark in its environment: EXEC_MARK=<a fresh id>.
# What the command starts inherits it, so a timeout finds the exec's whole tree, even what
# left its process group (setsid, a daemon). Every backend with a shell in the sandbox kills
# with the one script below (docs/security.md, "exec --timeout").
EXEC_MARK = "SBX_EXEC_ID"
# Run in the sandbox (or on the host, for ssh) when an exec times out. $0: the mark, $1:
# EXEC_MARK, $2 (optional): the command's process group, killed first (it stops forking).
# Then, in rounds until one finds none, every process whose environment carries the mark
# (GNU or busybox grep, NUL as the line end). Exit 0 when it killed something.
KILL_MARKED = r"""found=1
[ -n "$2" ] && kill -KILL -- "-$2" 2>/dev/null && found=0
for round in 1 2 3 4 5; do
  left=
  for f in $(grep -lzxF "$1=$0" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; kill -KILL "${p%/environ}" 2>/dev/null && found=0 left=1
  done
  [ -z "$left" ] && break
done
exit $found"""


# -- the default FILES primitives' scripts (POSIX sh; busybox and GNU tools alike) ----------
# exit 3: the path ($1) does not exist; exit 4: the request does not fit what is there.
_MISSING_EXIT, _REFUSED_EXIT = 3, 4
_EXISTS = 'test -e "$1" || test -L "$1" || exit 3; '
# -o: files belong to whoever extracts them, not to the uid/gid recorded in the archive
_PUT_ARCHIVE = 'mkdir -p -- "$1" && cd -- "$1" && exec tar -x -o -f -'
_GET_ARCHIVE = _EXISTS + 'cd -- "$2" && exec tar -c -f - -- "$3"'
# one record per entry: "<raw mode in hex> <size> <mtime>\n<path>\0<link target>\0"
_ONE = ('stat -c "%f %s %Y" -- "$f" || exit 1; printf "%s\\0" "$f"; '
        'if [ -L "$f" ]; then readlink -- "$f"; fi; printf "\\0"')
# a folder's records are cut after $3 bytes (head -c), find's own exit kept (through fd 3)
_LIST = (_EXISTS + 'if [ -d "$1" ]; then d="${1%/}/"; '
         '{ s=$( { { find "$d" -mindepth 1 -maxdepth "$2" -exec sh -c '
         '\'for f; do ' + _ONE + '; done\' sh {} +; echo $? >&3; } '
         '| head -c "$3" >&4; } 3>&1 ); } 4>&1; exit "$s"; '
         'else f="$1"; ' + _ONE + '; fi')
LIST_MAX_BYTES = 64 << 20  # the most of a listing's records gathered from the sandbox
_STAT = _EXISTS + 'f="$1"; ' + _ONE
_REMOVE = (_EXISTS + 'if [ -n "$2" ]; then exec rm -rf -- "$1"; fi; '
           'if [ -d "$1" ] && [ ! -L "$1" ]; then rmdir -- "$1" 2>/dev/null || '
           '{ echo "$1 is a folder that is not empty (remove it recursively)" >&2; exit 4; }; '
           'else exec rm -f -- "$1"; fi')
_MKDIR = ('if [ -n "$2" ]; then exec mkdir -p -- "$1"; fi; '
          'p=$(dirname -- "$1"); [ -d "$p" ] || exit 3; '
          'if [ -e "$1" ] || [ -L "$1" ]; then echo "$1 already exists" >&2; exit 4; fi; '
          'exec mkdir -- "$1"')
_RENAME = _EXISTS + 'exec mv -f -- "$1" "$2"'


def _files_check(result: ExecResult, path: str) -> None:
    """Raise what a default FILES script's exit says."""
    if result.exit_code == 0:
        return
    said = " ".join(result.stderr.decode(errors="replace").split())[:300]
    if result.exit_code == _MISSING_EXIT:
        raise NoSuchPath(f"{path} does not exist in the sandbox")
    if result.exit_code == _REFUSED_EXIT:
        raise InvalidRequest(said or f"{path}: refused")
    raise AdapterError(f"{path}: {said or f'exit {result.exit_code}'}")


def _file_type(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def _parse_listing(out: bytes) -> list[FileInfo]:
    """The records the scripts above print (see `_ONE`)."""
    parts = out.split(b"\0")
    found = []
    for i in range(0, len(parts) - 2, 2):
        head, _, name = parts[i].partition(b"\n")
        fields = head.split()
        if len(fields) != 3:
            continue
        mode, size, mtime = int(fields[0], 16), int(fields[1]), int(fields[2])
        path = posixpath.normpath(name.decode(errors="surrogateescape"))
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        kind = _file_type(mode)
        target = parts[i + 1].rstrip(b"\n").decode(errors="surrogateescape") \
            if kind == "symlink" else None
        found.append(FileInfo(path=path, name=posixpath.basename(path) or "/", type=kind,
                              size=size, mode=stat.S_IMODE(mode),
                              mtime=datetime.fromtimestamp(mtime, UTC), target=target))
    return sorted(found, key=lambda info: info.path)


APP_NAME = "sandboxer"
FAILPOINT_ENV = "SBX_FAILPOINT"


def failpoint(name: str) -> None:
    """`SBX_FAILPOINT=NAME` makes the process kill itself (SIGKILL) at NAME, or stop itself
    (SIGSTOP) with `NAME:stop`: crash tests stop at exact steps. Every name is listed in
    sandboxer.core.rules.failpoints.POINTS (the core's own points go through it)."""
    wanted = os.environ.get(FAILPOINT_ENV)
    if not wanted:
        return
    point, _, action = wanted.partition(":")
    if point != name:
        return
    import signal
    import threading

    # Sent to this thread, not the process: a signal to the process may be taken by another
    # thread while this one runs on (into the next transaction) before the group stops.
    signal.pthread_kill(threading.get_ident(),
                        signal.SIGSTOP if action == "stop" else signal.SIGKILL)


# The folder a library client named (`sandboxer.Sandboxer(home=...)`), for the operations it
# runs: several clients with their own folders may share one process.
HOME_OVERRIDE: ContextVar[str | None] = ContextVar("sbx_home_override", default=None)


def state_folder() -> Path:
    """`$SBX_HOME`, else the platform's user data folder; created 0700, and refused
    (InvalidRequest, exit 2) unless it is a folder of this user that no one else can write
    to: its files carry the event log, the socket every command's environment goes through,
    and adapters' own state. Where sbx keeps its state (sandboxer.core.rules.settings.sbx_home) and an adapter
    its own files."""
    raw = HOME_OVERRIDE.get() or os.environ.get("SBX_HOME")
    if raw:
        home = Path(raw).expanduser()
    else:
        from platformdirs import user_data_path

        home = user_data_path(APP_NAME)
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        pass  # not a folder: said below
    except OSError as exc:
        raise InvalidRequest(f"state folder {home} cannot be created: "
                             f"{exc.strerror or exc}") from None
    check_state_folder(home)
    return home


def state_folder_problem(path: Path | str) -> str | None:
    """What makes `path` unfit to hold sbx's state, or None: not a folder, owned by another
    user, or writable by group or others (anyone who can write there can plant the socket
    commands hand their environment to). The launchers apply the same rule before they
    connect."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return (f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"run chmod go-w {path}")
    return None


def check_state_folder(path: Path | str) -> None:
    problem = state_folder_problem(path)
    if problem:
        raise InvalidRequest(f"state folder {path} {problem}")


def open_state_file(path: Path | str, flags: int, mode: int = 0o600) -> int:
    """os.open for a file sbx keeps in its state folder: a symbolic link planted there is
    refused (InvalidRequest, exit 2), never followed; `os.O_EXCL` with `os.O_CREAT` for a
    temporary, which then must not exist at all."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidRequest(f"{path} is a symbolic link; sbx does not follow links in "
                                 "its state folder (remove it)") from None
        raise
