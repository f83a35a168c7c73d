"""Warm pools: sandboxes made ahead of need from a profile that declares `pool: {size, max_age}`,
so that a create claims one in milliseconds instead of waiting for the backend (docs/pools.md).

A member is a real sandbox in a state of its own, `warm`: made from its profile by the
reaper's fill (`Manager.create(..., pool_member=True)`), labelled as ours and with `sbx.pool`,
owned by nobody, and left out of every listing of users' sandboxes. Its deadline is its
pool's max_age; its hard deadline (the `sbx.hard-deadline` label, Modal's timeout) is max_age
plus the profile's ttl.max, the latest any claim of it can need.

`create` from a pooled profile claims the oldest member that fits the request, in one
compare-and-set (`UPDATE ... WHERE id = ? AND state = 'warm' AND fence = ?`): of concurrent
claimers exactly one wins each member, on SQLite (one writer at a time) and on PostgreSQL
(a loser's UPDATE finds the row changed and tries the next member). A claim writes what does
not change the backend object (name, labels, owner, task, the deadline from now); a request
that no member fits is created cold. A warm-served sandbox's user labels are in its record
only: a backend object's labels cannot change after it is made.

The reaper keeps each pool at its size (plan_pools, pure, then FILL and RETIRE actions): it
fills what is missing, retires members past max_age (plan_reap, as any deadline), members its
profile no longer fits, members beyond the size, and the members of a pool that no longer
exists. Crashes are handled as for any sandbox: a member whose create was interrupted is
failed and removed, never made warm half set up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxer.adapters.base import Capability
from sandboxer.core.rules.actions import FILL, RETIRE, Action
from sandboxer.core.rules.clock import from_iso, to_iso
from sandboxer.core.rules.errors import BadInput, NotDue, NotFound, OperationFailed, one_line
from sandboxer.core.rules.failpoints import failpoint
from sandboxer.core.rules.states import State, leased

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sandboxer.adapters.base import Adapter, BackendObject
    from sandboxer.core.lifecycle.leases import Lease
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import Profile

MEMBER_OWNER = "(pool)"  # who owns a warm member: nobody yet
# What a claim applies to a member, so what may differ between the profile a member was made
# from and the profile a create asks for: everything else shapes the backend object.
CLAIM_TIME_FIELDS = ("name", "description", "ttl", "labels", "checkpoints", "pool")
LOCK_POOLS = 0x5B0005  # pg_advisory_xact_lock key: fills re-check a pool's room one at a time
MEMBERS_SQL = "pool IS NOT NULL AND launch IS NULL"  # a member nobody has claimed
MAKE_AT_ONCE = 16  # members `sbx pool set` makes at once (as many as a reap acts on)


def is_member(row: Mapping[str, Any]) -> bool:
    """A pool member nobody has claimed (warm, being made, or ended before any claim)."""
    return bool(row.get("pool")) and not row.get("launch")


def member_key(profile_doc: Mapping[str, Any]) -> str:
    """What a member's backend object is made of: the resolved profile without the fields a
    claim applies. A member fits a create whose profile has the same key."""
    shape = {k: v for k, v in profile_doc.items() if k not in CLAIM_TIME_FIELDS}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def member_deadlines(profile: Profile, now: datetime) -> tuple[datetime, datetime]:
    """A new member's (deadline, hard deadline): its pool's max_age, and max_age plus the
    profile's ttl.max (the latest hard deadline a claim of it can give)."""
    assert profile.pool is not None
    return now + profile.pool.max_age, now + profile.pool.max_age + profile.ttl.max


def fits(row: Mapping[str, Any], key: str, ttl_max: timedelta, now: datetime) -> bool:
    """The warm member `row` can serve a create now of a profile of `key` and `ttl_max`: it
    is within its max_age, its hard deadline holds a full ttl.max from now, and it was made
    from a profile of that key."""
    if row["state"] != State.WARM or from_iso(row["deadline"]) <= now:
        return False
    if from_iso(row["hard_deadline"]) < now + ttl_max:
        return False
    return member_key(json.loads(row["profile_json"] or "{}")) == key


