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
import stat
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
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
    # the profile's `compose:` (file as an absolute path, or project; service; allow), for
    # the compose backend
    compose: Mapping[str, Any] | None = None


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

    async def exec(
        self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run `argv`; `env`: variables added to this command's environment only (the core
        passes the trace context, TRACEPARENT, this way; the conformance kit checks it)."""
        raise self._unsupported("run commands")

    async def exec_stream(
        self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """A command's output as it comes, `("stdout" | "stderr", bytes)` pairs, then its
        ExecResult (whose stdout and stderr are empty: they were sent). A backend that
        cannot stream keeps this default: the whole output once the command ends."""
        result = await self.exec(ref, argv, timeout_s, env=env)
        for stream, data in (("stdout", result.stdout), ("stderr", result.stderr)):
            if data:
                yield stream, data
        yield ExecResult(result.exit_code, b"", b"", result.duration_s, result.timed_out)

    def logs(self, ref: str, follow: bool = False, tail: int | None = None) -> AsyncIterator[bytes]:
        raise self._unsupported("show logs")

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

    def shell_argv(self, ref: str) -> list[str]:
        """The command line that opens an interactive shell in the sandbox `ref` on this
        host's terminal (the dashboard's `e` runs it): a program of the backend's own that
        reaches the same engine or account as this adapter."""
        raise self._unsupported("open an interactive shell")


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
