"""Volumes: named storage that outlives a sandbox (docs/volumes.md), written once for every
backend that declares Capability.VOLUMES.

A volume belongs to one owner (its tenant) and is known by a name unique among that owner's.
The backend makes it first; its row and `volume.created` event are then written in one
transaction (a row whose write fails has its backend volume removed again), so no row names
a volume the backend never made. A sandbox mounts volumes its profile names (`volumes:`):
Manager.create looks them up among the sandbox owner's own (another owner's is not found),
and in the transaction that records the sandbox, checks the sharing rule again and writes a
`mounts` row and a `volume.mounted` event for each. A mount holds its volume while its
sandbox is live (core/rules/states.py LIVE): `rm` and the reaper refuse or skip it then.

The sharing rule: any number of read-only mounts; one read-write mount at a time unless the
volume was made with `shared` (then any number). A refused mount writes nothing.

Files reach a volume without a sandbox through the backend's short-lived helper
(`open_volume`: on Docker a container never started, network none, the volume at /volume;
on ssh the volume's folder on its host, reached over ssh),
removed by id once the transfer ends; each transfer is a `volume.file` event (path, bytes,
SHA-256, direction; never the bytes).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from ulid import ULID

from sandboxer.adapters.base import (
    LABEL_INSTALL,
    LABEL_VOLUME,
    Capability,
    VolumeMountSpec,
)
from sandboxer.core.rules.catalog import EventType, Reason
from sandboxer.core.rules.clock import to_iso
from sandboxer.core.rules.durations import format_duration
from sandboxer.core.rules.errors import BadInput, Conflict, NotFound
from sandboxer.core.rules.ids import VOLUME_PREFIX, validate_name, validate_owner
from sandboxer.core.rules.labels import validate_labels
from sandboxer.core.rules.states import LIVE
from sandboxer.core.store import tenancy
from sandboxer.core.store.models import Mount, Sandbox, Volume

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import Profile

VOLUMES = Volume.__table__
MOUNTS = Mount.__table__
SANDBOXES = Sandbox.__table__
DEFAULT_BACKEND = "docker"  # the default profile's
ROOT = "/volume"  # where a helper (open_volume) has the volume
_LIVE = sorted(str(s) for s in LIVE)


def new_volume_id() -> str:
    return VOLUME_PREFIX + str(ULID()).lower()


# -- views --------------------------------------------------------------------------------


def _mounts_of(conn: Connection, volume_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Each volume's mounts by live sandboxes."""
    found: dict[str, list[dict[str, Any]]] = {v: [] for v in volume_ids}
    if not volume_ids:
        return found
    rows = conn.execute(
        sa.select(MOUNTS.c.volume_id, MOUNTS.c.sandbox_id, MOUNTS.c.path, MOUNTS.c.read_only)
        .join(SANDBOXES, SANDBOXES.c.id == MOUNTS.c.sandbox_id)
        .where(MOUNTS.c.volume_id.in_(list(volume_ids)), SANDBOXES.c.state.in_(_LIVE))
        .order_by(MOUNTS.c.sandbox_id)).mappings()
    for row in rows:
        found[row["volume_id"]].append({"sandbox": row["sandbox_id"], "path": row["path"],
                                        "read_only": bool(row["read_only"])})
    return found