# -- claiming (inside Manager.create) -------------------------------------------------------


async def claim(mgr: Manager, profile: Profile, adapter: Adapter, instance: str | None, *,
                ttl: timedelta, name: str | None, labels: Mapping[str, str],
                owner: str | None, task: str | None,
                bind: Callable[[Any, str], None] | None = None) -> dict[str, Any] | None:
    """The oldest warm member of `profile`'s pool that fits, made the caller's sandbox (state
    running, the deadline from now); None when no member fits (then create it cold). Its
    `created_at` stays when the member was made; `started_at` becomes now, when it was
    handed out, which the deadline counts from.
    `bind(conn, id)` runs in the claim's transaction (an idempotent create's key)."""
    import sqlalchemy as sa

    from sandboxer.core.lifecycle import manager as manager_module
    from sandboxer.core.rules.profiles import dump
    from sandboxer.core.rules.ttl import effective_deadline

    sandboxes = manager_module.SANDBOXES
    doc = dump(profile)
    key = member_key(doc)
    failpoint("claim.before-claim")
    mgr.db.require_room()
    now = mgr.clock.now()
    now_iso = to_iso(now)
    values = {
        "state": State.RUNNING, "name": name, "owner": owner or mgr.actor, "task": task,
        "labels_json": json.dumps(dict(labels), sort_keys=True),
        "profile_json": json.dumps(doc, sort_keys=True), "started_at": now_iso,
        "deadline": to_iso(now + ttl), "hard_deadline": to_iso(now + profile.ttl.max),
        "last_activity_at": now_iso, "warned_deadline": None, "launch": "warm",
        "idle_timeout_s": int(profile.ttl.idle.total_seconds()) if profile.ttl.idle else None,
        "lease_owner": None, "lease_expires_at": None, "fence": sandboxes.c.fence + 1,
    }
    with mgr.db.write() as conn:
        if name is not None:
            manager_module.refuse_taken_name(conn, name, values["owner"])
        candidates = conn.execute(  # this installation's members, oldest first
            sa.select(sandboxes).where(sandboxes.c.state == State.WARM,
                                       sandboxes.c.pool == profile.name,
                                       sandboxes.c.install_id == mgr.install_id)
            .order_by(sandboxes.c.created_at, sandboxes.c.id)).mappings().all()
        row = None
        for member in candidates:
            if ((member["backend_instance"] or None) != (instance or None)
                    or mgr.leases.held_by_another(member)
                    or not fits(member, key, profile.ttl.max, now)):
                continue
            row = conn.execute(  # the compare-and-set: one claimer wins each member
                sandboxes.update().where(sandboxes.c.id == member["id"],
                                         sandboxes.c.state == State.WARM,
                                         sandboxes.c.fence == member["fence"])
                .values(**values).returning(sandboxes)).mappings().first()
            if row is not None:
                break
        if row is None:
            return None
        if bind is not None:
            bind(conn, row["id"])
        mgr.event(conn, row["id"], "sandbox.claimed", payload={
            "profile": profile.name, "pool": profile.name, "backend_ref": row["backend_ref"],
            "name": name, "owner": row["owner"], "task": task, "labels": dict(labels),
            "deadline": row["deadline"], "hard_deadline": row["hard_deadline"],
            "launch": "warm"})
    row = dict(row)
    failpoint("claim.after-claim")
    if adapter.supports(Capability.SET_DEADLINE):  # a backend with a clock of its own (E2B)
        try:
            await adapter.set_deadline(row["backend_ref"], effective_deadline(row))
        except Exception:  # the member is no good: end it, and serve the create cold
            with contextlib.suppress(Exception):  # else it is on the clock: reaped on time
                await mgr._destroy(row["id"], adapter, reason="failed")
            return None
    return row


# -- making members (inside Manager.create with pool_member=True) ---------------------------


