"""The typed records the library returns. Each is built from the JSON shape the CLI prints
(docs/cli.md, "JSON"), which the HTTP service sends too, so every transport gives the same
records; `to_dict()` gives that shape back."""

from __future__ import annotations

import base64
import contextlib
import gc
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Literal, TypeVar, overload

from sandboxer.core.rules.catalog import EventType, Reason
from sandboxer.core.rules.states import State


@overload
def _time(text: str) -> datetime: ...
@overload
def _time(text: None) -> None: ...
@overload
def _time(text: str | None) -> datetime | None: ...
def _time(text: str | None) -> datetime | None:
    if text is None:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


_pauses = 0  # listings building records now, in any thread (building_many)
_pauses_lock = threading.Lock()
_resume_collector = False


@contextlib.contextmanager
def building_many() -> Iterator[None]:
    """The cyclic garbage collector paused while a listing builds its records. Tens of
    thousands of new dicts and handles, none in a cycle, would otherwise set off collections
    that walk the whole heap, the caller's too: at 10,000 sandboxes they were 40 % of
    `list()`'s time (issue 36). The collector is on again when the last listing in any thread
    is done, unless it was off before the first began."""
    global _pauses, _resume_collector
    with _pauses_lock:
        if _pauses == 0:
            _resume_collector = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses -= 1
            if _pauses == 0 and _resume_collector:
                gc.enable()


E = TypeVar("E")


@overload
def _maybe_enum(enum_type: Callable[[str], E], value: str) -> E | str: ...
@overload
def _maybe_enum(enum_type: Callable[[str], E], value: None) -> None: ...
def _maybe_enum(enum_type: Callable[[str], E], value: str | None) -> E | str | None:
    if value is None:
        return None
    try:
        return enum_type(value)
    except ValueError:  # written by a newer sbx: keep the word
        return value


class _ViewRecord:
    """A record over the view a transport returned: its fields are read from the view when
    asked, and two records (or a record and its handle) are equal when their ids are."""

    __slots__ = ("_view",)
    _kind: type  # the record type equality compares within: the class right below this one

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _ViewRecord in cls.__bases__:
            cls._kind = cls

    def __init__(self, view: Mapping[str, Any]) -> None:
        # a transport's view is a new dict nobody else holds or changes: kept as it is (a
        # copy per record was a fifth of `sbx ls --json`'s time over 10,000 rows)
        self._view = view if type(view) is dict else dict(view)

    def _replace(self, view: Mapping[str, Any]) -> None:
        self._view = view if type(view) is dict else dict(view)

    def to_dict(self) -> dict[str, Any]:
        """The record as the CLI's `--json` prints it (`sbx show`, `sbx checkpoints`,
        `sbx volume show`; a sandbox's without its resolved profile)."""
        return dict(self._view)

    @property
    def id(self) -> str:
        return self._view["id"]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self._kind) and other._view["id"] == self._view["id"]

    def __hash__(self) -> int:
        return hash(self._view["id"])


