"""The tables. Times are ISO 8601 UTC strings of fixed width (see sandboxer.core.rules.clock.to_iso):
they sort as times do on every store and read the same from any client."""

from __future__ import annotations

from sqlalchemy import BigInteger, Index, Text, text
from sqlmodel import Field, SQLModel

from sandboxer.core.store.inventory import DUE_INDEXES

TIME = 27  # len("2026-11-30T12:00:00.000000Z")


class Sandbox(SQLModel, table=True):
    __tablename__ = "sandboxes"
    # what a reap cycle between full looks reads through (core/store/inventory.py), migration 0018
    __table_args__ = tuple(
        Index(name, column, sqlite_where=text(rows), postgresql_where=text(rows))
        for name, (column, rows) in DUE_INDEXES.items())

    id: str = Field(primary_key=True, max_length=40)
    name: str | None = Field(default=None, index=True, max_length=128)
    profile: str = Field(max_length=128)
    profile_json: str = Field(sa_type=Text)  # the resolved profile, as asked for (secrets as references)
    backend: str = Field(max_length=64)
    backend_ref: str | None = Field(default=None, max_length=256)
    # which engine/account of the backend holds it: another one is never told it is gone
    backend_instance: str | None = Field(default=None, max_length=128)
    # how it is contained: the profile's `isolation` (container | gvisor), migration 0014
    isolation: str = Field(default="container", max_length=16)
    install_id: str = Field(max_length=64)  # the installation (host) that made it
    host: str | None = Field(default=None, max_length=255)  # that installation's machine name
    state: str = Field(index=True, max_length=16)
    owner: str = Field(index=True, max_length=256)  # its tenant (core/store/tenancy.py)
    task: str | None = Field(default=None, sa_type=Text)
    labels_json: str = Field(default="{}", sa_type=Text)
    created_at: str = Field(index=True, max_length=TIME)
    started_at: str | None = Field(default=None, max_length=TIME)
    deadline: str = Field(index=True, max_length=TIME)
    hard_deadline: str = Field(max_length=TIME)
    last_activity_at: str = Field(max_length=TIME)
    idle_timeout_s: int | None = Field(default=None)  # the profile's ttl.idle, if any
    warned_deadline: str | None = Field(default=None, max_length=TIME)  # sandbox.expiring sent
    restored_from: str | None = Field(default=None, max_length=40)  # a checkpoint id
    ended_at: str | None = Field(default=None, max_length=TIME)
    error: str | None = Field(default=None, sa_type=Text)
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: str | None = Field(default=None, max_length=TIME)
    fence: int = Field(default=0)
    # warm pools (core/pools/__init__.py): the pool (a profile's name) a member was made for, and how
    # a create was served, "warm" (a member claimed) or "cold"; None while a member waits
    pool: str | None = Field(default=None, max_length=128)
    launch: str | None = Field(default=None, max_length=8)
    # set by a trigger on every insert and update (migration 0016): what a watcher reads
    # changes since (sandboxer.core.follow.watch); never written by the code
    change_seq: int = Field(default=0, sa_type=BigInteger, index=True)
    # set by a trigger on every insert and on every update of a column other than the
    # activity ones (migration 0017): what the reaper's fingerprint between full looks reads
    reconcile_seq: int = Field(default=0, sa_type=BigInteger, index=True)


class Checkpoint(SQLModel, table=True):
    """A saved state. It outlives its sandbox (until it expires) and can move between hosts,
    so it keeps its own copy of the resolved profile and no foreign key to the sandbox."""

    __tablename__ = "checkpoints"

    id: str = Field(primary_key=True, max_length=40)
    # the local sandbox it was taken from; None for an import, whose claims are origin_*
    sandbox_id: str | None = Field(default=None, index=True, max_length=40)
    parent_id: str | None = Field(default=None, max_length=40)  # restored from: lineage
    name: str | None = Field(default=None, max_length=128)
    kind: str = Field(max_length=16)  # filesystem | memory
    state: str = Field(max_length=16)  # pending (the backend is making it) | ready
    backend: str = Field(max_length=64)
    backend_ref: str | None = Field(default=None, max_length=256)
    install_id: str = Field(max_length=64)
    profile: str = Field(max_length=128)
    profile_json: str = Field(sa_type=Text)
    size_bytes: int | None = Field(default=None, sa_type=BigInteger)
    created_at: str = Field(max_length=TIME)
    expires_at: str | None = Field(default=None, max_length=TIME)
    # An import's archive says these; they are a record, never links to local rows.
    origin_sandbox_id: str | None = Field(default=None, max_length=40)
    origin_parent_id: str | None = Field(default=None, max_length=40)
    origin_install_id: str | None = Field(default=None, max_length=64)
    exported_at: str | None = Field(default=None, max_length=TIME)  # set only on an import
    # its tenant (core/store/tenancy.py): the sandbox's owner, or who imported it; None for rows
    # written before tenants existed, which only the local user and admin keys see
    owner: str | None = Field(default=None, index=True, max_length=256)