def member_row(profile: Profile) -> dict[str, Any]:
    """The columns in which a new member's row differs from a sandbox created cold."""
    return {"owner": MEMBER_OWNER, "idle_timeout_s": None, "pool": profile.name,
            "launch": None}


def room(conn: Connection, profile: Profile, install_id: str, now_iso: str) -> bool:
    """Inside a fill's transaction: this installation's pool of `profile` has fewer members
    (warm or being made) than its size, re-checked here so that two reapers filling at once
    do not overfill it. Records the pool's start the first time."""
    import sqlalchemy as sa

    from sandboxer.core.lifecycle.manager import SANDBOXES
    from sandboxer.core.store.db import serialise
    from sandboxer.core.store.models import Pool

    pools = Pool.__table__
    serialise(conn, LOCK_POOLS)
    known = conn.execute(sa.select(pools).where(pools.c.profile == profile.name)
                         ).mappings().first()
    if known is None:
        conn.execute(pools.insert().values(profile=profile.name, started_at=now_iso))
    size = known["size"] if known is not None and known["size"] is not None else (
        profile.pool.size if profile.pool else 0)
    members = conn.execute(
        sa.select(sa.func.count()).select_from(SANDBOXES).where(
            SANDBOXES.c.pool == profile.name, SANDBOXES.c.launch.is_(None),
            SANDBOXES.c.install_id == install_id, SANDBOXES.c.deadline > now_iso,
            SANDBOXES.c.state.in_((State.CREATING, State.WARM)))).scalar()
    return members < size


async def finish_member(mgr: Manager, lease: Lease, obj: BackendObject, adapter: Adapter,
                        profile: Profile) -> dict[str, Any]:
    """The backend made the member: run the profile's setup (each command recorded as an
    exec), then make it warm, claimable. Setup runs while the row says creating, under the
    lease: nobody can claim a member half set up. A command that fails (or cannot run)
    fails the member, which is then destroyed."""
    from sandboxer.core.rules.errors import OperationFailed

    values = {"backend_ref": obj.ref, "started_at": mgr.now_iso()}
    if profile.setup:
        try:
            await mgr.set_up(lease, obj, adapter, profile)
        except OperationFailed as exc:
            raise OperationFailed(f"pool member {lease.sandbox_id}: {exc}") from exc
    return mgr.leases.finish(lease, State.WARM, values=values,
                             payload={"backend_ref": obj.ref, "pool": profile.name})


# -- planning (pure: the reaper calls it with what it read) ---------------------------------


@dataclass(frozen=True)
class PoolSpec:
    """One pool as the reaper judges it: the profile's name and backend, the size wanted now
    (`sbx pool set`'s, else the profile's), the key its members must have, its ttl.max.
    `error`: the profile cannot be loaded; its members are left as they are (a typo in a
    file never destroys a pool), and it is not filled."""

    name: str
    backend: str | None = None
    size: int = 0
    key: str = ""
    ttl_max: timedelta = timedelta(0)
    error: str | None = None