class SandboxRecord(_ViewRecord):
    """A sandbox's fields, as of when it was last read (`refresh()` reads it again).
    Times are aware datetimes in UTC; `ttl_left` counts down from the effective deadline
    (the earlier of the deadline and the idle deadline) and is None once off the clock."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        view = dict(self._view)
        view["labels"] = dict(view["labels"])  # a change to the copy leaves the record as it is
        return view

    @property
    def name(self) -> str | None:
        return self._view["name"]

    @property
    def profile(self) -> str:
        """The name of the profile it was made from."""
        return self._view["profile"]

    @property
    def backend(self) -> str:
        return self._view["backend"]

    @property
    def backend_ref(self) -> str | None:
        """The backend's own id for it (None before the backend made it)."""
        return self._view["backend_ref"]

    @property
    def isolation(self) -> str:
        """How it is contained: "container", or "gvisor" (docs/security.md, "Isolation levels")."""
        return self._view.get("isolation") or "container"

    @property
    def owner(self) -> str:
        return self._view["owner"]

    @property
    def task(self) -> str | None:
        return self._view["task"]

    @property
    def host(self) -> str | None:
        """The machine of the installation that made it."""
        return self._view.get("host")

    @property
    def error(self) -> str | None:
        """Why it failed (or why its setup did), if it did."""
        return self._view.get("error")

    @property
    def idle_timeout(self) -> timedelta | None:
        seconds = self._view.get("idle_timeout_s")
        return timedelta(seconds=seconds) if seconds else None

    @property
    def state(self) -> State:
        return State(self._view["state"])

    @property
    def labels(self) -> Mapping[str, str]:
        return MappingProxyType(self._view["labels"])

    @property
    def created_at(self) -> datetime:
        return _time(self._view["created_at"])

    @property
    def started_at(self) -> datetime | None:
        return _time(self._view.get("started_at"))

    @property
    def deadline(self) -> datetime:
        return _time(self._view["deadline"])

    @property
    def hard_deadline(self) -> datetime:
        return _time(self._view["hard_deadline"])

    @property
    def idle_deadline(self) -> datetime | None:
        return _time(self._view.get("idle_deadline"))

    @property
    def last_activity_at(self) -> datetime | None:
        return _time(self._view.get("last_activity_at"))

    @property
    def ended_at(self) -> datetime | None:
        return _time(self._view.get("ended_at"))

    @property
    def ttl_left(self) -> timedelta | None:
        """Time left before the reaper may end it, as of now (None once it is off the clock)."""
        from sandboxer.core.rules.clock import clock_from_env
        from sandboxer.core.rules.states import ON_THE_CLOCK

        if self._view["state"] not in ON_THE_CLOCK:
            return None
        idle = self.idle_deadline
        ends = self.deadline if idle is None else min(self.deadline, idle)
        return max(timedelta(0), ends - clock_from_env().now())

    def __repr__(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        return f"<{type(self).__name__} {self.id}{name} {self._view['state']} on {self.backend}>"


    @property
    def launch(self) -> str | None:
        """How its create was served: "warm" (a pool member was claimed, docs/pools.md) or
        "cold"."""
        return self._view.get("launch", "cold")

    @property
    def pool(self) -> str | None:
        """The warm pool it came from, if any."""
        return self._view.get("pool")


class CheckpointRecord(_ViewRecord):
    """A checkpoint's fields. `sandbox` is the id of the sandbox it was taken from and
    `parent` the checkpoint that sandbox was restored from, if any. An imported checkpoint
    has neither here: `origin_sandbox` is what its archive claims (a sandbox elsewhere)."""

    __slots__ = ()

    @property
    def name(self) -> str | None:
        return self._view["name"]

    @property
    def sandbox(self) -> str | None:
        return self._view["sandbox_id"]

    @property
    def parent(self) -> str | None:
        return self._view["parent_id"]

    @property
    def kind(self) -> str:
        """What it saved: "filesystem" (or "memory")."""
        return self._view["kind"]

    @property
    def state(self) -> str:
        """"pending" while the backend makes it, then "ready"."""
        return self._view["state"]

    @property
    def backend(self) -> str:
        return self._view["backend"]

    @property
    def profile(self) -> str:
        return self._view["profile"]

    @property
    def size_bytes(self) -> int | None:
        return self._view.get("size_bytes")

    @property
    def volumes(self) -> list[dict[str, Any]]:
        """The volumes its sandbox mounted ({"name", "path", "read_only"}): named, their
        data not in the checkpoint; a restore mounts them again by name (docs/volumes.md)."""
        return [dict(v) for v in self._view.get("volumes") or []]

    @property
    def origin_sandbox(self) -> str | None:
        return self._view.get("origin_sandbox_id")

    @property
    def created_at(self) -> datetime:
        return _time(self._view["created_at"])

    @property
    def expires_at(self) -> datetime | None:
        return _time(self._view.get("expires_at"))

    def __repr__(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        return f"<{type(self).__name__} {self.id}{name} of {self.sandbox} {self.state}>"



class VolumeRecord(_ViewRecord):
    """A volume's fields (docs/volumes.md): named storage that outlives a sandbox.
    `mounted_by` lists the live sandboxes that mount it ({"sandbox", "path", "read_only"});
    `size_bytes` is the backend's figure when last asked (None: it cannot tell)."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return self._view["name"]

    @property
    def owner(self) -> str:
        return self._view["owner"]

    @property
    def backend(self) -> str:
        return self._view["backend"]

    @property
    def labels(self) -> dict[str, str]:
        return dict(self._view["labels"])

    @property
    def shared(self) -> bool:
        """Whether more than one sandbox may mount it read-write at once."""
        return self._view["shared"]

    @property
    def size_bytes(self) -> int | None:
        return self._view.get("size_bytes")

    @property
    def created_at(self) -> datetime:
        return _time(self._view["created_at"])

    @property
    def expires_at(self) -> datetime | None:
        return _time(self._view.get("expires_at"))

    @property
    def mounted_by(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self._view.get("mounted_by") or []]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.name!r} on {self.backend}>"



@dataclass(frozen=True, slots=True)
class ExecResult:
    """What a command did. `exit_code` is the command's own (124 when `timeout` ended it)."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: timedelta
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ExecResult:
        return cls(doc["exit_code"], _bytes(doc["stdout"]), _bytes(doc["stderr"]),
                   timedelta(seconds=doc["duration"]), bool(doc.get("timed_out")))

    def to_dict(self) -> dict[str, Any]:
        """The shape the HTTP service sends: output as text where it is UTF-8, else base64."""
        return {"exit_code": self.exit_code, **_text("stdout", self.stdout),
                **_text("stderr", self.stderr), "duration": self.duration.total_seconds(),
                "timed_out": self.timed_out}


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Output of a running command, as it came."""

    stream: Literal["stdout", "stderr"]
    data: bytes

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "data": output_doc(self.data)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> OutputChunk:
        return cls(doc["stream"], _bytes(doc["data"]))


@dataclass(frozen=True, slots=True)
class ExecExit:
    """The last item of `exec_stream`: how the command ended."""

    exit_code: int
    duration: timedelta
    timed_out: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "duration": self.duration.total_seconds(),
                "timed_out": self.timed_out}


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the event log. `type` and `reason` are enums where sbx knows the word."""

    id: int
    time: datetime
    sandbox_id: str | None
    type: EventType | str
    actor: str
    reason: Reason | str | None
    payload: Mapping[str, Any]
    prev_hash: str
    hash: str

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Event:
        return cls(doc["id"], _time(doc["time"]), doc["sandbox_id"],
                   _maybe_enum(EventType, doc["type"]), doc["actor"],
                   _maybe_enum(Reason, doc["reason"]), MappingProxyType(dict(doc["payload"])),
                   doc["prev_hash"], doc["hash"])

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "time": self.time.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "sandbox_id": self.sandbox_id, "type": str(self.type), "actor": self.actor,
                "reason": None if self.reason is None else str(self.reason),
                "payload": dict(self.payload), "prev_hash": self.prev_hash, "hash": self.hash}


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One reading of a sandbox's resources; None where the backend does not know."""

    sandbox_id: str
    time: datetime
    cpu_pct: float | None
    memory_bytes: int | None
    memory_limit: int | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None
    pids: int | None

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> MetricSample:
        return cls(doc["sandbox_id"], _time(doc["time"]), doc["cpu_pct"], doc["memory_bytes"],
                   doc["memory_limit"], doc["net_rx_bytes"], doc["net_tx_bytes"], doc["pids"])

    def to_dict(self) -> dict[str, Any]:
        return {"sandbox_id": self.sandbox_id,
                "time": self.time.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "cpu_pct": self.cpu_pct,
                "memory_bytes": self.memory_bytes, "memory_limit": self.memory_limit,
                "net_rx_bytes": self.net_rx_bytes, "net_tx_bytes": self.net_tx_bytes,
                "pids": self.pids}


@dataclass(frozen=True, slots=True)
class ReapReport:
    """What one reconcile-and-reap cycle did (`sbx reap --json` prints the same)."""

    destroyed: tuple[str, ...] = ()
    failed: tuple[Mapping[str, Any], ...] = ()
    orphans: tuple[str, ...] = ()
    skipped: tuple[Mapping[str, Any], ...] = ()
    reconciled: tuple[Mapping[str, Any], ...] = ()
    warned: tuple[str, ...] = ()
    planned: tuple[Mapping[str, Any], ...] = field(default=())
    pools: tuple[Mapping[str, Any], ...] = field(default=())  # pool members warmed, retired
    # each destroyed id: why it ended ("ttl", "idle", "max-ttl"), as its event says
    reasons: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ReapReport:
        return cls(**{k: tuple(doc.get(k) or ()) for k in (
            "destroyed", "failed", "orphans", "skipped", "reconciled", "warned", "planned",
            "pools")}, reasons=MappingProxyType(dict(doc.get("reasons") or {})))

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {k: list(getattr(self, k)) for k in (
            "destroyed", "failed", "orphans", "skipped", "reconciled", "warned")}
        doc["reasons"] = dict(self.reasons)
        if self.planned:
            doc["planned"] = list(self.planned)
        if self.pools:
            doc["pools"] = list(self.pools)
        return doc


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """One profile on the search path: the file it came from, and why it cannot be used
    (`error`) if it cannot."""

    name: str
    backend: str | None
    description: str | None
    source: str
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        doc = {"name": self.name, "backend": self.backend, "description": self.description,
               "source": self.source}
        if self.error is not None:
            doc["error"] = self.error
        return doc


def lineage(checkpoints: list[CheckpointRecord]) -> list[dict[str, Any]]:
    """Checkpoints as nested nodes: a checkpoint's `children` were taken from sandboxes
    restored from it. A parent not among `checkpoints` makes its children roots."""
    nodes = {c.id: {**c.to_dict(), "children": []} for c in checkpoints}
    roots: list[dict[str, Any]] = []
    for node in nodes.values():
        parent = nodes.get(node["parent_id"]) if node["parent_id"] else None
        (parent["children"] if parent else roots).append(node)
    return roots


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, Mapping):  # {"base64": "..."}: output that was not UTF-8
        return base64.b64decode(value["base64"])
    return str(value).encode()


