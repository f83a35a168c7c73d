"""The lifecycle manager: every front end calls this, never a backend directly.

Each mutation follows one pattern (docs/design.md, "How an operation runs"):
1. a short write transaction checks the state, takes the sandbox's lease (compare-and-set,
   returning a fence token), records the intent and its event;
2. the backend call, outside any transaction;
3. a second short transaction, fenced by the token, records the result and its event and
   releases the lease. A stale holder (its lease taken over) cannot commit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sandboxer.adapters import registry
from sandboxer.adapters.base import (
    LABEL_HARD_DEADLINE,
    LABEL_ID,
    LABEL_INSTALL,
    LABEL_POOL,
    Adapter,
    AdapterError,
    BackendObject,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    ExecResult,
    InvalidRequest,
    ResourceLimits,
    ServiceSpec,
    Stdin,
    exec_options,
)
from sandboxer.core.lifecycle.leases import Lease, Leases, making_room
from sandboxer.core.observe import telemetry
from sandboxer.core.rules import settings
from sandboxer.core.rules.clock import Clock, clock_from_env, from_iso, to_iso
from sandboxer.core.rules.durations import format_duration
from sandboxer.core.rules.errors import (
    BadInput,
    Conflict,
    LeaseLost,
    NotDue,
    NotFound,
    OperationFailed,
    QuotaExceeded,
    Unavailable,
    one_line,
)
from sandboxer.core.rules.failpoints import failpoint
from sandboxer.core.rules.ids import (
    PREFIX,
    new_sandbox_id,
    validate_name,
    validate_owner,
    validate_task,
)
from sandboxer.core.rules.labels import validate_labels
from sandboxer.core.rules.states import (
    ACTIVE,
    ADOPTED_EVENT,
    CREATED_EVENT,
    LIVE,
    ON_THE_CLOCK,
    REAPABLE,
    RESTARTED_EVENT,
    State,
    lease_owner,
    runs_setup,
    transition_event,
)
from sandboxer.core.rules.ttl import (
    EXPIRY_REASONS,
    effective_deadline,
    expiry_reason,
    extended,
    warning_due,
)
from sandboxer.core.store import events as eventlog
from sandboxer.core.store import inventory, refs, tenancy
from sandboxer.core.store.anchor import read_anchor
from sandboxer.core.store.db import LOCK_SANDBOX_NAMES, LOCK_TENANT_QUOTAS, Database, serialise
from sandboxer.core.store.models import Event, Sandbox

if TYPE_CHECKING:  # profiles (pydantic, yaml) load only where a profile is used
    from sandboxer.core.rules.profiles import Profile

SANDBOXES = Sandbox.__table__
ACTIVITY_EVERY = timedelta(seconds=30)
EVENTS = Event.__table__


def _marking_activity(states: Iterable[State]) -> sa.TextClause:
    """A sandbox in one of `states` is active now, and its row. Text, as core/store/refs.py's
    `by_id`: a process compiles a Core statement the first time it runs it (about 4 ms for
    this one), and a one-shot `sbx exec` runs it once."""
    among = ", ".join(f"'{State(state).value}'" for state in sorted(states))
    return sa.text(f"UPDATE sandboxes SET last_activity_at = :at WHERE id = :sandbox_id "
                   f"AND state IN ({among}) RETURNING {refs.columns_of(SANDBOXES)}")


_MARK_ACTIVE = _marking_activity(ACTIVE)
_MARK_RUNNING = _marking_activity({State.RUNNING})
_MARK_EXECUTED = sa.text("UPDATE sandboxes SET last_activity_at = :at WHERE id = :sandbox_id")
_INSERT = SANDBOXES.insert()
# the error of a create whose maker (a process) stopped before it was made (or set up)
MAKER_STOPPED = "the process making it stopped before it was ready"


class WarmSource(Protocol):
    """Warm pools as the lifecycle sees them: a hook a Manager is given (sbx's own is
    sandboxer.core.pools.WarmPools), so that the lifecycle never imports the pools. Without
    one, a pooled profile is created cold and no member can be made."""

    def member_deadlines(self, profile: Profile, now: datetime) -> tuple[datetime, datetime]:
        """A new member's deadline (its pool's max_age) and hard deadline."""

    def member_row(self, profile: Profile) -> dict[str, Any]:
        """The columns in which a new member's row differs from a sandbox created cold."""

    def room(self, conn: Connection, profile: Profile, install_id: str, now_iso: str) -> bool:
        """Inside the member's insert transaction: its pool is short of its size."""

    async def claim(self, mgr: Manager, profile: Profile, adapter: Adapter,
                    instance: str | None, *, ttl: timedelta, name: str | None,
                    labels: Mapping[str, str], owner: str | None, task: str | None,
                    bind: Callable[[Any, str], None] | None = None) -> dict[str, Any] | None:
        """The caller's sandbox served from a warm member that fits; None: create it cold."""

    async def finish_member(self, mgr: Manager, lease: Lease, obj: BackendObject,
                            adapter: Adapter, profile: Profile) -> dict[str, Any]:
        """The backend made a member: set it up and make it warm."""



async def _on_its_engine(adapter: Adapter, row: Mapping[str, Any]) -> None:
    """Unavailable (exit 5) when `adapter` reaches another engine or account than the one the
    sandbox lives on (a different DOCKER_HOST, say)."""
    if row.get("backend_instance"):
        _same_engine(row, await adapter.instance_id())


def _same_engine(row: Mapping[str, Any], here: str | None) -> None:
    if here != row["backend_instance"]:
        raise Unavailable(
            f"sandbox {row['id']} lives on another {row['backend']} engine "
            f"({row['backend_instance'][:20]}) than the one this process reaches "
            f"({(here or 'unknown')[:20]}): check DOCKER_HOST")


async def _refused_elsewhere(adapter: Adapter, row: Mapping[str, Any]) -> None:
    """After a command failed: Unavailable when this process reaches another engine than the
    sandbox's (see Manager._adapter_for_a_command). When that cannot be asked either, the
    command's own error stands."""
    if not row.get("backend_instance"):
        return
    try:
        here = await adapter.instance_id()
    except Exception:
        return
    _same_engine(row, here)