def view(row: Mapping[str, Any], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """A volume's record: what `sbx volume show --json` prints (docs/volumes.md)."""
    return {
        "id": row["id"],
        "name": row["name"],
        "owner": row["owner"],
        "backend": row["backend"],
        "labels": json.loads(row["labels_json"] or "{}"),
        "shared": bool(row["shared"]),
        "size_bytes": row["size_bytes"],
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
        "mounted_by": mounts,
    }


# -- lookups ------------------------------------------------------------------------------


def resolve(conn: Connection, ref: str) -> dict[str, Any]:
    """A volume by id or name, among the tenant's own (another tenant's is not found).
    Without a tenant (the local user, an admin key), a name held by several owners must
    be given as the id."""
    if not isinstance(ref, str) or not ref or len(ref) > 128:
        raise BadInput(f"bad volume reference {str(ref)[:80]!r}: give its name or id")
    if ref.startswith(VOLUME_PREFIX):
        where = VOLUMES.c.id == ref
    else:
        validate_name(ref, "volume name")
        where = VOLUMES.c.name == ref
    rows = conn.execute(tenancy.narrow(sa.select(VOLUMES).where(where), VOLUMES)).mappings().all()
    if not rows:
        raise NotFound(f"no volume {ref!r}")
    if len(rows) > 1:
        raise BadInput(f"volume name {ref!r} is held by {len(rows)} owners: give its id")
    return dict(rows[0])


def _owned(conn: Connection, owner: str, name: str) -> dict[str, Any] | None:
    row = conn.execute(sa.select(VOLUMES).where(VOLUMES.c.owner == owner,
                                                VOLUMES.c.name == name)).mappings().first()
    return dict(row) if row is not None else None


# -- the operations -----------------------------------------------------------------------


async def create(mgr: Manager, name: str, *, backend: str | None = None,
                 labels: Mapping[str, str] | None = None, ttl: timedelta | None = None,
                 shared: bool = False, owner: str | None = None) -> dict[str, Any]:
    """Make an empty volume. Refused (nothing made) when the owner already has one of that
    name, or the backend keeps no volumes."""
    validate_name(name, "volume name")
    labels = validate_labels(labels or {})
    if ttl is not None and ttl <= timedelta(0):
        raise BadInput(f"volume ttl {format_duration(ttl)}: give a positive duration")
    if not isinstance(shared, bool):
        raise BadInput("shared: give true or false")
    owner = validate_owner(tenancy.owner_for(owner) or mgr.actor)
    backend = backend or DEFAULT_BACKEND
    from sandboxer.adapters import registry

    if not isinstance(backend, str) or not registry.is_registered(backend):
        raise BadInput(f"unknown backend {str(backend)[:64]!r} (known: "
                       f"{', '.join(registry.names())})")
    adapter = mgr.adapter(backend)
    if not adapter.supports(Capability.VOLUMES):
        raise BadInput(f"the {backend} backend keeps no volumes (docs/volumes.md says which "
                       "do): use docker, compose, ssh, e2b or modal")
    with mgr.db.read() as conn:
        if _owned(conn, owner, name) is not None:
            raise Conflict(f"volume {name!r} already exists")
    await adapter.ensure_available()
    instance = await adapter.instance_id()
    volume_id = new_volume_id()
    now = mgr.clock.now()
    ref = await adapter.create_volume(volume_id, {**labels, LABEL_VOLUME: volume_id,
                                                  LABEL_INSTALL: mgr.install_id})
    row = {"id": volume_id, "name": name, "owner": owner, "backend": backend,
           "backend_ref": ref, "backend_instance": instance, "install_id": mgr.install_id,
           "labels_json": json.dumps(labels, sort_keys=True), "shared": shared,
           "size_bytes": 0, "created_at": to_iso(now),
           "expires_at": to_iso(now + ttl) if ttl is not None else None}
    try:
        with mgr.db.write() as conn:
            if _owned(conn, owner, name) is not None:  # made meanwhile by another process
                raise Conflict(f"volume {name!r} already exists")
            conn.execute(sa.insert(VOLUMES), row)
            mgr.event(conn, None, EventType.VOLUME_CREATED, payload={
                "volume": volume_id, "name": name, "owner": owner, "backend": backend,
                "labels": labels, "shared": shared, "expires_at": row["expires_at"]})
    except BaseException:
        await adapter.remove_volume(ref)
        raise
    return view(row, [])


def list_volumes(mgr: Manager) -> list[dict[str, Any]]:
    """The tenant's volumes (every owner's without a tenant), oldest first."""
    with mgr.db.read() as conn:
        rows = conn.execute(tenancy.narrow(
            sa.select(VOLUMES).order_by(VOLUMES.c.created_at, VOLUMES.c.id), VOLUMES)
        ).mappings().all()
        mounts = _mounts_of(conn, [r["id"] for r in rows])
    return [view(r, mounts[r["id"]]) for r in rows]


async def show(mgr: Manager, ref: str) -> dict[str, Any]:
    """One volume, its size asked of the backend now (and kept, for ls)."""
    with mgr.db.read() as conn:
        row = resolve(conn, ref)
    adapter = mgr.adapter(row["backend"])
    size = await adapter.volume_size(row["backend_ref"])
    with mgr.db.write() as conn:
        if size is not None and size != row["size_bytes"]:
            conn.execute(sa.update(VOLUMES).where(VOLUMES.c.id == row["id"])
                         .values(size_bytes=size))
            row["size_bytes"] = size
        mounts = _mounts_of(conn, [row["id"]])
    return view(row, mounts[row["id"]])


async def remove(mgr: Manager, ref: str) -> dict[str, Any]:
    """Remove a volume and what it holds: refused (exit 4, nothing removed) while a live
    sandbox mounts it."""
    with mgr.db.read() as conn:
        row = resolve(conn, ref)
    return await _remove(mgr, row, reason=Reason.MANUAL)


async def _remove(mgr: Manager, row: Mapping[str, Any], *, reason: str,
                  due: str | None = None) -> dict[str, Any]:
    """The row goes first, in a transaction that finds no live mount (and, for the
    reaper, that the volume is still due), then the backend volume. A backend removal that
    fails leaves a volume without a row: reported, and tried again by `sbx volume rm` of
    its id never (the row is gone), so the failure is raised for the caller to see."""
    adapter = mgr.adapter(row["backend"])
    await adapter.ensure_available()
    with mgr.db.write() as conn:
        current = conn.execute(sa.select(VOLUMES).where(VOLUMES.c.id == row["id"])
                               ).mappings().first()
        if current is None:
            raise NotFound(f"no volume {row['name']!r}")
        if due is not None and (current["expires_at"] is None or current["expires_at"] > due):
            raise Conflict(f"volume {row['name']!r} is no longer due")
        held = _mounts_of(conn, [row["id"]])[row["id"]]
        if held:
            raise Conflict(f"volume {row['name']!r} is mounted by {len(held)} live "
                           f"sandbox(es) ({held[0]['sandbox']}): destroy them first")
        conn.execute(sa.delete(MOUNTS).where(MOUNTS.c.volume_id == row["id"]))
        conn.execute(sa.delete(VOLUMES).where(VOLUMES.c.id == row["id"]))
        mgr.event(conn, None, EventType.VOLUME_REMOVED, reason=reason, payload={
            "volume": row["id"], "name": row["name"], "owner": row["owner"]})
    await adapter.remove_volume(row["backend_ref"])
    return view(current, [])


async def reap(mgr: Manager) -> dict[str, list[Any]]:
    """Remove every volume past its TTL that no live sandbox mounts (the reaper's step):
    {"removed": ids, "skipped": ids still mounted, "failed": [[id, message]]}."""
    now = mgr.now_iso()
    with mgr.db.read() as conn:
        rows = conn.execute(sa.select(VOLUMES).where(VOLUMES.c.expires_at.is_not(None),
                                                     VOLUMES.c.expires_at <= now,
                                                     VOLUMES.c.install_id == mgr.install_id)
                            ).mappings().all()
    done: dict[str, list[Any]] = {"removed": [], "skipped": [], "failed": []}
    for row in rows:
        try:
            await _remove(mgr, dict(row), reason=Reason.TTL, due=now)
        except Conflict:
            done["skipped"].append(row["id"])
        except Exception as exc:  # one volume's trouble stops no other
            done["failed"].append([row["id"], str(exc) or type(exc).__name__])
        else:
            done["removed"].append(row["id"])
    return done


def count_due(mgr: Manager, now: str) -> int:
    """How many of this installation's volumes are past their TTL."""
    with mgr.db.read() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(VOLUMES).where(
            VOLUMES.c.expires_at.is_not(None), VOLUMES.c.expires_at <= now,
            VOLUMES.c.install_id == mgr.install_id)).scalar() or 0