def _text(key: str, data: bytes) -> dict[str, Any]:
    return {key: output_doc(data)}


def output_doc(data: bytes) -> str | dict[str, str]:
    """Output bytes as JSON carries them (the HTTP service): the text where it is UTF-8,
    else `{"base64": ...}`. `output_bytes` reads it back."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


output_bytes = _bytes


@dataclass(frozen=True, slots=True)
class InventoryChange:
    """What one read of `AsyncSandboxer.watch()` found: `sandboxes`, every sandbox now by id
    (handles, as `list()` gives them), and what changed since the previous read: `added`,
    `changed` (handles with their new record) and `removed` (ids: destroyed, unless the
    watch shows destroyed ones). False when nothing changed."""

    sandboxes: Mapping[str, Any]
    added: tuple[Any, ...] = ()
    changed: tuple[Any, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


@dataclass(frozen=True, slots=True)
class BackendStatus:
    """One backend as this process reaches it (`AsyncSandboxer.backends()`): whether its
    adapter loads, whether it is a test double, what it can do (`capabilities`, the values
    of `sandboxer.adapters.base.Capability`), and when `checked`, whether it answers and has
    credentials. `reachable` and `credentials` are None when not asked, and `credentials`
    when the backend did not answer; `detail` says what the backend said, or why not."""

    name: str
    loaded: bool
    test_double: bool
    capabilities: frozenset[str]
    checked: bool
    reachable: bool | None
    credentials: bool | None
    detail: str

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> BackendStatus:
        return cls(doc["name"], bool(doc["loaded"]), bool(doc["test_double"]),
                   frozenset(doc["capabilities"]), bool(doc["checked"]), doc["reachable"],
                   doc["credentials"], doc["detail"])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "loaded": self.loaded, "test_double": self.test_double,
                "capabilities": sorted(self.capabilities), "checked": self.checked,
                "reachable": self.reachable, "credentials": self.credentials,
                "detail": self.detail}


class PoolInfo:
    """One warm pool of this installation (`AsyncSandboxer.pools()`, `sbx pool ls`): its
    profile and backend, the `size` it keeps (`size_set`: given by `set_pool_size`, else the
    profile's), how many members are `ready` (warm, fitting the profile as it is now) and
    `starting`, how many creates it served since it started (`claimed`, `since`), and when its
    `oldest` ready member was made. `declared` is False for a pool whose profile no longer
    declares one (its members are being removed); `error` says why its profile cannot be
    loaded, if it cannot. docs/pools.md."""

    __slots__ = ("_view",)

    def __init__(self, view: Mapping[str, Any]) -> None:
        self._view = dict(view)

    def to_dict(self) -> dict[str, Any]:
        """The record as `sbx pool ls --json` prints it."""
        return dict(self._view)

    @property
    def profile(self) -> str:
        return self._view["profile"]

    @property
    def backend(self) -> str | None:
        return self._view["backend"]

    @property
    def declared(self) -> bool:
        return bool(self._view["declared"])

    @property
    def size(self) -> int:
        return self._view["size"]

    @property
    def size_set(self) -> bool:
        return bool(self._view["size_set"])

    @property
    def ready(self) -> int:
        return self._view["ready"]

    @property
    def starting(self) -> int:
        return self._view["starting"]

    @property
    def claimed(self) -> int:
        return self._view["claimed"]

    @property
    def since(self) -> datetime | None:
        return _time(self._view.get("since"))

    @property
    def oldest(self) -> datetime | None:
        return _time(self._view.get("oldest"))

    @property
    def error(self) -> str | None:
        return self._view.get("error")

    @property
    def max_age(self) -> timedelta | None:
        if not self._view.get("max_age"):
            return None
        from sandboxer.core.rules.durations import parse_duration

        return parse_duration(self._view["max_age"])

    @property
    def members(self) -> tuple[Mapping[str, Any], ...]:
        """This installation's members nobody has claimed: `{"id", "state", "created_at",
        "ready"}` each, oldest first."""
        return tuple(MappingProxyType(dict(m)) for m in self._view.get("members") or ())

    def __repr__(self) -> str:
        return (f"<PoolInfo {self.profile} {self.ready}/{self.size} ready on {self.backend}>")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PoolInfo) and other._view == self._view

    def __hash__(self) -> int:
        return hash(self._view["profile"])


# -- files in a sandbox (box.files, sandboxer/_files.py) ------------------------------------------

@dataclass(frozen=True, slots=True)
class FileInfo:
    """One entry of a sandbox's filesystem. `path` is absolute in the sandbox; `mode` the
    permission bits (0o644); `target` a symbolic link's target."""

    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: datetime
    target: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FileInfo:
        return cls(doc["path"], doc["name"], doc["type"], int(doc["size"]), int(doc["mode"]),
                   _time(doc["mtime"]), doc.get("target"))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "type": self.type, "size": self.size,
                "mode": self.mode, "mtime": self.mtime.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "target": self.target}


@dataclass(frozen=True, slots=True)
class FileTransfer:
    """A file or tree moved into or out of a sandbox: where, how many bytes and their
    SHA-256 (of the file; for a tree, of its tar stream), and a tree's entries. The event
    log's `sandbox.file` event records the same."""

    path: str
    bytes: int
    sha256: str
    entries: int | None = None

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FileTransfer:
        return cls(doc["path"], int(doc["bytes"]), doc["sha256"], doc.get("entries"))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256,
                "entries": self.entries}