class Event(SQLModel, table=True):
    """Append-only; `hash` chains every row to the one before it (see sandboxer.core.store.events)."""

    __tablename__ = "events"

    id: int | None = Field(default=None, primary_key=True)
    time: str = Field(index=True, max_length=TIME)
    sandbox_id: str | None = Field(default=None, index=True, max_length=40)
    type: str = Field(max_length=64)
    actor: str = Field(max_length=256)
    reason: str | None = Field(default=None, max_length=32)
    payload_json: str = Field(default="{}", sa_type=Text)
    prev_hash: str = Field(max_length=64)
    hash: str = Field(max_length=64, unique=True)


class SinkCursor(SQLModel, table=True):
    """How far one sink has delivered the event log, and who is delivering it now."""

    __tablename__ = "sink_cursors"

    sink: str = Field(primary_key=True, max_length=64)
    delivered_id: int = Field(default=0)
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: str | None = Field(default=None, max_length=TIME)
    fence: int = Field(default=0)


class Delivery(SQLModel, table=True):
    """An event a sink refused: waiting for its retry, or parked after too many."""

    __tablename__ = "deliveries"

    sink: str = Field(primary_key=True, max_length=64)
    event_id: int = Field(primary_key=True)
    attempts: int = Field(default=0)
    next_attempt_at: str | None = Field(default=None, max_length=TIME)
    last_error: str | None = Field(default=None, sa_type=Text)
    parked: bool = Field(default=False)


class MetricSample(SQLModel, table=True):
    """One reading of a sandbox's resources; None where the backend does not know."""

    __tablename__ = "metric_samples"
    __table_args__ = (Index("ix_metric_samples_sandbox_time", "sandbox_id", "time"),)

    id: int | None = Field(default=None, primary_key=True)
    sandbox_id: str = Field(max_length=40)
    time: str = Field(max_length=TIME)
    cpu_pct: float | None = Field(default=None)
    memory_bytes: int | None = Field(default=None, sa_type=BigInteger)
    memory_limit: int | None = Field(default=None, sa_type=BigInteger)
    net_rx_bytes: int | None = Field(default=None, sa_type=BigInteger)
    net_tx_bytes: int | None = Field(default=None, sa_type=BigInteger)
    pids: int | None = Field(default=None)


class ApiKey(SQLModel, table=True):
    """A key of the HTTP service (`sbx api-keys`). Only the key's SHA-256 is kept: the key
    itself is shown once, when it is made."""

    __tablename__ = "api_keys"

    id: str = Field(primary_key=True, max_length=40)  # key- and a lower-case ULID
    owner: str = Field(max_length=256)  # the actor its requests are recorded as
    scope: str = Field(max_length=16)  # read | write | admin
    key_hash: str = Field(max_length=64)
    created_at: str = Field(max_length=TIME)
    created_by: str = Field(max_length=256)
    revoked_at: str | None = Field(default=None, max_length=TIME)


class Tenant(SQLModel, table=True):
    """A tenant's quotas (docs/security.md, "Tenants"), set by an admin with
    `sbx api-keys create --max-sandboxes N --max-ttl DUR --max-execs N`; None: no limit."""

    __tablename__ = "tenants"

    owner: str = Field(primary_key=True, max_length=256)
    max_sandboxes: int | None = Field(default=None)  # live (not destroyed) at once
    max_ttl_s: int | None = Field(default=None)  # the longest TTL a create or extend may give
    max_execs: int | None = Field(default=None)  # commands running at once, per service
    set_at: str = Field(max_length=TIME)
    set_by: str = Field(max_length=256)