def plan_pools(pools: Mapping[str, PoolSpec], rows: Iterable[Mapping[str, Any]],
               now: datetime, *, install_id: str, dead: Collection[str] = (),
               skip_backends: Collection[str] = (),
               skip_rows: Collection[str] = ()) -> list[Action]:
    """FILL actions for what each pool lacks, RETIRE actions for the warm members no pool
    wants: of a pool that no longer exists (`pool-removed`), made from a profile that has
    changed since (`pool-changed`), beyond the pool's size (`pool-shrunk`, the youngest
    first). Only this installation's members are counted and judged; members past max_age
    are plan_reap's (their deadline). `pools`: every pool declared (PoolSpec, or one with
    `error`); `skip_backends` / `skip_rows`: backends and rows this cycle cannot check."""
    now_iso = to_iso(now)
    by_pool: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if (is_member(row) and row["install_id"] == install_id
                and row["state"] in (State.CREATING, State.WARM)
                and row["id"] not in skip_rows and row["backend"] not in skip_backends):
            by_pool.setdefault(row["pool"], []).append(row)
    actions: list[Action] = []
    for name in sorted(set(by_pool) | set(pools)):
        spec = pools.get(name)
        if spec is not None and spec.error is not None:
            continue
        kept: list[Mapping[str, Any]] = []
        for row in by_pool.get(name, []):
            if row["deadline"] <= now_iso:
                continue  # past max_age: plan_reap retires it, as any sandbox past its deadline
            busy = leased(row, now_iso, dead)
            if row["state"] == State.CREATING:
                if busy:  # being made; a dead maker's is reconcile's to fail
                    kept.append(row)
                continue
            reason = None
            if spec is None:
                reason = "pool-removed"
            elif not fits(row, spec.key, spec.ttl_max, now):
                reason = "pool-changed"
            if reason is None or busy:
                kept.append(row)
            else:
                actions.append(Action(RETIRE, row["backend"], row["id"], row["backend_ref"],
                                      reason, expect=State.WARM, pool=name))
        if spec is None or spec.backend in skip_backends:
            continue
        excess = len(kept) - spec.size
        warm = sorted((r for r in kept if r["state"] == State.WARM
                       and not leased(r, now_iso, dead)),
                      key=lambda r: (r["created_at"], r["id"]), reverse=True)
        for row in warm[:max(0, excess)]:  # the youngest go: the others are claimed first
            actions.append(Action(RETIRE, row["backend"], row["id"], row["backend_ref"],
                                  "pool-shrunk", expect=State.WARM, pool=name))
        for index in range(max(0, -excess)):
            actions.append(Action(FILL, spec.backend, None, f"pool:{name}:{index}",
                                  pool=name))
    return actions


# -- reading what pools are declared (the reaper's input) -----------------------------------

_MENTIONS_POOL = re.compile(rb"pool['\"]?\s*:")


def candidate_files(folders: Sequence[Path]) -> dict[str, Path]:
    """The profile files that may declare a pool (they mention `pool:`), by name, from these
    folders. Reading them costs no YAML or pydantic: a cycle with no pool declared anywhere
    stays as fast as before pools existed."""
    found: dict[str, Path] = {}
    for folder in folders:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for path in entries:
            if path.suffix not in (".yaml", ".yml"):
                continue
            try:
                if _MENTIONS_POOL.search(path.read_bytes()):
                    found[path.stem] = path
            except OSError:
                continue
    return found


def profile_folders() -> list[Path]:
    """Every folder a profile on the search path can come from (sandboxer.core.rules.profiles._search), as
    a superset read without importing the profile schema: the built-in profiles, the user
    config folder's, the working folder's (trusted or not), $SBX_PROFILE_PATH's."""
    import os
    from importlib.resources import files

    from sandboxer.core.rules.settings import user_config_dir

    builtin = Path(str(files("sandboxer.profiles")))
    folders = [builtin, user_config_dir() / "profiles", Path.cwd() / ".sbx" / "profiles"]
    extra = os.environ.get("SBX_PROFILE_PATH", "")
    return folders + [Path(p).expanduser() for p in extra.split(":") if p]


def declared_profiles(names: Collection[str]) -> dict[str, Profile | str]:
    """Of the profiles `names` (candidate_files), those on the search path that declare a
    pool, by name; for one that cannot be loaded, why (it may declare one)."""
    from sandboxer.core.rules.profiles import ProfileLoader

    loader = ProfileLoader()
    found: dict[str, Profile | str] = {}
    for name in sorted(names):
        try:
            profile = loader.load(name)
        except NotFound:
            continue
        except BadInput as exc:
            found[name] = one_line(exc)
            continue
        if profile.pool is not None:
            found[name] = profile
    return found


