"""The request bodies and response shapes of the API, as the OpenAPI document states them.
Responses are the records' `to_dict()` (the shapes `sbx ... --json` prints, docs/cli.md);
these models describe them and are not used to build them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from sandboxer.core.store.apikeys import MAX_QUOTA

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


class Extend(Body):
    by: Duration


class Exec(Body):
    argv: list[str] = Field(min_length=1)
    timeout: Duration | None = None


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


class SandboxFields(BaseModel):
    id: str
    name: str | None
    profile: str
    backend: str
    backend_ref: str | None
    state: str
    owner: str
    task: str | None
    labels: dict[str, str]
    install: str
    host: str | None
    created_at: str
    started_at: str | None
    deadline: str
    hard_deadline: str
    last_activity_at: str
    idle_timeout_s: int | None
    idle_deadline: str | None
    ended_at: str | None
    error: str | None


class SandboxRecord(SandboxFields):
    """`sbx show --json`; `profile_resolved` only when asked for."""

    ttl_left_s: int | None
    launch: str | None = Field(None, description="how its create was served: \"warm\" (a "
                                                 "pool member was claimed) or \"cold\"")
    pool: str | None = Field(None, description="the pool it came from, if any")
    profile_resolved: dict[str, Any] | None = None


class WatchedSandbox(SandboxFields):
    """A sandbox as a watch of the inventory sees it: the stored fields only (no
    `ttl_left_s`, which changes by itself as time passes)."""


class Extended(SandboxRecord):
    capped: bool = Field(description="the hard deadline capped the extension")


class Destroyed(SandboxRecord):
    already_destroyed: bool


class SandboxPage(BaseModel):
    items: list[SandboxRecord]
    next_cursor: str | None = Field(description="give it as `cursor` for the next page; "
                                                "null on the last")


class Output(BaseModel):
    base64: str


class ExecResult(BaseModel):
    exit_code: int
    stdout: str | Output = Field(description="text, or {\"base64\"} when not UTF-8; at most "
                                             "SBX_SERVE_MAX_EXEC_OUTPUT bytes (1MiB)")
    stderr: str | Output = Field(description="as stdout")
    duration: float
    timed_out: bool
    stdout_bytes: int = Field(description="how much stdout the command wrote")
    stderr_bytes: int = Field(description="how much stderr the command wrote")
    stdout_truncated: bool = Field(description="stdout holds only the first part: the stream "
                                               "form (Accept: text/event-stream) sends it all")
    stderr_truncated: bool = Field(description="as stdout_truncated")


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


class Event(BaseModel):
    id: int
    time: str
    sandbox_id: str | None
    type: str
    actor: str
    reason: str | None
    payload: dict[str, Any]
    prev_hash: str
    hash: str


class MetricSample(BaseModel):
    sandbox_id: str
    time: str
    cpu_pct: float | None
    memory_bytes: int | None
    memory_limit: int | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None
    pids: int | None


class Origin(BaseModel):
    restored_from: str | None = Field(description="the checkpoint it was restored from "
                                                  "(null: made from a profile); it may since "
                                                  "have been removed")


class BackendStatus(BaseModel):
    name: str
    loaded: bool
    test_double: bool
    capabilities: list[str]
    checked: bool
    reachable: bool | None = Field(description="null when not checked")
    credentials: bool | None = Field(description="null when not checked or not reached")
    detail: str


class ProfileInfo(BaseModel):
    name: str
    backend: str | None
    description: str | None
    source: str
    error: str | None = None


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