class IdempotencyKey(SQLModel, table=True):
    """A create the service was asked for under an `Idempotency-Key`: a retry with the same
    key (of the same caller) gets the sandbox the first one made, after a restart too."""

    __tablename__ = "idempotency_keys"

    principal: str = Field(primary_key=True, max_length=64)  # the API key's id, or "local"
    key: str = Field(primary_key=True, max_length=255)
    request_hash: str = Field(max_length=64)  # the request it was first used with
    sandbox_id: str | None = Field(default=None, max_length=40)  # bound before the backend call
    created_at: str = Field(max_length=TIME)
    holder: str | None = Field(default=None, max_length=128)  # the claiming process (a lease owner)


class Pool(SQLModel, table=True):
    """What a warm pool keeps beyond its profile: the size `sbx pool set` (or `drain`) gave
    it, which overrides the profile's, and since when it runs (what `sbx pool ls` counts
    claims from). A row is made when the pool is first filled or sized."""

    __tablename__ = "pools"

    profile: str = Field(primary_key=True, max_length=128)
    size: int | None = Field(default=None)  # None: the profile's own `pool.size`
    started_at: str = Field(max_length=TIME)
    set_at: str | None = Field(default=None, max_length=TIME)
    set_by: str | None = Field(default=None, max_length=256)


class Process(SQLModel, table=True):
    """A background process started in a sandbox (core/lifecycle/processes.py). Its output
    lives in the sandbox; the row keeps who started what, and how it ended once anyone saw
    it end (exit_code None with an ended_at: it ended with its sandbox, or its supervisor
    was lost)."""

    __tablename__ = "processes"
    __table_args__ = (Index("ix_processes_sandbox_pid", "sandbox_id", "pid"),)

    id: int | None = Field(default=None, primary_key=True)
    sandbox_id: str = Field(max_length=40)
    owner: str = Field(index=True, max_length=256)  # the sandbox's tenant (core/store/tenancy.py)
    pid: int
    argv_json: str = Field(sa_type=Text)  # masked as an exec's argv is
    env_names_json: str = Field(default="[]", sa_type=Text)  # names only, never the values
    cwd: str | None = Field(default=None, sa_type=Text)
    user: str | None = Field(default=None, max_length=256)
    stdin: bool = Field(default=False)
    started_at: str = Field(max_length=TIME)
    started_by: str = Field(max_length=256)
    ended_at: str | None = Field(default=None, max_length=TIME)
    exit_code: int | None = Field(default=None)


class Volume(SQLModel, table=True):
    """Named storage that outlives a sandbox (core/lifecycle/volumes.py, docs/volumes.md).
    The row goes when the volume is removed; its events stay."""

    __tablename__ = "volumes"
    __table_args__ = (Index("ix_volumes_owner_name", "owner", "name", unique=True),)

    id: str = Field(primary_key=True, max_length=40)  # vol- and a lower-case ULID
    name: str = Field(max_length=128)  # unique per owner
    owner: str = Field(max_length=256)  # its tenant (core/store/tenancy.py)
    backend: str = Field(max_length=64)
    backend_ref: str | None = Field(default=None, max_length=256)  # None until the backend made it
    backend_instance: str | None = Field(default=None, max_length=128)
    install_id: str = Field(max_length=64)
    labels_json: str = Field(default="{}", sa_type=Text)
    shared: bool = Field(default=False)  # more than one read-write mount at once
    size_bytes: int | None = Field(default=None, sa_type=BigInteger)  # as the backend last told
    created_at: str = Field(max_length=TIME)
    expires_at: str | None = Field(default=None, max_length=TIME)  # None: kept until removed


class Mount(SQLModel, table=True):
    """A sandbox's mount of a volume; it holds the volume while the sandbox is live."""

    __tablename__ = "mounts"

    sandbox_id: str = Field(primary_key=True, max_length=40)
    volume_id: str = Field(primary_key=True, max_length=40, index=True)
    path: str = Field(sa_type=Text)
    read_only: bool