def read_specs(names: Collection[str], sizes: Mapping[str, int | None],
               member_pools: Collection[str]) -> tuple[dict[str, PoolSpec], dict[str, Profile]]:
    """The pools declared on the search path among the profiles `names` (candidate_files),
    with `sizes` from `sbx pool set` applied, and their profiles, for the reaper. A pool with
    members whose profile no file mentions is not among them: it is known removed."""
    from sandboxer.core.rules.profiles import dump

    specs: dict[str, PoolSpec] = {}
    profiles: dict[str, Profile] = {}
    for name, profile in declared_profiles(names).items():
        if isinstance(profile, str):  # broken: judged only if it may be a pool of ours
            if name in member_pools or name in sizes:
                specs[name] = PoolSpec(name, error=profile)
            continue
        size = sizes.get(name)
        assert profile.pool is not None
        specs[name] = PoolSpec(name, profile.backend,
                               profile.pool.size if size is None else size,
                               member_key(dump(profile)), profile.ttl.max)
        profiles[name] = profile
    return specs, profiles


def sizes_of(mgr: Manager) -> dict[str, int | None]:
    """read_sizes through the Manager (which migrates)."""
    with mgr.db.read() as conn:
        return read_sizes(conn.connection.driver_connection)


def read_sizes(dbapi_conn: Any) -> dict[str, int | None]:
    """The sizes `sbx pool set` gave pools (None: the profile's), by plain SQL."""
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("SELECT profile, size FROM pools")
        return {name: size for name, size in cursor.fetchall()}
    finally:
        cursor.close()


# -- acting on pools (the reaper's actions, `sbx pool set`, `drain`, `ls`) -----------------


async def retire(mgr: Manager, sandbox_id: str, adapter: Adapter, *,
                 reason: str) -> dict[str, Any] | None:
    """Destroy a warm member its pool no longer wants, if, inside the transaction of the
    intent, it is still a warm member nobody holds; None when it is not (a create claimed it
    meanwhile: then it is that create's sandbox, and stays)."""
    def still_warm(row: Mapping[str, Any]) -> str | None:
        if row["state"] != State.WARM or not is_member(row):
            return f"it is {row['state']}"
        if mgr.leases.held_by_another(row):
            return "another process holds it"
        return None

    try:
        return await mgr._destroy(sandbox_id, adapter, reason=reason, precondition=still_warm)
    except (NotDue, NotFound):
        return None


def _pool_row(conn: Connection, name: str) -> Mapping[str, Any] | None:
    import sqlalchemy as sa

    from sandboxer.core.store.models import Pool

    pools = Pool.__table__
    return conn.execute(sa.select(pools).where(pools.c.profile == name)).mappings().first()


def _record_size(mgr: Manager, name: str, size: int, event: str,
                 payload: Mapping[str, Any]) -> None:
    """Keep `size` for the pool `name` (overriding its profile's) and write `event`."""
    from sandboxer.core.store.db import serialise
    from sandboxer.core.store.models import Pool

    pools = Pool.__table__
    now = mgr.now_iso()
    with mgr.db.write() as conn:
        serialise(conn, LOCK_POOLS)
        known = _pool_row(conn, name)
        if known is None:
            conn.execute(pools.insert().values(profile=name, size=size, started_at=now,
                                               set_at=now, set_by=mgr.actor))
        else:
            conn.execute(pools.update().where(pools.c.profile == name)
                         .values(size=size, set_at=now, set_by=mgr.actor))
        was = known["size"] if known is not None else None
        mgr.event(conn, None, event, reason="manual",
                  payload={"profile": name, "size": size, "was": was, **payload})