class Manager:
    """One per process (or per test). Holds the database, the clock and loaded adapters."""

    def __init__(
        self,
        db: Database | None = None,
        clock: Clock | None = None,
        *,
        actor: str | None = None,
        install_id: str | None = None,
        lease_ttl: timedelta | None = None,
        adapters: dict[str, Adapter] | None = None,
        warm: WarmSource | None = None,
    ) -> None:
        if db is None:
            url = settings.database_url()
            db = Database(url)
        self.db = db
        self.clock = clock or clock_from_env()
        self._actor = actor or settings.actor()
        self.install_id = install_id or settings.install_id()
        self.lease_ttl = lease_ttl or settings.lease_ttl()
        self.lease_owner = lease_owner(self.install_id)
        self._adapters: dict[str, Adapter] = adapters if adapters is not None else {}
        self.warm = warm  # the pools, plugged in by whoever makes the Manager
        # each owner's commands running in this process, and its quota (core/store/tenancy.py)
        self._execs_running: collections.Counter[str] = collections.Counter()
        self._exec_limits: dict[str, int | None] = {}
        self.leases = Leases(self.db, self.clock, owner=self.lease_owner, ttl=self.lease_ttl,
                             install_id=self.install_id, event=self.event)

    @property
    def actor(self) -> str:
        """Who the event log says acted: the caller acting in this context (a service
        request's key owner, settings.ACTING_AS), else this manager's own actor."""
        return settings.ACTING_AS.get() or self._actor

    # -- adapters ---------------------------------------------------------------------------

    @property
    def adapters(self) -> dict[str, Adapter]:
        """The adapters loaded so far, by backend name (shared with a reaper it runs)."""
        return self._adapters

    def adapter(self, backend: str) -> Adapter:
        if backend not in self._adapters:
            if not registry.is_registered(backend):  # profiles refuse unknown ones (exit 2)
                raise Unavailable(
                    f"backend {backend!r} is not installed here "
                    f"(installed: {', '.join(registry.names())})"
                )
            self._adapters[backend] = registry.load_class(backend)()
        return self._adapters[backend]

    async def adapter_for(self, row: Mapping[str, Any]) -> Adapter:
        """The adapter of a sandbox, refusing (exit 5) one that reaches another engine or
        account than the one the sandbox lives on (a different DOCKER_HOST, say)."""
        adapter = self.adapter(row["backend"])
        await adapter.ensure_available()
        await _on_its_engine(adapter, row)
        return adapter

    async def _adapter_for_a_command(self, row: Mapping[str, Any]) -> Adapter:
        """The adapter of a sandbox, for a command, whose engine's identity is asked only if
        the command fails (`_refused_elsewhere`), not before: asking first (`docker info`)
        was a tenth of `sbx exec`'s time. A backend's refs are its own (a container id, a
        sandbox id), so another engine knows no such object: a command that ran found the
        sandbox where it lives, and one that failed on another engine gets adapter_for's
        refusal (exit 5), never "gone"."""
        adapter = self.adapter(row["backend"])
        await adapter.ensure_available()
        return adapter

    async def close(self) -> None:
        import sys

        terminals = sys.modules.get("sandboxer.core.lifecycle.terminals")
        if terminals is not None:  # the terminals this process holds end with it
            await terminals.close_all(self)
        for adapter in self._adapters.values():
            await adapter.close()
        self.db.dispose()

    def _now(self) -> str:
        return to_iso(self.clock.now())

    def now_iso(self) -> str:
        """Now on this manager's clock, as the records write times."""
        return to_iso(self.clock.now())

    # -- reading ----------------------------------------------------------------------------

    def resolve(self, ref: str) -> dict[str, Any]:
        """A sandbox by id, unique id prefix (with or without `sbx-`) or name (sandboxer.core.store.refs)."""
        from sandboxer.core.store.refs import resolve

        with self.db.read() as conn:
            row = resolve(conn, SANDBOXES, ref, id_prefix=PREFIX, what="sandbox",
                          live=lambda row: row["state"] != State.DESTROYED)
        telemetry.note_sandbox(row)  # the operation traced now, if any, acts on this one
        return row

    def list(
        self,
        *,
        include_all: bool = False,
        state: str | None = None,
        backend: str | None = None,
        labels: Mapping[str, str] | None = None,
        pool_members: bool = True,
    ) -> list[dict[str, Any]]:
        placeholder = "?" if self.db.engine.dialect.paramstyle == "qmark" else "%s"
        with self.db.read() as conn:
            return inventory.list_sandboxes(
                conn.connection.driver_connection, include_all=include_all, state=state,
                backend=backend, labels=labels, placeholder=placeholder,
                pool_members=pool_members, owner=tenancy.current())

    def rows_by_ids(self, ids) -> dict[str, dict[str, Any]]:
        placeholder = "?" if self.db.engine.dialect.paramstyle == "qmark" else "%s"
        with self.db.read() as conn:
            return inventory.rows_by_ids(conn.connection.driver_connection, list(ids), placeholder)

    def events(
        self, sandbox_id: str | None = None, since: str | None = None, after_id: int = 0
    ) -> list[dict[str, Any]]:
        after_id = eventlog.check_event_id(after_id, "after")
        query = sa.select(EVENTS).where(EVENTS.c.id > after_id).order_by(EVENTS.c.id)
        if sandbox_id:
            query = query.where(EVENTS.c.sandbox_id == sandbox_id)
        if tenancy.current() is not None:  # the tenant's sandboxes' events, and its own acts
            query = query.where(sa.or_(
                EVENTS.c.sandbox_id.in_(tenancy.narrow(sa.select(SANDBOXES.c.id), SANDBOXES)),
                sa.and_(EVENTS.c.sandbox_id.is_(None), EVENTS.c.actor == tenancy.current())))
        if since:
            query = query.where(EVENTS.c.time >= since)
        with self.db.read() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def evidence(self, ref: str) -> dict[str, Any]:
        """The supervision evidence bundle of one sandbox (see sandboxer.core.observe.evidence)."""
        from sandboxer.core.observe import evidence
        from sandboxer.core.store.models import Checkpoint

        row = self.resolve(ref)
        checkpoints = Checkpoint.__table__
        with self.db.read() as conn:
            events = [dict(r) for r in conn.execute(
                sa.select(EVENTS).where(EVENTS.c.sandbox_id == row["id"]).order_by(EVENTS.c.id)
            ).mappings()]
            ckpts = [dict(r) for r in conn.execute(
                sa.select(checkpoints).where(checkpoints.c.sandbox_id == row["id"])
                .order_by(checkpoints.c.created_at)).mappings()]
        history = self.metric_history(row["id"])
        return evidence.build(row, events, ckpts, self._now(), history)

    def last_event_id(self) -> int:
        """The newest event's id (0 when there is none): following starts after it."""
        with self.db.read() as conn:
            return conn.execute(sa.select(sa.func.max(EVENTS.c.id))).scalar() or 0

    def verify_events(self) -> eventlog.ChainReport:
        anchor = read_anchor(self.db.anchor_path) if self.db.anchor_path else None
        with self.db.read() as conn:
            rows = conn.execute(sa.select(EVENTS).order_by(EVENTS.c.id)).mappings()
            return eventlog.verify(iter(rows), anchor)

    # -- the pattern ------------------------------------------------------------------------

    def event(self, conn: Connection, sandbox_id: str | None, type: str, *,
              reason: str | None = None, payload: Mapping[str, Any] | None = None) -> None:
        """Write one event inside `conn`'s transaction, as this manager's actor."""
        eventlog.append(conn, time=self._now(), type=type, actor=self.actor,
                        sandbox_id=sandbox_id, reason=reason, payload=payload)

    # -- create -----------------------------------------------------------------------------

    @telemetry.traced("sbx.create", lambda self, profile, **kw: {
        telemetry.PROFILE: profile.name, telemetry.BACKEND: profile.backend})
    async def create(
        self,
        profile: Profile,
        *,
        ttl: timedelta | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        owner: str | None = None,
        task: str | None = None,
        restore_from: Mapping[str, Any] | None = None,
        pool_member: bool = False,
        bind: Callable[[Connection, str], None] | None = None,
    ) -> dict[str, Any]:
        """Validate everything, then intent -> backend create -> fenced result.
        With `restore_from` (a checkpoint row), the sandbox starts from its artifact.
        A profile with a pool is served by a warm member that fits, if one waits (sandboxer.core.pools);
        `pool_member`: make such a member (the reaper's fill), not a sandbox for the caller.
        `bind(conn, id)` runs in the transaction that records the sandbox, before the backend
        is called (sandboxer.core.lifecycle.idempotency ties a key to it there)."""
        from sandboxer.core.rules.profiles import dump

        ttl = ttl or profile.ttl.default
        if ttl > profile.ttl.max:
            raise BadInput(
                f"ttl {format_duration(ttl)} is longer than profile {profile.name!r} allows "
                f"(max {format_duration(profile.ttl.max)})"
            )
        if name is not None:
            validate_name(name)
        all_labels = {**profile.labels, **validate_labels(labels or {})}
        owner = validate_owner(tenancy.owner_for(owner) or self.actor)
        validate_task(task)
        limits = None
        if not pool_member:  # a tenant's quotas, refused before anything is read or made
            with self.db.read() as conn:
                limits = tenancy.quotas(conn, owner)
                tenancy.check_ttl(limits, owner, ttl)
                tenancy.check_live(conn, limits, owner, SANDBOXES, LIVE)
        env = {**profile.env, **self._read_secrets(profile.secrets)}
        if profile.setup and not restore_from:
            settings.mask_patterns()  # the setup's exec events need them: refused before
        now = self.clock.now()
        sandbox_id = new_sandbox_id()
        deadline, hard_deadline = now + ttl, now + profile.ttl.max
        pools = self.warm
        if pool_member:
            if pools is None:
                raise Conflict("no warm pools are plugged into this Manager (warm=)")
            deadline, hard_deadline = pools.member_deadlines(profile, now)
        request = _request_for(profile, sandbox_id, {
            **all_labels, LABEL_ID: sandbox_id, LABEL_INSTALL: self.install_id,
            LABEL_HARD_DEADLINE: to_iso(hard_deadline),
            **({LABEL_POOL: profile.name} if pool_member else {})},
            # a member's idle clock is sbx's, from its claim
            env, deadline, hard_deadline, idle=None if pool_member else profile.ttl.idle)
        adapter = self.adapter(profile.backend)
        mounts: list[Any] = []
        if profile.volumes:  # the owner's volumes, and the sharing rule (docs/volumes.md)
            from sandboxer.core.lifecycle import volumes

            mounts = volumes.mounts_for(self, profile, owner, adapter,
                                        restoring=restore_from is not None)
            request = dataclasses.replace(request, mounts=tuple(spec for _, spec in mounts))
        self._refuse_what_the_backend_cannot(profile, request, adapter,
                                             restore=restore_from is not None)
        if trace := telemetry.trace_env():  # the workload's spans join the create's trace;
            # added after validate: a backend that takes no env (ssh) drops it, never refuses
            request = dataclasses.replace(request, env={**trace, **request.env})
        await adapter.ensure_available()
        await adapter.ensure_isolation(request.isolation)  # never a silent fallback to runc
        instance = await adapter.instance_id()
        if (pools is not None and profile.pool is not None and not pool_member
                and restore_from is None):
            claimed = await pools.claim(self, profile, adapter, instance, ttl=ttl, name=name,
                                        labels=all_labels, owner=owner, task=task, bind=bind)
            if claimed is not None:  # served warm
                return claimed
        row = {
            "id": sandbox_id,
            "name": name,
            "profile": profile.name,
            "profile_json": json.dumps(dump(profile), sort_keys=True),
            "backend": profile.backend,
            "backend_ref": None,
            "backend_instance": instance,
            "isolation": profile.isolation,
            "install_id": self.install_id,
            "host": settings.host_name(),
            "state": State.CREATING,
            "owner": owner,
            "task": task,
            "labels_json": json.dumps(all_labels, sort_keys=True),
            "created_at": to_iso(now),
            "deadline": to_iso(deadline),
            "hard_deadline": to_iso(hard_deadline),
            "last_activity_at": to_iso(now),
            "idle_timeout_s": int(profile.ttl.idle.total_seconds()) if profile.ttl.idle else None,
            "restored_from": restore_from["id"] if restore_from else None,
            "lease_owner": self.lease_owner,
            "lease_expires_at": to_iso(now + self.lease_ttl),
            "fence": 1,
            "launch": "cold",
        }
        if pools is not None and pool_member:
            row.update(pools.member_row(profile))
        telemetry.note_sandbox(row)
        self.db.require_room()  # a full disk: exit 5 before anything is written or made
        with self.db.write() as conn:
            if name is not None:
                refuse_taken_name(conn, name, owner)
            if (pools is not None and pool_member
                    and not pools.room(conn, profile, self.install_id, row["created_at"])):
                raise NotDue(f"pool {profile.name} is full")
            if limits is not None and limits["max_sandboxes"] is not None:
                serialise(conn, LOCK_TENANT_QUOTAS)  # two creates cannot both take the last
                tenancy.check_live(conn, limits, owner, SANDBOXES, LIVE)
            conn.execute(_INSERT, row)
            if mounts:  # checked again here: a mount made meanwhile counts
                volumes.record_mounts(self, conn, sandbox_id, mounts)
            if bind is not None:
                bind(conn, sandbox_id)
            self.event(conn, sandbox_id, CREATED_EVENT, payload={
                "profile": profile.name, "backend": profile.backend, "name": name,
                "isolation": profile.isolation,
                "owner": row["owner"], "task": task, "labels": all_labels,
                "deadline": row["deadline"], "hard_deadline": row["hard_deadline"],
                **({"restored_from": restore_from["id"]} if restore_from else {}),
                **({"pool": profile.name} if pool_member else {"launch": "cold"}),
            })
        lease = Lease(sandbox_id, 1)
        failpoint("create.after-intent")
        try:
            async with self.leases.holding(lease):
                obj = await (adapter.restore(restore_from["backend_ref"], request)
                             if restore_from else adapter.create(request))
        except BaseException as exc:
            message = str(exc) or type(exc).__name__
            try:
                self.leases.finish(lease, State.FAILED, reason="failed", payload={"error": message},
                             values={"error": message, "ended_at": self._now()})
            except LeaseLost:
                pass
            if isinstance(exc, AdapterError | OperationFailed) or not isinstance(exc, Exception):
                raise
            raise OperationFailed(f"create failed on {profile.backend}: {message}") from exc
        failpoint("create.after-backend")
        if pools is not None and pool_member:  # its setup runs before it can be claimed
            return await pools.finish_member(self, lease, obj, adapter, profile)
        if profile.setup and not restore_from:  # a restored filesystem has had its setup
            await self.set_up(lease, obj, adapter, profile)
        running = self.leases.finish(
            lease, State.RUNNING,
            values={"backend_ref": obj.ref, "started_at": self._now()},
            payload={"backend_ref": obj.ref, "isolation": profile.isolation},
        )
        failpoint("create.after-running")
        return running

    def check_profile(self, profile: Profile) -> None:
        """What create would refuse about `profile` before making anything (its backend's
        capabilities and rules), checked without reading a secret or calling the backend:
        `sbx profiles validate` and create apply the same rules."""
        now = self.clock.now()
        request = _request_for(
            profile, "sbx-check", {**profile.labels, LABEL_INSTALL: self.install_id},
            {**profile.env, **dict.fromkeys(profile.secrets, "")}, now + profile.ttl.default,
            now + profile.ttl.max, idle=profile.ttl.idle)
        try:
            self._refuse_what_the_backend_cannot(profile, request,
                                                 self.adapter(profile.backend), restore=False)
        except (CapabilityNotSupported, InvalidRequest) as exc:  # a bad document, here
            raise BadInput(f"profile {profile.name!r}: {exc}") from None

    @staticmethod
    def _refuse_what_the_backend_cannot(profile: Profile, request: CreateRequest,
                                        adapter: Adapter, *, restore: bool) -> None:
        for asked, capability, field in ((request.read_only, Capability.READ_ONLY_ROOT,
                                          "read_only"),
                                         (request.user is not None, Capability.RUN_AS_USER,
                                          "user")):
            if asked and not adapter.supports(capability):
                raise CapabilityNotSupported(
                    f"the {profile.backend} backend cannot enforce {field}; remove it from "
                    f"the profile, or use a backend that `sbx doctor` lists with {capability}")
        if request.isolation != "container" and not adapter.supports(Capability.ISOLATION_GVISOR):
            raise BadInput(  # exit 2, nothing written (docs/security.md, "Isolation levels")
                f"isolation: {request.isolation} is not available on the {profile.backend} "
                f"backend; use a backend that `sbx doctor` lists with "
                f"{Capability.ISOLATION_GVISOR} (docker, compose), or isolation: container")
        if request.ports and not adapter.supports(Capability.PORTS):  # exit 2: the profile's
            raise BadInput(
                f"the {profile.backend} backend cannot publish ports (the profile's ports: "
                f"{list(request.ports)}); remove ports:, or use a backend that `sbx doctor` "
                f"lists with {Capability.PORTS}")
        if request.services and not adapter.supports(Capability.SERVICES):
            raise CapabilityNotSupported(
                f"the {profile.backend} backend cannot run services beside a sandbox")
        if profile.setup and not restore and not adapter.supports(Capability.EXEC):
            raise CapabilityNotSupported(
                f"the {profile.backend} backend cannot run the profile's setup commands")
        adapter.validate(request)  # what this backend cannot enforce is refused, not ignored
        if restore and not adapter.supports(Capability.SNAPSHOT):
            raise Conflict(f"the {profile.backend} backend cannot restore checkpoints")

    async def set_up(self, lease: Lease, obj: BackendObject, adapter: Adapter,
                     profile: Profile) -> None:
        """The profile's setup commands, in order, each recorded as an exec, while the row
        still says creating, under the lease: nobody uses (or claims) a sandbox half set up,
        and one whose maker dies in the middle is failed by reconcile, never made running.
        A command that fails fails the sandbox, which is then destroyed: it is not what the
        profile describes (OperationFailed says why)."""
        with self.db.write() as conn:  # the object is known before anything runs in it
            conn.execute(SANDBOXES.update().where(
                SANDBOXES.c.id == lease.sandbox_id, SANDBOXES.c.fence == lease.fence,
                SANDBOXES.c.lease_owner == self.lease_owner).values(backend_ref=obj.ref))
        from sandboxer.core.rules.profiles import dump

        as_recorded = {"profile_json": json.dumps(dump(profile))}
        try:
            async with self.leases.holding(lease):
                for number, command in enumerate(profile.setup):
                    if number:
                        failpoint("create.during-setup")
                    argv = ["sh", "-c", command]
                    result = await adapter.exec(obj.ref, argv)
                    self._record_exec(lease.sandbox_id, self._masked_argv(as_recorded, argv),
                                      result, _digest(result.stdout), _digest(result.stderr))
                    if result.exit_code != 0:
                        said = (result.stderr or result.stdout).decode(errors="replace").strip()
                        raise OperationFailed(
                            f"setup command {command!r} exited {result.exit_code} "
                            f"({said.splitlines()[-1] if said else 'no output'})")
        except BaseException as exc:
            message = str(exc) or type(exc).__name__
            try:
                self.leases.finish(lease, State.FAILED, reason="failed",
                                   payload={"error": message},
                                   values={"backend_ref": obj.ref, "error": message,
                                           "ended_at": self._now()})
            except LeaseLost:
                raise OperationFailed(message) from exc
            if not isinstance(exc, Exception):
                raise
            await self._destroy(lease.sandbox_id, adapter, reason="failed", error=message)
            raise OperationFailed(f"{message}; sandbox {lease.sandbox_id} was destroyed") from exc

    @staticmethod
    def _read_secrets(refs: Mapping[str, str]) -> dict[str, str]:
        """Secret values, read now from where the references point; never stored."""
        values = {}
        for key, ref in refs.items():
            variable = ref.removeprefix("env:")
            if variable not in os.environ:
                raise BadInput(f"secret {key!r} refers to {ref}, but ${variable} is not set")
            values[key] = os.environ[variable]
        return values

    # -- destroy ----------------------------------------------------------------------------

    def make_room(self) -> bool:
        """Before ending sandboxes on a nearly full disk: release the reserve (sandboxer.core.rules.reserve)."""
        return self.db.make_room()

    @telemetry.traced("sbx.destroy")
    async def destroy(self, ref: str, *, reason: str = "manual") -> tuple[dict[str, Any], bool]:
        """Destroy one sandbox. Returns (row, done_now); already destroyed is (row, False)."""
        self.make_room()
        row = self.resolve(ref)
        if row["state"] == State.DESTROYED:
            return row, False
        if row["state"] != State.DESTROYING:
            transition_event(row["state"], State.DESTROYING)  # refuse before any I/O
        adapter = await self.adapter_for(row)  # unreachable: exit 5 before anything is written
        return await self._destroy(row["id"], adapter, reason=reason), True

    async def destroy_many(self, sandbox_ids: Sequence[str]) -> dict[str, list[Any]]:
        """Destroy each in turn; one failure does not stop the others. The outcome by id;
        each failure with its exit code and kind (the front end reports the first's)."""
        from sandboxer.core.rules.errors import classify

        result: dict[str, list[Any]] = {"destroyed": [], "already_destroyed": [], "failed": []}
        for sandbox_id in sandbox_ids:
            try:
                _, done = await self.destroy(sandbox_id)
                result["destroyed" if done else "already_destroyed"].append(sandbox_id)
            except Exception as exc:
                code, kind = classify(exc)
                result["failed"].append({"id": sandbox_id, "code": code, "kind": kind,
                                         "error": one_line(exc)})
        return result

    @telemetry.traced("sbx.destroy", lambda self, sandbox_id, backend, *, reason: {
        telemetry.SANDBOX_ID: sandbox_id, telemetry.BACKEND: backend,
        "sbx.destroy.reason": reason, "sbx.destroy.by": "reaper"})
    async def destroy_if(self, sandbox_id: str, backend: str, *,
                         reason: str | None) -> dict[str, Any] | None:
        """The reaper's destroy: only if, inside the transaction, the reason still holds
        (still expired; still failed; an interrupted destroy). None when it no longer does.
        The reaper has just listed the backend, so it is not pinged again."""
        def still_due(row: Mapping[str, Any]) -> str | None:
            if reason in EXPIRY_REASONS:
                if row["state"] not in REAPABLE or self.leases.held_by_another(row):
                    return f"it is {row['state']}"
                if not expiry_reason(row, self.clock.now()):
                    return "its deadline moved (extended or touched)"
            elif reason == "failed" and row["state"] != State.FAILED:
                return f"it is {row['state']}, not failed"
            elif reason is None and row["state"] != State.DESTROYING:
                return f"it is {row['state']}, not destroying"
            return None

        def reason_now(current: Mapping[str, Any]) -> str | None:
            return expiry_reason(current, self.clock.now()) or reason  # idle may have become ttl

        expiring = reason in EXPIRY_REASONS
        try:
            return await self._destroy(sandbox_id, self.adapter(backend),
                                       reason=reason_now if expiring else reason,
                                       precondition=still_due, together=True)
        except (NotDue, NotFound):
            return None

    async def _destroy(self, sandbox_id: str, adapter: Adapter, *,
                       reason: str | None | Callable[[Mapping[str, Any]], str | None],
                       precondition: Callable[[Mapping[str, Any]], str | None] | None = None,
                       error: str | None = None, together: bool = False) -> dict[str, Any]:
        """`error`: why it ends, kept in its record (a failed setup). `together`: the intent
        shares a commit with the others asked at once (Leases.begin_together; the reaper's)."""
        if together:
            lease, row = await self.leases.begin_together(sandbox_id, State.DESTROYING,
                                                          reason=reason, precondition=precondition)
        else:
            lease, row = self.leases.begin(sandbox_id, State.DESTROYING, reason=reason,
                                           precondition=precondition)
        failpoint("destroy.after-intent")
        try:
            async with self.leases.holding(lease):
                refs = [row["backend_ref"]] if row["backend_ref"] else [
                    obj.ref for obj in await adapter.list({LABEL_ID: row["id"]})
                ]
                for backend_ref in refs:
                    await adapter.destroy(backend_ref, services=_made_with_services(row))
        except BaseException as exc:
            message = str(exc) or type(exc).__name__
            self.leases.release(lease, message)
            if isinstance(exc, AdapterError) or not isinstance(exc, Exception):
                raise
            raise OperationFailed(f"destroy failed on {row['backend']}: {message}") from exc
        failpoint("destroy.after-backend")
        row = self.leases.finish(lease, State.DESTROYED, reason=lease.reason,
                                 values={"ended_at": self._now(),
                                         **({"error": error} if error else {})})
        # why, as the sandbox.destroying event says (the reaper's report carries it on)
        return {**row, "destroy_reason": lease.reason}

    # -- deadlines --------------------------------------------------------------------------

    @telemetry.traced("sbx.extend")
    async def extend(self, ref: str, by: timedelta) -> tuple[dict[str, Any], bool]:
        """Add `by` to the deadline in one atomic update: never earlier, never past the hard
        deadline. Returns (row, capped). A reaper that re-checks after this keeps the sandbox."""
        if by <= timedelta(0):
            raise BadInput(f"bad duration {format_duration(by)!r}: extend only adds time")
        current = self.resolve(ref)
        sandbox_id = current["id"]
        adapter = self.adapter(current["backend"])  # before writing: unavailable changes nothing
        with self.db.write() as conn:
            row = conn.execute(sa.select(SANDBOXES).where(SANDBOXES.c.id == sandbox_id).with_for_update()
                               ).mappings().first()
            if row["state"] not in ON_THE_CLOCK:
                raise Conflict(f"sandbox {sandbox_id} is {row['state']}: cannot extend")
            new, capped = extended(from_iso(row["deadline"]), from_iso(row["hard_deadline"]), by)
            # a tenant's longest TTL counts from the sandbox's start (a warm one's claim)
            start = row["started_at"] if row["launch"] == "warm" else row["created_at"]
            tenancy.check_ttl(tenancy.quotas(conn, row["owner"]), row["owner"],
                              new - from_iso(start))
            new_iso = to_iso(new)
            updated = conn.execute(  # asking for more time is activity: the idle clock restarts
                SANDBOXES.update().where(SANDBOXES.c.id == sandbox_id)
                .values(deadline=new_iso, last_activity_at=self._now()).returning(SANDBOXES)
            ).mappings().first()
            self.event(conn, sandbox_id, "sandbox.extended", reason="manual", payload={
                "from": row["deadline"], "to": new_iso, "by": format_duration(by),
                "capped": capped,
            })
        if adapter.supports(Capability.SET_DEADLINE) and row["backend_ref"]:
            await adapter.set_deadline(row["backend_ref"], new)
        return dict(updated), capped

    def touch(self, ref: str) -> dict[str, Any]:
        """Record activity now: the idle clock starts again."""
        return self._mark_active(self.resolve(ref)["id"], event=True)

    def _mark_active(self, sandbox_id: str, *, event: bool = False) -> dict[str, Any]:
        with self.db.write() as conn:
            row = conn.execute(_MARK_ACTIVE, {"sandbox_id": sandbox_id, "at": self._now()}
                               ).mappings().first()
            if row is None:
                state = conn.execute(sa.select(SANDBOXES.c.state)
                                     .where(SANDBOXES.c.id == sandbox_id)).scalar()
                raise Conflict(f"sandbox {sandbox_id} is {state}: cannot touch")
            if event:
                self.event(conn, sandbox_id, "sandbox.touched", reason="manual")
        return dict(row)

    @telemetry.traced("sbx.touch")
    async def record_activity(self, ref: str) -> dict[str, Any]:
        """`sbx touch`: the idle clock starts again here, and on the backend if it keeps one."""
        row = self.touch(ref)
        keeps_idle_clock = type(self.adapter(row["backend"])).touch is not Adapter.touch
        if keeps_idle_clock and row.get("backend_ref"):
            await (await self.adapter_for(row)).touch(row["backend_ref"])
        return row

    def warn_expiring(self, sandbox_id: str, warn_before: timedelta) -> bool:
        """Write `sandbox.expiring` once per deadline, if still due."""
        now = self.clock.now()
        with self.db.write() as conn:
            row = conn.execute(sa.select(SANDBOXES).where(SANDBOXES.c.id == sandbox_id).with_for_update()
                               ).mappings().first()
            if row is None or not warning_due(row, now, warn_before):
                return False
            deadline = effective_deadline(row)
            conn.execute(SANDBOXES.update().where(SANDBOXES.c.id == sandbox_id)
                         .values(warned_deadline=to_iso(deadline)))
            idle = row["idle_timeout_s"] and deadline < from_iso(row["deadline"])
            self.event(conn, sandbox_id, "sandbox.expiring", reason="idle" if idle else "ttl",
                        payload={"deadline": to_iso(deadline),
                                 "in_s": int((deadline - now).total_seconds())})
        return True

    # -- reconcile --------------------------------------------------------------------------

    @making_room
    def adopt(self, backend: str, obj: BackendObject) -> bool:
        """A backend object of ours with no row (the database was lost or restored): record it,
        keeping the hard deadline its label carries, so the reaper ends it on time."""
        sandbox_id = obj.labels[LABEL_ID]
        hard = obj.labels[LABEL_HARD_DEADLINE]
        now = self._now()
        created = to_iso(obj.created_at) if obj.created_at else now
        labels = {k: v for k, v in obj.labels.items() if not k.startswith("sbx.")}
        with self.db.write() as conn:
            if conn.execute(sa.select(SANDBOXES.c.id).where(SANDBOXES.c.id == sandbox_id)).first():
                return False
            conn.execute(SANDBOXES.insert().values(
                id=sandbox_id, name=None, profile="(adopted)", profile_json="{}",
                backend=backend, backend_ref=obj.ref, install_id=self.install_id,
                host=settings.host_name(), state=State.PAUSED if obj.status == "paused" else State.RUNNING,
                owner="(unknown: adopted)", task=None, labels_json=json.dumps(labels),
                created_at=created, started_at=created, deadline=hard, hard_deadline=hard,
                last_activity_at=now, fence=0,
            ))
            self.event(conn, sandbox_id, ADOPTED_EVENT, reason="orphan",
                        payload={"backend": backend, "backend_ref": obj.ref, "deadline": hard})
        return True

    async def settle_interrupted_create(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """A create whose maker stopped (its lease lapsed, or its process is gone), settled
        now as reconcile would: running if its backend object exists, failed if not, or if
        its setup may not have finished (then its object is removed)."""
        adapter = await self.adapter_for(row)
        found = await adapter.list({LABEL_ID: row["id"]})
        if found and not runs_setup(row):
            self.finish_interrupted_create(row["id"], found[0])
        elif self.record_backend_state(row["id"], State.CREATING, State.FAILED,
                                       reason="failed") and found:  # half set up: ended
            await self._destroy(row["id"], adapter, reason="failed")
        return self.resolve(row["id"])

    @making_room
    def finish_interrupted_create(self, sandbox_id: str, obj: BackendObject) -> bool:
        """A create that died after the backend made the object: the sandbox is running."""
        with self.db.write() as conn:
            row = conn.execute(sa.select(SANDBOXES).where(SANDBOXES.c.id == sandbox_id).with_for_update()
                               ).mappings().first()
            if row is None or row["state"] != State.CREATING or self.leases.held_by_another(row):
                return False
            conn.execute(SANDBOXES.update().where(SANDBOXES.c.id == sandbox_id).values(
                state=State.RUNNING, backend_ref=obj.ref, started_at=self._now(),
                lease_owner=None, lease_expires_at=None, fence=SANDBOXES.c.fence + 1))
            self.event(conn, sandbox_id, transition_event(State.CREATING, State.RUNNING),
                        payload={"backend_ref": obj.ref, "completed_by": "reconcile"})
        return True

    @making_room
    def record_backend_state(self, sandbox_id: str, expect: str | None, target: str,
                             *, reason: str | None = None) -> bool:
        """What reconcile saw on the backend (lost, paused, resumed, failed), if the row is
        still as the plan saw it and nobody holds it."""
        with self.db.write() as conn:
            row = conn.execute(sa.select(SANDBOXES).where(SANDBOXES.c.id == sandbox_id).with_for_update()
                               ).mappings().first()
            if row is None or self.leases.held_by_another(row) or (expect and row["state"] != expect):
                return False
            event_type = transition_event(row["state"], target)
            values: dict[str, Any] = {"state": target, "fence": SANDBOXES.c.fence + 1,
                                      "lease_owner": None, "lease_expires_at": None}
            if target in (State.LOST, State.FAILED):
                values["ended_at"] = self._now()
            if target == State.FAILED and row["state"] == State.CREATING and not row["error"]:
                values["error"] = MAKER_STOPPED
            conn.execute(SANDBOXES.update().where(SANDBOXES.c.id == sandbox_id).values(**values))
            self.event(conn, sandbox_id, event_type, reason=reason,
                        payload={"observed_by": "reconcile"})
        return True

    def restarts_seen(self, ids: Sequence[str]) -> dict[str, str]:
        placeholder = "?" if self.db.engine.dialect.paramstyle == "qmark" else "%s"
        with self.db.read() as conn:
            return inventory.restarts_seen(conn.connection.driver_connection, list(ids),
                                           placeholder)

    async def record_restart(self, sandbox_id: str, backend: str, expect: str,
                             obj: BackendObject) -> bool:
        """The backend started the sandbox again (an engine restart; Docker's restart policy
        brings its containers back): record it once, as `sandbox.restarted`. A sandbox that
        was paused comes back running, so it is paused again first; it keeps its deadline."""
        started = to_iso(obj.restarted_at)
        lease = None
        if expect == State.PAUSED:
            adapter = self.adapter(backend)
            lease = self.leases.take(sandbox_id, {State.PAUSED}, "pause again")
            try:
                async with self.leases.holding(lease):
                    await adapter.pause(obj.ref)
            except BaseException:
                self.leases.give_back(lease)
                raise
        return self._record_restart(sandbox_id, expect, started, lease)

    @making_room
    def _record_restart(self, sandbox_id: str, expect: str, started: str,
                        lease: Lease | None) -> bool:
        with self.db.write() as conn:
            row = conn.execute(sa.select(SANDBOXES).where(SANDBOXES.c.id == sandbox_id)
                               .with_for_update()).mappings().first()
            if row is None or row["state"] != expect:
                return False
            if lease is None and self.leases.held_by_another(row):
                return False
            if lease is not None and (row["fence"] != lease.fence
                                      or row["lease_owner"] != self.lease_owner):
                return False  # taken over meanwhile: the new holder decides
            last = conn.execute(
                sa.select(EVENTS.c.payload_json)
                .where(EVENTS.c.sandbox_id == sandbox_id, EVENTS.c.type == RESTARTED_EVENT)
                .order_by(EVENTS.c.id.desc()).limit(1)).scalar()
            if lease is not None:
                self.leases.give_back(lease, conn)
            if last and json.loads(last).get("backend_started_at") == started:
                return False  # another reconcile recorded this one
            self.event(conn, sandbox_id, RESTARTED_EVENT, reason="restarted", payload={
                "backend_started_at": started, "state": expect,
                "paused_again": lease is not None, "observed_by": "reconcile"})
        return True

    @telemetry.traced("sbx.destroy", lambda self, backend, ref, sandbox_id, *, reason: {
        telemetry.BACKEND: backend, telemetry.SANDBOX_ID: sandbox_id,
        "sbx.destroy.reason": reason, "sbx.destroy.by": "orphan sweep"})
    async def destroy_orphan(self, backend: str, ref: str, sandbox_id: str | None,
                             *, reason: str | None) -> bool:
        """Remove a backend object no live row claims. Re-checked against the database first."""
        if sandbox_id:
            with self.db.read() as conn:
                state = conn.execute(sa.select(SANDBOXES.c.state)
                                     .where(SANDBOXES.c.id == sandbox_id)).scalar()
            if state is not None and state != State.DESTROYED:
                return False
        await self.adapter(backend).destroy(ref)
        self._record_orphan_destroyed(backend, ref, sandbox_id, reason)
        return True

    @making_room
    def _record_orphan_destroyed(self, backend: str, ref: str, sandbox_id: str | None,
                                 reason: str | None) -> None:
        with self.db.write() as conn:
            self.event(conn, sandbox_id, "sandbox.orphan-destroyed", reason=reason,
                        payload={"backend": backend, "backend_ref": ref})

    # -- pause and resume -------------------------------------------------------------------

    @telemetry.traced("sbx.pause")
    async def pause(self, ref: str) -> dict[str, Any]:
        """Freeze the sandbox (no CPU); it keeps its deadline and is reaped on time."""
        return await self._freeze(ref, State.RUNNING, State.PAUSED, "pause")

    @telemetry.traced("sbx.resume")
    async def resume(self, ref: str) -> dict[str, Any]:
        return await self._freeze(ref, State.PAUSED, State.RUNNING, "resume")

    async def _freeze(self, ref: str, source: State, target: State, verb: str) -> dict[str, Any]:
        row = self.resolve(ref)
        adapter = self.adapter(row["backend"])
        if not adapter.supports(Capability.PAUSE):
            raise Conflict(f"the {row['backend']} backend cannot {verb}")
        if row["state"] != source:
            raise Conflict(f"sandbox {row['id']} is {row['state']}: cannot {verb}")
        await self.adapter_for(row)
        lease = self.leases.take(row["id"], {source}, verb)
        try:
            async with self.leases.holding(lease):
                await (adapter.pause if target == State.PAUSED else adapter.resume)(
                    row["backend_ref"])
                if target == State.RUNNING and adapter.supports(Capability.SET_DEADLINE):
                    # a backend that resumes with a timer of its own gets the deadline back
                    await adapter.set_deadline(row["backend_ref"], effective_deadline(row))
        except BaseException:
            self.leases.give_back(lease)
            raise
        return self.leases.finish(lease, target, reason="manual")

    # -- exec and logs ----------------------------------------------------------------------

    def _usable(self, row: Mapping[str, Any], capability: Capability, verb: str) -> Adapter:
        if row["state"] != State.RUNNING:
            raise Conflict(f"sandbox {row['id']} is {row['state']}: cannot {verb}")
        adapter = self.adapter(row["backend"])
        if not adapter.supports(capability):
            raise Conflict(f"the {row['backend']} backend cannot {verb}")
        return adapter

    def _start_using(self, ref: str, capability: Capability, verb: str,
                     argv: Sequence[str], *, also: tuple[Capability, str] | None = None,
                     ) -> tuple[dict[str, Any], list[str]]:
        """The sandbox `ref` names, checked usable for `verb` (and, with `also`, for that
        capability's own verb) and marked active (a long command is activity from its
        start), with `argv` as the log keeps it: one write transaction, so a refusal (not
        running, a bad mask pattern, a capability its backend lacks) changes nothing."""
        from sandboxer.core.store.refs import resolve, whole_id

        at = self._now()
        with self.db.write() as conn:
            row = conn.execute(_MARK_RUNNING, {"sandbox_id": whole_id(ref, PREFIX), "at": at}
                               ).mappings().first()
            if row is None:  # a name or an id prefix, or not running: resolve says which
                found = resolve(conn, SANDBOXES, ref, id_prefix=PREFIX, what="sandbox",
                                live=lambda row: row["state"] != State.DESTROYED)
                self._usable(found, capability, verb)  # why not, when it is not running
                row = conn.execute(_MARK_RUNNING, {"sandbox_id": found["id"], "at": at}
                                   ).mappings().first()
                if row is None:  # it changed state since it was read (PostgreSQL)
                    raise Conflict(f"sandbox {ref} changed meanwhile: cannot {verb}")
            tenancy.check(row, "sandbox", ref)  # a whole id of another tenant's: not found
            self._usable(row, capability, verb)
            if also is not None:
                self._usable(row, *also)
            recorded = self._masked_argv(row, argv)
            if capability is Capability.EXEC:
                limits = tenancy.quotas(conn, row["owner"])
                self._exec_limits[row["owner"]] = None if limits is None else \
                    limits["max_execs"]
        telemetry.note_sandbox(row)
        return dict(row), recorded

    @contextlib.contextmanager
    def _exec_slot(self, owner: str) -> Iterator[None]:
        """One of the owner's concurrent execs in this process (its quota max_execs)."""
        most = self._exec_limits.get(owner)
        if most is not None and self._execs_running[owner] >= most:
            raise QuotaExceeded(f"tenant {owner!r} runs {self._execs_running[owner]} commands: "
                                f"its quota max_execs is {most}")
        self._execs_running[owner] += 1
        try:
            yield
        finally:
            self._execs_running[owner] -= 1

    @telemetry.traced("sbx.exec")
    async def exec(self, ref: str, argv: Sequence[str], timeout: timedelta | None = None, *,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None, stdin: Stdin = None) -> ExecResult:
        """Run a command; record it as an event (argv, exit code, duration, output digests;
        env by names only, cwd, user, stdin's digest)."""
        options = _exec_options(argv, env, cwd, user)
        row, recorded = self._start_using(ref, Capability.EXEC, "exec", argv,
                                          also=_as_user(user))
        feed = _Digesting(stdin)
        with self._exec_slot(row["owner"]):
            adapter = await self._adapter_for_a_command(row)
            try:
                running = asyncio.ensure_future(adapter.exec(
                    row["backend_ref"], list(argv), timeout.total_seconds() if timeout else None,
                    env=_exec_env(env), **exec_options(cwd, user, feed.stdin)))
                feed.settle()  # while the command runs
                result = await running
            except Exception:
                await _refused_elsewhere(adapter, row)
                raise
        self._record_exec(row["id"], recorded, result, _digest(result.stdout),
                          _digest(result.stderr), options=feed.recorded(options))
        return result

    @telemetry.traced("sbx.exec")
    async def exec_stream(self, ref: str, argv: Sequence[str],
                          timeout: timedelta | None = None, *,
                          env: Mapping[str, str] | None = None, cwd: str | None = None,
                          user: str | None = None, stdin: Stdin = None,
                          ) -> AsyncIterator[tuple[str, Any]]:
        """Run a command, yielding `("stdout" | "stderr", bytes)` as the output comes and
        then `("exit", {"exit_code", "duration", "timed_out"})`; recorded as exec is."""
        options = _exec_options(argv, env, cwd, user)
        row, recorded = self._start_using(ref, Capability.EXEC, "exec", argv,
                                          also=_as_user(user))
        feed = _Digesting(stdin)
        with self._exec_slot(row["owner"]):
            adapter = await self._adapter_for_a_command(row)
            digests = {"stdout": hashlib.sha256(), "stderr": hashlib.sha256()}
            sizes = {"stdout": 0, "stderr": 0}
            try:
                async for item in adapter.exec_stream(
                        row["backend_ref"], list(argv), timeout.total_seconds() if timeout else None,
                        env=_exec_env(env), **exec_options(cwd, user, feed.stdin)):
                    if isinstance(item, ExecResult):
                        self._record_exec(row["id"], recorded, item, *(
                            {"sha256": digests[s].hexdigest(), "bytes": sizes[s]}
                            for s in ("stdout", "stderr")), options=feed.recorded(options))
                        yield "exit", {"exit_code": item.exit_code, "duration": item.duration_s,
                                       "timed_out": item.timed_out}
                        return
                    stream, data = item
                    digests[stream].update(data)
                    sizes[stream] += len(data)
                    yield stream, data
            except Exception:
                await _refused_elsewhere(adapter, row)
                raise

    def _record_exec(self, sandbox_id: str, recorded: Sequence[str], result: ExecResult,
                     stdout: Mapping[str, Any], stderr: Mapping[str, Any], *,
                     options: Mapping[str, Any] | None = None) -> None:
        """The exec's event; `recorded` is the argv as the log keeps it (masked); `options`
        what was given of env (names only), cwd, user and stdin (its digest)."""
        with self.db.write() as conn:
            conn.execute(_MARK_EXECUTED, {"sandbox_id": sandbox_id, "at": self._now()})
            self.event(conn, sandbox_id, "sandbox.exec", payload={
                "argv": list(recorded),
                "exit_code": result.exit_code,
                "timed_out": result.timed_out,
                "duration_s": round(result.duration_s, 3),
                "stdout": stdout,
                "stderr": stderr,
                **(options or {}),
            })

    @staticmethod
    def _masked_argv(row: Mapping[str, Any], argv: Sequence[str]) -> list[str]:
        """argv as the event log keeps it: the values of the sandbox's own secrets (read now
        from where its profile's references point; a variable no longer set is not known)
        and the matches of the settings' `[events] mask` patterns become `***`."""
        refs = json.loads(row["profile_json"] or "{}").get("secrets") or {}
        values = [os.environ.get(ref.removeprefix("env:"), "") for ref in refs.values()]
        return eventlog.mask_argv(argv, values, settings.mask_patterns())

    async def metrics(self, ref: str, *, follow: bool = False) -> AsyncIterator[dict[str, Any]]:
        """Live samples from the backend, stored at a bounded rate for history. Without
        `follow`, the first sample that has a CPU figure (or none: "no sample yet")."""
        from sandboxer.core.store.models import MetricSample

        row = self.resolve(ref)
        if row["state"] not in ACTIVE:
            raise Conflict(f"sandbox {row['id']} is {row['state']}: it has no live metrics")
        adapter = self.adapter(row["backend"])
        if not adapter.supports(Capability.METRICS):
            raise Conflict(f"the {row['backend']} backend reports no metrics")
        samples = MetricSample.__table__
        every, keep = settings.metrics_every(), settings.metrics_retention()
        last_kept = None
        async for sample in adapter.metrics(row["backend_ref"]):
            view = {"sandbox_id": row["id"], **_sample_view(sample)}
            due = sample.cpu_pct is not None and (
                last_kept is None or sample.time - last_kept >= every)
            if due:  # kept at most once per `every`, whichever process reads
                with self.db.write() as conn:
                    last = conn.execute(sa.select(sa.func.max(samples.c.time))
                                        .where(samples.c.sandbox_id == row["id"])).scalar()
                    if last is None or sample.time - from_iso(last) >= every:
                        conn.execute(samples.insert().values(view))
                        last_kept = sample.time
                    # retention for every sandbox, measured on the samples' own clock
                    conn.execute(samples.delete().where(
                        samples.c.time < to_iso(sample.time - keep)))
            if follow or sample.cpu_pct is not None:
                yield view
            if not follow and sample.cpu_pct is not None:
                return

    def metric_history(self, ref: str) -> list[dict[str, Any]]:
        from sandboxer.core.store.models import MetricSample

        samples = MetricSample.__table__
        sandbox_id = self.resolve(ref)["id"]
        with self.db.read() as conn:
            return [dict(r) for r in conn.execute(
                sa.select(samples).where(samples.c.sandbox_id == sandbox_id)
                .order_by(samples.c.time)).mappings()]

    async def logs(self, ref: str, *, follow: bool = False,
                   tail: int | None = None) -> AsyncIterator[bytes]:
        row = self.resolve(ref)
        if row["state"] not in (State.RUNNING, State.PAUSED):
            raise Conflict(f"sandbox {row['id']} is {row['state']}: its logs are gone")
        adapter = self.adapter(row["backend"])
        if not adapter.supports(Capability.LOGS):
            raise Conflict(f"the {row['backend']} backend has no logs")
        last_touch = None
        async for chunk in adapter.logs(row["backend_ref"], follow=follow, tail=tail):
            now = self.clock.now()
            if follow and (last_touch is None or now - last_touch >= ACTIVITY_EVERY):
                self._mark_active(row["id"])  # someone is watching: that is activity
                last_touch = now
            yield chunk


def refuse_taken_name(conn: Connection, name: str, owner: str) -> None:
    """Conflict when a sandbox of `owner` that is not destroyed has `name` (unique among an
    owner's live ones: tenants name theirs freely, core/store/tenancy.py); inside the transaction
    that gives the name."""
    serialise(conn, LOCK_SANDBOX_NAMES)
    if conn.execute(sa.select(SANDBOXES.c.id).where(
            SANDBOXES.c.name == name, SANDBOXES.c.owner == owner,
            SANDBOXES.c.state != State.DESTROYED)).first():
        raise Conflict(f"name {name!r} is taken by a sandbox that is not destroyed")


def _sample_view(sample: Any) -> dict[str, Any]:
    return {"time": to_iso(sample.time), "cpu_pct": sample.cpu_pct,
            "memory_bytes": sample.memory_bytes, "memory_limit": sample.memory_limit,
            "net_rx_bytes": sample.net_rx_bytes, "net_tx_bytes": sample.net_tx_bytes,
            "pids": sample.pids}


def _made_with_services(row: Mapping[str, Any]) -> bool:
    """Whether the sandbox was made with services beside it (its profile as recorded at
    create): destroy's `services=` (sandboxer.adapters.base.Adapter.destroy), so one made
    without any is not looked through for them."""
    return bool(json.loads(row["profile_json"] or "{}").get("services"))


def _digest(data: bytes) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


# -- exec's options (issue 31: env, cwd, user, stdin) -------------------------------------------

def _exec_options(argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
                  user: str | None) -> dict[str, Any]:
    """Check exec's argv and options before anything is written (BadInput, exit 2), and
    return what the event records of them: env by names only (its values are secrets),
    cwd and user as given."""
    if not argv:
        raise BadInput("no command given: use sbx exec ID -- CMD [ARG...]")
    recorded: dict[str, Any] = {}
    if env:
        if not isinstance(env, Mapping):
            raise BadInput("env must be a mapping of names to values")
        for name, value in env.items():
            if not isinstance(name, str) or not name or "=" in name or "\0" in name:
                raise BadInput(f"env: bad variable name {name!r} (no '=' and not empty)")
            if not isinstance(value, str) or "\0" in value:
                raise BadInput(f"env: the value of {name} must be text without NUL")
        recorded["env"] = sorted(env)
    if cwd is not None:
        recorded["cwd"] = sandbox_path(cwd, "cwd")
    if user is not None:
        if not isinstance(user, str) or not user.strip() or any(c.isspace() for c in user):
            raise BadInput(f"user: {user!r} is not a user (give NAME, UID, NAME:GROUP "
                           "or UID:GID)")
        recorded["user"] = user
    return recorded


def sandbox_path(path: Any, what: str = "path") -> str:
    """An absolute POSIX path inside a sandbox, normalised; BadInput (exit 2) otherwise."""
    import posixpath

    if not isinstance(path, str) or not path:
        raise BadInput(f"{what}: give an absolute path inside the sandbox, such as /work")
    if "\0" in path:
        raise BadInput(f"{what}: a path cannot hold a NUL character")
    if not path.startswith("/"):
        raise BadInput(f"{what} {path!r} is relative: give an absolute path inside the "
                       "sandbox (starting with /)")
    return "/" + posixpath.normpath(path).lstrip("/")


def _as_user(user: str | None) -> tuple[Capability, str] | None:
    return None if user is None else (Capability.RUN_AS_USER, "run a command as another user")


def _exec_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    """The caller's variables, with the trace context (TRACEPARENT) while tracing is on."""
    merged = {**(env or {}), **telemetry.trace_env()}
    return merged or None


class _Digesting:
    """exec's stdin as given (bytes, or chunks streamed on as they come), its SHA-256 and
    size taken while it passes, for the event; never kept."""

    def __init__(self, stdin: Stdin) -> None:
        self._hash = hashlib.sha256()
        self._bytes = 0
        self.given = stdin is not None
        if stdin is None:
            self.stdin: Stdin = None
        elif isinstance(stdin, bytes | bytearray | memoryview):
            self.stdin = bytes(stdin)
            self._pending: bytes | None = self.stdin  # hashed by `settle`
            self._bytes = len(self.stdin)
        elif hasattr(stdin, "__aiter__"):
            self.stdin = self._through(stdin)
        else:
            raise BadInput("stdin must be bytes or an async iterator of bytes")

    async def _through(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            if not isinstance(chunk, bytes | bytearray | memoryview):
                raise BadInput("stdin: each chunk must be bytes")
            self._hash.update(chunk)
            self._bytes += len(chunk)
            yield bytes(chunk)

    def settle(self) -> None:
        """Hash stdin given as bytes (exec calls it once the command has started, so the
        hashing overlaps the command rather than delaying it)."""
        pending = getattr(self, "_pending", None)
        if pending is not None:
            self._hash.update(pending)
            self._pending = None

    def recorded(self, options: Mapping[str, Any]) -> dict[str, Any]:
        if not self.given:
            return dict(options)
        self.settle()
        return {**options, "stdin": {"sha256": self._hash.hexdigest(), "bytes": self._bytes}}


def _request_for(profile: Profile, sandbox_id: str, labels: Mapping[str, str],
                 env: Mapping[str, str], deadline: datetime, hard_deadline: datetime, *,
                 idle: timedelta | None) -> CreateRequest:
    """What a backend is asked to make for `profile`."""
    return CreateRequest(
        sandbox_id=sandbox_id,
        labels=dict(labels),
        image=profile.image or profile.template,
        command=profile.command,
        resources=ResourceLimits(
            cpu=profile.resources.cpu,
            memory_bytes=profile.resources.memory,
            disk_bytes=profile.resources.disk,
            pids=profile.resources.pids,
            gpu=profile.resources.gpu,
        ),
        network=profile.network.mode,
        network_allow=tuple(profile.network.allow),
        env=dict(env),
        deadline=deadline,
        hard_deadline=hard_deadline,
        idle=idle,
        services=tuple(ServiceSpec(name, svc.image, svc.command, dict(svc.environment))
                       for name, svc in profile.services.items()),
        options=profile.options,
        read_only=profile.read_only,
        user=profile.user,
        isolation=profile.isolation,
        compose=profile.compose.model_dump() if profile.compose else None,
        ports=tuple(profile.ports),
        publish_address=profile.publish_address,
    )