# -- mounts (Manager.create) --------------------------------------------------------------


def with_mounts(profile: Profile, asked: Sequence[Mapping[str, Any]]) -> Profile:
    """`profile` with the mounts asked at create added to its own: each checked as the
    profile's `volumes:` entries are (a bad one is BadInput naming it)."""
    from pydantic import ValidationError

    from sandboxer.core.rules.errors import plain_problems
    from sandboxer.core.rules.profiles import VolumeMount

    if not isinstance(asked, Sequence) or isinstance(asked, str | bytes):
        raise BadInput("volumes: give a list of {name, path, read_only}")
    added = []
    for i, doc in enumerate(asked):
        try:
            added.append(VolumeMount.model_validate(doc))
        except ValidationError as exc:
            raise BadInput(f"volumes[{i}]: {'; '.join(plain_problems(exc.errors()))}") from None
    mounts = [*profile.volumes, *added]
    for what in ("name", "path"):
        seen = [getattr(m, what) for m in mounts]
        twice = sorted({x for x in seen if seen.count(x) > 1})
        if twice:
            raise BadInput(f"volume {what} {twice[0]!r} is mounted twice: mount each volume "
                           "once, at a path of its own")
    if profile.pool is not None:
        raise BadInput(f"profile {profile.name!r} keeps a pool: a sandbox with volumes "
                       "cannot come from it")
    return profile.model_copy(update={"volumes": mounts})


