"""The request bodies and response shapes of the API, as the OpenAPI document states them.
Responses are the records' `to_dict()` (the shapes `sbx ... --json` prints, docs/cli.md);
these models describe them and are not used to build them. Where a record's shape is typed
in one place, the model is derived from it (`derived`): a sandbox from
`sandboxer.core.rules.views.SandboxView`, an event, a metric sample, a command's result, a
backend's status and a profile from the library's records. The others are written here."""

from __future__ import annotations

import enum
import functools
import operator
import types
import typing
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, create_model

import sandboxer
from sandboxer.core.rules.views import SandboxView
from sandboxer.service import MAX_QUOTA

# "30m", "1h30m", or seconds; strict numbers, so JSON `true` is refused, not read as 1 s
Duration = str | StrictFloat | StrictInt


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSandbox(Body):
    profile: str | dict[str, Any] = Field(
        "default", description="a profile name on the service's search path; or a profile "
                               "document (admin keys only: it may read the service's "
                               "environment through `secrets`)")
    ttl: Duration | None = None
    name: str | None = None
    labels: dict[str, str] | None = None
    owner: str | None = Field(None, description="default: the key's owner")
    task: str | None = None
    volumes: list[dict[str, Any]] | None = Field(
        None, description="volumes to mount beside the profile's: {name, path, read_only} "
                          "(docs/volumes.md)")


class CreateVolume(Body):
    """docs/volumes.md"""

    name: str
    backend: str | None = Field(None, description="default: docker")
    labels: dict[str, str] | None = None
    ttl: Duration | None = Field(None, description="removed once past it, never while a "
                                                   "live sandbox mounts it; default: kept")
    shared: bool = Field(False, description="more than one read-write mount at once")
    owner: str | None = Field(None, description="default: the key's owner")


class Extend(Body):
    by: Duration


class Exec(Body):
    argv: list[str] = Field(min_length=1)
    timeout: Duration | None = None
    env: dict[str, str] | None = Field(None, description="added to the command's environment; "
                                                         "the event records the names only")
    cwd: str | None = Field(None, description="the working directory: an absolute path in "
                                              "the sandbox")
    user: str | None = Field(None, description="run as this user (a backend with the "
                                               "run_as_user capability)")
    stdin: str | None = Field(None, description="the command's standard input, base64; the "
                                                "input limit caps it (SBX_SERVE_MAX_INPUT)")


class StartProcess(Body):
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None
    stdin: bool = Field(False, description="keep its stdin open for POST .../stdin (else it "
                                           "is empty)")


class Signal(Body):
    signal: StrictInt = Field(9, ge=1, le=64, description="a signal number (9: SIGKILL)")


class MakeDir(Body):
    path: str
    parents: bool = True


class Rename(Body):
    src: str
    dst: str


class Snapshot(Body):
    name: str | None = None


class Restore(Body):
    ttl: Duration | None = None
    name: str | None = None
    labels: dict[str, str] | None = None
    owner: str | None = None
    task: str | None = None
    profile: str | None = Field(None, description="a profile of the service's host to run "
                                                  "under (an imported checkpoint's default: "
                                                  "the one of the name it records)")


class Fork(Body):
    n: int = Field(ge=1, le=64)
    ttl: Duration | None = None
    labels: dict[str, str] | None = None
    owner: str | None = None
    task: str | None = None


class DestroyMany(Body):
    refs: list[str] = Field(min_length=1, max_length=1000)


class Reap(Body):
    dry_run: bool = False
    orphans: bool = False
    timeout: Duration | None = None


class Reconcile(Body):
    dry_run: bool = False


class Redeliver(Body):
    event_ids: list[int] | None = None


class PoolSize(Body):
    size: int = Field(ge=0, description="warm members to keep (docs/pools.md)")


class CreateKey(Body):
    scope: str = Field(description="read, write or admin")
    owner: str | None = Field(None, description="who its requests are recorded as "
                                                "(default: the caller): its tenant")
    max_sandboxes: int | None = Field(None, ge=1, le=MAX_QUOTA,
                                      description="the owner's quota: live sandboxes at once")
    max_ttl_s: int | None = Field(None, ge=1, le=MAX_QUOTA,
                                  description="the owner's quota: the longest TTL, in seconds")
    max_execs: int | None = Field(None, ge=1, le=MAX_QUOTA,
                                  description="the owner's quota: commands running at once")