async def set_size(mgr: Manager, profile: Profile, size: Any) -> dict[str, list[Any]]:
    """`sbx pool set PROFILE --size N`: the pool keeps N members, whatever its profile says,
    until set again, and has them when this returns (bring_to_size): a create right after
    is served warm. BadInput (nothing written) for a size out of range or a profile that
    declares no pool; Unavailable (nothing written) when its backend does not answer. A
    member that cannot be made is raised, as the reaper reports it, after the size is kept:
    the next reap tries again."""
    from sandboxer.core.rules.profiles import MAX_POOL_SIZE

    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_POOL_SIZE:
        raise BadInput(f"bad size {size!r}: a pool keeps 0 to {MAX_POOL_SIZE} members")
    if profile.pool is None:
        raise BadInput(f"profile {profile.name!r} declares no pool: add `pool: {{size: N}}` "
                       "to it (docs/pools.md)")
    await mgr.adapter(profile.backend).ensure_available()
    _record_size(mgr, profile.name, size, "pool.resized", {})
    done = await bring_to_size(mgr, profile)
    if done["failed"]:
        from sandboxer.core.rules.errors import as_error

        first = done["failed"][0]
        kind = type(as_error(first))  # its failure's code, but never "nothing was written"
        raise (OperationFailed if issubclass(kind, BadInput) else kind)(
            f"pool {profile.name}: size {size} is kept, but {len(done['failed'])} member(s) "
            f"could not be made ({one_line(first)}); the next sbx reap tries again")
    return done


async def bring_to_size(mgr: Manager, profile: Profile) -> dict[str, list[Any]]:
    """Make the pool of `profile` what a reap would make it, now: the members it lacks made
    (warm, their setup run), those beyond its size or made from an older profile retired,
    as plan_pools decides for the reaper. `{"warmed": [ids], "retired": [ids], "failed":
    [exceptions]}`. A fill that finds the pool full (a reaper filled it meanwhile) is no
    failure."""
    import asyncio

    from sandboxer.core.rules.profiles import dump
    from sandboxer.core.rules.states import dead_holders

    rows = _members(mgr, profile.name)
    now = mgr.clock.now()
    size = sizes_of(mgr).get(profile.name)
    assert profile.pool is not None
    spec = PoolSpec(profile.name, profile.backend, profile.pool.size if size is None else size,
                    member_key(dump(profile)), profile.ttl.max)
    actions = plan_pools({profile.name: spec}, rows, now, install_id=mgr.install_id,
                         dead=dead_holders(rows, to_iso(now), mgr.install_id))
    done: dict[str, list[Any]] = {"warmed": [], "retired": [], "failed": []}
    gate = asyncio.Semaphore(MAKE_AT_ONCE)

    async def one(action: Action) -> None:
        async with gate:
            try:
                if action.kind == RETIRE:
                    adapter = mgr.adapter(action.backend)
                    if await retire(mgr, action.sandbox_id, adapter,
                                    reason=action.reason) is not None:
                        done["retired"].append(action.sandbox_id)
                else:
                    done["warmed"].append((await mgr.create(profile, pool_member=True))["id"])
            except NotDue:
                pass  # full already: another reaper filled it meanwhile
            except Exception as exc:
                done["failed"].append(exc)

    await asyncio.gather(*(one(a) for a in actions))
    return done


def _members(mgr: Manager, name: str | None = None) -> list[dict[str, Any]]:
    """This installation's pool members nobody claimed that are not destroyed (of `name`)."""
    import sqlalchemy as sa

    from sandboxer.core.lifecycle.manager import SANDBOXES

    query = sa.select(SANDBOXES).where(
        SANDBOXES.c.pool.is_not(None), SANDBOXES.c.launch.is_(None),
        SANDBOXES.c.install_id == mgr.install_id, SANDBOXES.c.state != State.DESTROYED)
    if name is not None:
        query = query.where(SANDBOXES.c.pool == name)
    with mgr.db.read() as conn:
        return [dict(r) for r in conn.execute(
            query.order_by(SANDBOXES.c.created_at, SANDBOXES.c.id)).mappings()]