def mounts_for(mgr: Manager, profile: Profile, owner: str, adapter: Any, *,
               restoring: bool = False) -> list[tuple[dict[str, Any], VolumeMountSpec]]:
    """The profile's `volumes:` as the owner's volume rows and what the backend mounts.
    Another owner's volume is not found, exactly as a missing one. A restore mounts the
    checkpoint's volumes again by name; one that is gone is NotFound saying so."""
    if not profile.volumes:
        return []
    if not adapter.supports(Capability.VOLUMES):  # exit 2: the profile asks what cannot be
        raise BadInput(f"the {profile.backend} backend cannot mount volumes (the profile's "
                       "volumes:); docs/volumes.md says which backends can")
    found = []
    with mgr.db.read() as conn:
        for asked in profile.volumes:
            row = _owned(conn, owner, asked.name)
            if row is None:
                if restoring:
                    raise NotFound(f"no volume {asked.name!r}: the checkpoint's sandbox mounted "
                                   f"it at {asked.path}, and a checkpoint holds no volume "
                                   "data; make the volume again, or restore under a profile "
                                   "without it (--profile)")
                raise NotFound(f"no volume {asked.name!r}")
            if row["backend"] != profile.backend:
                raise BadInput(f"volume {asked.name!r} is on the {row['backend']} backend, "
                               f"the profile's sandbox on {profile.backend}")
            found.append((row, VolumeMountSpec(row["backend_ref"], asked.path,
                                               asked.read_only)))
    check_sharing(mgr, found)
    return found


def check_sharing(mgr: Manager, mounts: Sequence[tuple[Mapping[str, Any], VolumeMountSpec]],
                  conn: Connection | None = None) -> None:
    """One read-write mount at a time unless the volume is shared: a Conflict (exit 4)
    naming the volume and the sandbox that holds it."""
    if not mounts:
        return
    if conn is None:
        with mgr.db.read() as conn:
            return check_sharing(mgr, mounts, conn)
    held = _mounts_of(conn, [row["id"] for row, _ in mounts])
    for row, spec in mounts:
        if spec.read_only or row["shared"]:
            continue
        writers = [m for m in held[row["id"]] if not m["read_only"]]
        if writers:
            raise Conflict(f"volume {row['name']!r} is mounted read-write by "
                           f"{writers[0]['sandbox']}: mount it read_only, or make the volume "
                           "with --shared")