# -- responses (documentation) --------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: int = Field(description="the CLI's exit code for it (docs/cli.md)")
    kind: str = Field(description="bad_input, not_found, conflict, unavailable, failed, "
                                  "unauthorized or forbidden")
    message: str
    problems: list[str] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class Output(BaseModel):
    base64: str


def json_type(hint: Any) -> Any:
    """The type a record's field has in JSON: a time is ISO 8601 text, a duration seconds,
    output bytes text (or `{"base64"}` when not UTF-8), an enum its word, a set or tuple a
    list, a mapping an object."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        members: list[Any] = []
        for arg in args:
            member = json_type(arg)
            if member not in members:  # EventType | str: the word either way
                members.append(member)
        return functools.reduce(operator.or_, members)
    if origin in (frozenset, set, tuple, list):
        return list[json_type(args[0])]
    if origin in (dict, Mapping):
        return dict[json_type(args[0]), json_type(args[1])]
    if hint is datetime:
        return str
    if hint is timedelta:
        return float
    if hint is bytes:
        return str | Output
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return str
    return hint


def derived(name: str, shape: type, *, doc: str | None = None, skip: Collection[str] = (),
            optional: Collection[str] = (), described: Mapping[str, str] | None = None,
            **extra: Any) -> type[BaseModel]:
    """A response model named `name` with the fields of `shape` (a TypedDict or a record
    dataclass) in its order, as JSON types: each required unless `optional` (then null by
    default), `described` where the document says more; then the `extra` fields, as
    pydantic's create_model takes them."""
    described = described or {}
    fields: dict[str, Any] = {}
    for field, hint in typing.get_type_hints(shape).items():
        if field in skip:
            continue
        default = None if field in optional else ...
        fields[field] = (json_type(hint), Field(default, description=described.get(field)))
    return create_model(name, __doc__=doc, __module__=__name__, **fields, **extra)


# launch and pool came with warm pools, after the inventory's watch was documented: the
# document has them optional on a record and does not name them on a watched sandbox (whose
# items carry them too)
_LATER = ("launch", "pool")

SandboxRecord = derived(
    "SandboxRecord", SandboxView, doc="`sbx show --json`; `profile_resolved` only when asked "
                                      "for.",
    optional=_LATER, described={
        "launch": "how its create was served: \"warm\" (a pool member was claimed) or "
                  "\"cold\"",
        "pool": "the pool it came from, if any"},
    profile_resolved=(dict[str, Any] | None, None))

WatchedSandbox = derived(
    "WatchedSandbox", SandboxView, skip=(*_LATER, "ttl_left_s"),
    doc="A sandbox as a watch of the inventory sees it: the stored fields only (no\n"
        "`ttl_left_s`, which changes by itself as time passes).")



class InventoryChanges(BaseModel):
    """`GET /v1/inventory/changes`: what changed since a position (docs/service.md)."""

    position: str = Field(description="give it as `since` for the changes after this answer")
    reset: bool = Field(description="true: `changed` is every sandbox (no position, or one "
                                    "this run of the service cannot answer from)")
    changed: list[WatchedSandbox] = Field(description="added or changed, oldest first")  # type: ignore[valid-type]
    removed: list[str] = Field(description="the ids of those gone from the view")


class Extended(SandboxRecord):
    capped: bool = Field(description="the hard deadline capped the extension")


class Destroyed(SandboxRecord):
    already_destroyed: bool


class SandboxPage(BaseModel):
    items: list[SandboxRecord]
    next_cursor: str | None = Field(description="give it as `cursor` for the next page; "
                                                "null on the last")


ExecResult = derived(
    "ExecResult", sandboxer.ExecResult, described={
        "stdout": "text, or {\"base64\"} when not UTF-8; at most SBX_SERVE_MAX_EXEC_OUTPUT "
                  "bytes (1MiB)",
        "stderr": "as stdout"},
    stdout_bytes=(int, Field(description="how much stdout the command wrote")),
    stderr_bytes=(int, Field(description="how much stderr the command wrote")),
    stdout_truncated=(bool, Field(description="stdout holds only the first part: the stream "
                                              "form (Accept: text/event-stream) sends it all")),
    stderr_truncated=(bool, Field(description="as stdout_truncated")))