async def drain(mgr: Manager, name: str, profile: Profile | None) -> dict[str, Any]:
    """`sbx pool drain PROFILE`: the pool's size becomes 0 (no reaper fills it until `sbx
    pool set`), then every warm member of this installation is destroyed now. A member
    still being made is retired by the next reap. `profile`: the pool's profile, if it
    still loads (a pool whose profile is gone can be drained of what is left)."""
    from sandboxer.core.rules.errors import classify

    members = _members(mgr, name)
    if (profile is None or profile.pool is None) and not members:
        raise NotFound(f"no pool named {name!r} (sbx pool ls lists them)")
    warm = [m for m in members if m["state"] == State.WARM]
    if profile is not None and profile.pool is not None:
        _record_size(mgr, name, 0, "pool.drained", {"members": len(warm)})
    mgr.make_room()
    result: dict[str, Any] = {"profile": name, "destroyed": [], "failed": []}
    for member in warm:
        try:
            done = await retire(mgr, member["id"], await mgr.adapter_for(member),
                                reason="pool-drained")
        except Exception as exc:
            code, kind = classify(exc)
            result["failed"].append({"id": member["id"], "code": code, "kind": kind,
                                     "error": one_line(exc)})
            continue
        if done is not None:
            result["destroyed"].append(member["id"])
    return result


def statuses(mgr: Manager, profiles: Mapping[str, Profile | str] | None = None,
             only: str | None = None) -> list[dict[str, Any]]:
    """`sbx pool ls`: each pool of this installation (or the one named `only`). `profiles`:
    the profiles that declare a pool (or why one cannot be loaded), by name (default: those
    on the search path); a pool whose profile declares none is listed while it has members."""
    import sqlalchemy as sa

    from sandboxer.core.lifecycle.manager import SANDBOXES
    from sandboxer.core.rules.profiles import dump
    from sandboxer.core.store.models import Pool

    now = mgr.clock.now()
    with mgr.db.read() as conn:
        kept = {r["profile"]: dict(r) for r in conn.execute(
            sa.select(Pool.__table__)).mappings()}
        claims = conn.execute(
            sa.select(SANDBOXES.c.pool, SANDBOXES.c.started_at).where(  # claimed then
                SANDBOXES.c.pool.is_not(None), SANDBOXES.c.launch == "warm",
                SANDBOXES.c.install_id == mgr.install_id)).all()
    if profiles is None:
        profiles = declared_profiles(candidate_files(profile_folders()))
    members = _members(mgr, only)
    names = sorted(set(profiles) | {m["pool"] for m in members})
    if only is not None:
        names = [n for n in names if n == only]
    found = []
    for name in names:
        profile = profiles.get(name)
        record = kept.get(name, {})
        mine = [m for m in members if m["pool"] == name]
        policy = profile.pool if profile is not None and not isinstance(profile, str) else None
        key = member_key(dump(profile)) if policy is not None else None
        ready = [m for m in mine if key is not None
                 and fits(m, key, profile.ttl.max, now)]
        since = record.get("started_at")
        size = record.get("size")
        found.append({
            "profile": name,
            "backend": profile.backend if policy is not None else (
                mine[0]["backend"] if mine else None),
            "declared": policy is not None,
            "size": (size if size is not None else policy.size) if policy is not None else 0,
            "size_set": size is not None,
            "max_age": _duration_text(policy.max_age) if policy is not None else None,
            "ready": len(ready),
            "starting": sum(1 for m in mine if m["state"] == State.CREATING),
            "claimed": sum(1 for pool, claimed in claims
                           if pool == name and since is not None and claimed >= since),
            "since": since,
            "oldest": ready[0]["created_at"] if ready else None,
            "oldest_age_s": (int((now - from_iso(ready[0]["created_at"])).total_seconds())
                             if ready else None),
            "members": [{"id": m["id"], "state": m["state"], "created_at": m["created_at"],
                         "ready": m in ready} for m in mine],
            "error": profile if isinstance(profile, str) else None,
        })
    return found


def _duration_text(value: timedelta) -> str:
    from sandboxer.core.rules.durations import format_duration

    return format_duration(value)


class WarmPools:
    """The pools as the Manager's warm hook (sandboxer.core.lifecycle.manager.WarmSource):
    `Manager(warm=WarmPools())` serves pooled profiles from warm members and can make them.
    The lifecycle never imports this package; whoever makes a Manager plugs it in."""

    member_deadlines = staticmethod(member_deadlines)
    member_row = staticmethod(member_row)
    room = staticmethod(room)
    claim = staticmethod(claim)
    finish_member = staticmethod(finish_member)