def record_mounts(mgr: Manager, conn: Connection, sandbox_id: str,
                  mounts: Sequence[tuple[Mapping[str, Any], VolumeMountSpec]]) -> None:
    """In the transaction that records the sandbox: the rule again (a mount made meanwhile
    counts), then a row and a `volume.mounted` event per mount."""
    if not mounts:
        return
    for row, _ in mounts:  # still there (not removed meanwhile)
        if conn.execute(sa.select(VOLUMES.c.id).where(VOLUMES.c.id == row["id"])).first() is None:
            raise NotFound(f"no volume {row['name']!r}")
    check_sharing(mgr, mounts, conn)
    for row, spec in mounts:
        conn.execute(sa.insert(MOUNTS), {"sandbox_id": sandbox_id, "volume_id": row["id"],
                                         "path": spec.path, "read_only": spec.read_only})
        mgr.event(conn, sandbox_id, EventType.VOLUME_MOUNTED, payload={
            "volume": row["id"], "name": row["name"], "path": spec.path,
            "read_only": spec.read_only})


def mounted(mgr: Manager, sandbox_id: str) -> list[dict[str, Any]]:
    """A sandbox's mounts, by volume name (what a checkpoint's manifest records)."""
    with mgr.db.read() as conn:
        rows = conn.execute(
            sa.select(VOLUMES.c.name, VOLUMES.c.id, MOUNTS.c.path, MOUNTS.c.read_only)
            .join(VOLUMES, VOLUMES.c.id == MOUNTS.c.volume_id)
            .where(MOUNTS.c.sandbox_id == sandbox_id).order_by(MOUNTS.c.path)).mappings()
        return [{"name": r["name"], "volume": r["id"], "path": r["path"],
                 "read_only": bool(r["read_only"])} for r in rows]


# -- files without a sandbox --------------------------------------------------------------


def _in_volume(path: str) -> str:
    """A path in the volume (absolute, / its root) as the helper's path under /volume."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path \
            or ".." in path.split("/"):
        raise BadInput(f"bad path {str(path)[:80]!r}: give an absolute path in the volume "
                       "(/ is its root), without ..")
    return posixpath.normpath(ROOT + "/" + path.lstrip("/"))


async def _helper(mgr: Manager, ref: str) -> tuple[dict[str, Any], Any, str]:
    with mgr.db.read() as conn:
        row = resolve(conn, ref)
    adapter = mgr.adapter(row["backend"])
    await adapter.ensure_available()
    helper = await adapter.open_volume(row["backend_ref"], {LABEL_VOLUME: row["id"]})
    return row, adapter, helper


def _record(mgr: Manager, row: Mapping[str, Any], **payload: Any) -> None:
    with mgr.db.write() as conn:
        mgr.event(conn, None, EventType.VOLUME_FILE, payload={
            "volume": row["id"], "name": row["name"], **payload})


async def put_tree(mgr: Manager, ref: str, path: str,
                   tar: AsyncIterator[bytes]) -> dict[str, Any]:
    """Unpack a tar stream into the folder `path` of the volume (made if missing)."""
    from sandboxer.core.lifecycle.files import _Counted

    inside = _in_volume(path)
    row, adapter, helper = await _helper(mgr, ref)
    counted = _Counted()
    try:
        await adapter.put_archive(helper, inside, counted.through(tar, "tar"))
    finally:
        await adapter.close_volume(helper)
    done = {"path": posixpath.normpath(path), "bytes": counted.bytes,
            "sha256": counted.sha256(), "entries": counted.entries.count}
    _record(mgr, row, op="upload", direction="in", **done)
    return done


async def get_tree(mgr: Manager, ref: str, path: str) -> AsyncIterator[bytes]:
    """The file or folder `path` of the volume as a tar stream (one top entry, its name)."""
    from sandboxer.core.lifecycle.files import _Counted

    inside = _in_volume(path)
    row, adapter, helper = await _helper(mgr, ref)
    counted = _Counted()
    try:
        try:
            async for chunk in counted.through(adapter.get_archive(helper, inside), "archive"):
                yield chunk
        except Exception as exc:
            from sandboxer.adapters.base import NoSuchPath

            if isinstance(exc, NoSuchPath):
                raise NotFound(f"{posixpath.normpath(path)} does not exist in volume "
                               f"{row['name']!r}") from None
            raise
    finally:
        await adapter.close_volume(helper)
    _record(mgr, row, op="download", direction="out", path=posixpath.normpath(path),
            bytes=counted.bytes, sha256=counted.sha256())