class CheckpointVolume(BaseModel):
    name: str
    path: str
    read_only: bool


class CheckpointRecord(BaseModel):
    id: str
    name: str | None
    sandbox_id: str | None
    owner: str | None = Field(description="its tenant: the sandbox's owner, or who imported "
                                           "it")
    parent_id: str | None
    kind: str
    state: str
    backend: str
    profile: str
    size_bytes: int | None
    created_at: str
    expires_at: str | None
    backend_ref: str | None = None
    install_id: str | None = None
    origin_sandbox_id: str | None = None
    origin_parent_id: str | None = None
    origin_install_id: str | None = None
    exported_at: str | None = None
    volumes: list[CheckpointVolume] = Field(
        default_factory=list, description="the volumes its sandbox mounted, by name: their "
                                          "data is not in the checkpoint (docs/volumes.md)")


class VolumeMounted(BaseModel):
    sandbox: str
    path: str
    read_only: bool


class VolumeRecord(BaseModel):
    """docs/volumes.md"""

    id: str
    name: str
    owner: str
    backend: str
    labels: dict[str, str]
    shared: bool
    size_bytes: int | None = Field(description="bytes it holds, as the backend last told")
    created_at: str
    expires_at: str | None
    mounted_by: list[VolumeMounted] = Field(description="the live sandboxes mounting it")


Event = derived("Event", sandboxer.Event)
MetricSample = derived("MetricSample", sandboxer.MetricSample)


class Origin(BaseModel):
    restored_from: str | None = Field(description="the checkpoint it was restored from "
                                                  "(null: made from a profile); it may since "
                                                  "have been removed")


BackendStatus = derived("BackendStatus", sandboxer.BackendStatus, described={
    "reachable": "null when not checked",
    "credentials": "null when not checked or not reached"})
ProfileInfo = derived("ProfileInfo", sandboxer.ProfileInfo, optional=("error",))


class ApiKey(BaseModel):
    id: str
    owner: str
    scope: str
    created_at: str
    created_by: str
    revoked_at: str | None


class NewApiKey(BaseModel):
    key: ApiKey
    token: str = Field(description="the key itself: shown only here")


class PoolMember(BaseModel):
    id: str
    state: str
    created_at: str
    ready: bool


class PoolRecord(BaseModel):
    """`sbx pool ls --json`: one warm pool of the service's installation."""

    profile: str
    backend: str | None
    declared: bool = Field(description="false: its profile no longer declares a pool")
    size: int
    size_set: bool = Field(description="the size was set (sbx pool set), not the profile's")
    max_age: str | None
    ready: int
    starting: int
    claimed: int = Field(description="creates it served since it started (`since`)")
    since: str | None
    oldest: str | None
    oldest_age_s: int | None
    members: list[PoolMember]
    error: str | None = None


class PoolFailure(BaseModel):
    id: str
    code: int
    kind: str
    error: str


class PoolDrained(BaseModel):
    profile: str
    destroyed: list[str]
    failed: list[PoolFailure]


class FileTransfer(BaseModel):
    """What one transfer moved: the event `sandbox.file` records the same (never the bytes)."""

    path: str
    bytes: int
    sha256: str
    entries: int | None = Field(None, description="a tree's members")


class FileInfo(BaseModel):
    path: str = Field(description="absolute, in the sandbox")
    name: str
    type: str = Field(description="file, dir, symlink or other")
    size: int
    mode: int = Field(description="permission bits (0o644 is 420)")
    mtime: str = Field(description="ISO 8601, UTC")
    target: str | None = Field(None, description="a symlink's target")


class ProcessView(BaseModel):
    """A background process (docs/service.md, "Processes")."""

    pid: int
    sandbox_id: str
    argv: list[str] = Field(description="as the event log keeps it (secret values masked)")
    cwd: str | None
    user: str | None
    env_names: list[str]
    stdin: bool = Field(description="its stdin is open for writing")
    started_at: str
    running: bool
    exit_code: int | None
    ended_at: str | None
