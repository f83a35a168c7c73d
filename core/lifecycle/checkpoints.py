"""Checkpoints: snapshot, restore (and so fork), lineage, retention, export and import.

A snapshot follows the operation pattern on a checkpoint row: the row is written `pending`
(with its event) while the sandbox's lease is held, the backend makes the artifact
(labelled `sbx.checkpoint`), and a second transaction records it `ready`. Reconcile
completes or removes a pending row whose maker died, removes an artifact of this
installation that no row claims, marks `lost` a ready row whose artifact the backend no
longer has, and removes an artifact no installation holds any more: no row lacks an
artifact without saying so, and no artifact lacks a row.

Installations may share an artifact (an archive imported on the engine it came from): each
holds it by a mark of its own, and removing a checkpoint lets go of this installation's
mark only; the backend removes the artifact once nobody holds it (adapters/docker.py).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import tarfile
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import sqlalchemy as sa
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    StringConstraints,
    ValidationError,
)
from ulid import ULID

from sandboxer.adapters.archives import BoundedTar, TooLarge, format_size
from sandboxer.adapters.base import (
    LABEL_CHECKPOINT,
    LABEL_ID,
    LABEL_INSTALL,
    AdapterError,
    Capability,
)
from sandboxer.core.observe import telemetry
from sandboxer.core.rules import settings
from sandboxer.core.rules.catalog import EventType, Reason
from sandboxer.core.rules.clock import from_iso, to_iso
from sandboxer.core.rules.errors import BadInput, Conflict
from sandboxer.core.rules.failpoints import failpoint
from sandboxer.core.rules.ids import CHECKPOINT_PREFIX, validate_name
from sandboxer.core.rules.states import ACTIVE, leased
from sandboxer.core.store import tenancy
from sandboxer.core.store.models import Checkpoint

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import Profile, ProfileLoader

CHECKPOINTS = Checkpoint.__table__
PREFIX = CHECKPOINT_PREFIX
ARCHIVE_FORMAT = "sandboxer-checkpoint/1"
ARCHIVE_MEMBERS = ("manifest.json", "artifact.tar")  # in this order, nothing else
NAME_MAX = 128
# A checkpoint's states: the backend is making it; it can be restored; its artifact is gone
# from the backend (it is never fetched from anywhere else), so only `checkpoint rm` is left.
PENDING, READY, LOST = "pending", "ready", "lost"


def _time(text: str) -> str:
    from_iso(text)  # what to_iso writes, only
    return text


def _json_object(text: str) -> str:
    if not isinstance(json.loads(text), dict):
        raise ValueError("must be a JSON object")
    return text


def _known_backend(name: str) -> str:
    from sandboxer.adapters import registry

    if not registry.is_registered(name):
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(registry.names())})")
    return name


# ids as another installation wrote them: visible ASCII (no NUL, no escape), the columns' width
Short = Annotated[str, StringConstraints(pattern=r"^[!-~]{1,40}$")]
Time = Annotated[str, AfterValidator(_time)]


class ArchivedCheckpoint(BaseModel):
    """The checkpoint as an archive describes it. All of it is the archive's claim: the
    import keeps the profile as a record and the sandbox, parent and installation as
    origin_*; none of it becomes a local link, a profile to run or a time to sort by."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # later versions may say more

    id: Annotated[str, StringConstraints(pattern=r"^ckpt-[0-9a-z]{26}$")]
    kind: Literal["filesystem"]
    backend: Annotated[str, AfterValidator(_known_backend)]
    profile: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
    profile_json: Annotated[str, AfterValidator(_json_object)]
    created_at: Time
    sandbox_id: Short | None = None
    parent_id: Short | None = None
    install_id: Annotated[str, StringConstraints(pattern=r"^[!-~]{1,64}$")] | None = None
    name: Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX)] | None = None
    size_bytes: Annotated[NonNegativeInt, Field(le=2**63 - 1)] | None = None


class ArchiveManifest(BaseModel):
    """`manifest.json` of a checkpoint archive (`sbx checkpoint export`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    format: Literal["sandboxer-checkpoint/1"]
    checkpoint: ArchivedCheckpoint
    exported_at: Time | None = None  # archives written before it was recorded have none


def is_imported(ckpt: Mapping[str, Any]) -> bool:
    """Brought in by `sbx checkpoint import` (its profile is the other host's record)."""
    return ckpt.get("exported_at") is not None


def restore_profile(ckpt: Mapping[str, Any], profile_name: str | None = None,
                    loader: ProfileLoader | None = None) -> Profile:
    """The profile a restore of `ckpt` runs under: the one rule for every front end.

    `profile_name` names a profile of this host. Without it, a checkpoint made here runs
    under the resolved profile it was taken under (this host's own record). An imported one
    needs `profile_name`, or this host's profile of the name it records when that profile
    says `checkpoints: {accept_imports: true}`: the archive was written by someone else, and
    neither its embedded profile nor its choice of name supplies secrets, network, limits,
    TTL, command or setup. Otherwise: BadInput naming --profile."""
    from sandboxer.core.rules.profiles import Profile, ProfileLoader, check_profile_name

    loader = loader or ProfileLoader()
    if profile_name is None and not is_imported(ckpt):
        return Profile.model_validate(json.loads(ckpt["profile_json"]))
    if profile_name is not None:
        check_profile_name(profile_name, "--profile")
    name = profile_name or ckpt["profile"]
    if name not in loader.names():
        if profile_name is not None:
            raise BadInput(f"--profile: no profile named {name!r} "
                           f"(known: {', '.join(loader.names()) or 'none'})")
        raise BadInput(f"checkpoint {ckpt['id']} was imported and this host has no profile "
                       f"named {name!r}: choose one of yours with --profile NAME")
    profile = loader.load(name)
    if profile_name is None and not profile.checkpoints.accept_imports:
        # the archive's author chose the name: it must not pick a profile whose secrets,
        # network or limits were meant for something else
        raise BadInput(f"checkpoint {ckpt['id']} was imported: choose the profile it runs "
                       f"under with --profile NAME (or mark profile {name!r} with "
                       "checkpoints: {accept_imports: true})")
    if profile.backend != ckpt["backend"]:
        raise BadInput(f"--profile: profile {name!r} runs on {profile.backend}; checkpoint "
                       f"{ckpt['id']} is a {ckpt['backend']} checkpoint")
    return profile


def checkpoint_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint as the CLI and the API show it (without its stored profile, but with the
    volumes its sandbox mounted: by name, never their data; docs/volumes.md)."""
    return {**{k: v for k, v in row.items() if k != "profile_json"},
            "volumes": mounted_volumes(row)}


def mounted_volumes(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The volumes a checkpoint's profile mounts ({name, path, read_only}): not in the
    checkpoint; a restore mounts them again by name."""
    try:
        volumes = json.loads(row.get("profile_json") or "{}").get("volumes") or []
    except (ValueError, AttributeError):
        return []
    return [{"name": v.get("name"), "path": v.get("path"), "read_only": bool(v.get("read_only"))}
            for v in volumes if isinstance(v, dict)]


def new_checkpoint_id() -> str:
    return PREFIX + str(ULID()).lower()


class Checkpoints:
    def __init__(self, mgr: Manager) -> None:
        self.mgr = mgr
        self.db = mgr.db

    # -- reading ----------------------------------------------------------------------------

    def resolve(self, ref: str) -> dict[str, Any]:
        """A checkpoint by id, name or unique id prefix (with or without `ckpt-`; sandboxer.core.store.refs)."""
        from sandboxer.core.store.refs import resolve

        with self.db.read() as conn:
            return resolve(conn, CHECKPOINTS, ref, id_prefix=PREFIX, what="checkpoint")

    def list(self, sandbox_ref: str | None = None) -> list[dict[str, Any]]:
        query = tenancy.narrow(sa.select(CHECKPOINTS), CHECKPOINTS).order_by(
            CHECKPOINTS.c.created_at, CHECKPOINTS.c.id)
        if sandbox_ref:
            query = query.where(CHECKPOINTS.c.sandbox_id == self.mgr.resolve(sandbox_ref)["id"])
        with self.db.read() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    @staticmethod
    def tree(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Lineage as nested nodes: a checkpoint's children were taken from sandboxes
        restored from it. Parents not in `rows` make their children roots."""
        nodes = {r["id"]: {**r, "children": []} for r in rows}
        roots = []
        for node in nodes.values():
            parent = nodes.get(node["parent_id"]) if node["parent_id"] else None
            (parent["children"] if parent else roots).append(node)
        return roots

    # -- snapshot and restore ---------------------------------------------------------------

    @telemetry.traced("sbx.snapshot")
    async def snapshot(self, ref: str, name: str | None = None) -> dict[str, Any]:
        mgr = self.mgr
        if name is not None:
            validate_name(name, "snapshot name")
        sandbox = mgr.resolve(ref)
        adapter = mgr.adapter(sandbox["backend"])
        if not adapter.supports(Capability.SNAPSHOT):
            raise Conflict(f"the {sandbox['backend']} backend cannot snapshot")
        if sandbox["state"] not in ACTIVE:
            raise Conflict(f"sandbox {sandbox['id']} is {sandbox['state']}: cannot snapshot")
        await mgr.adapter_for(sandbox)
        ckpt_id = new_checkpoint_id()
        profile = json.loads(sandbox["profile_json"] or "{}")
        keep_for = (profile.get("checkpoints") or {}).get("ttl")
        now = mgr.clock.now()
        row = {
            "id": ckpt_id, "sandbox_id": sandbox["id"], "parent_id": sandbox["restored_from"],
            "name": name, "kind": "filesystem", "state": PENDING,
            "backend": sandbox["backend"], "backend_ref": None, "install_id": mgr.install_id,
            "profile": sandbox["profile"], "profile_json": sandbox["profile_json"],
            "created_at": to_iso(now), "owner": sandbox["owner"],
            "expires_at": to_iso(now + _duration(keep_for)) if keep_for else None,
        }
        # The lease and the intent in one transaction, the result and the release in another:
        # nobody destroys the sandbox while its filesystem is being saved.
        with self.db.write() as conn:
            lease = mgr.leases.take(sandbox["id"], ACTIVE, "snapshot", conn)
            conn.execute(CHECKPOINTS.insert().values(**row))
            mgr.event(conn, sandbox["id"], "checkpoint.creating",
                       payload={"checkpoint": ckpt_id, "name": name,
                                "parent": row["parent_id"]})
        given_back = False
        try:
            failpoint("snapshot.after-intent")
            labels = {LABEL_CHECKPOINT: ckpt_id, LABEL_INSTALL: mgr.install_id,
                      LABEL_ID: sandbox["id"]}
            try:
                async with mgr.leases.holding(lease):
                    artifact = await adapter.snapshot(sandbox["backend_ref"], labels)
            except BaseException as exc:
                with self.db.write() as conn:
                    conn.execute(CHECKPOINTS.delete().where(CHECKPOINTS.c.id == ckpt_id))
                    mgr.event(conn, sandbox["id"], "checkpoint.failed",
                               payload={"checkpoint": ckpt_id, "error": str(exc)})
                    mgr.leases.give_back(lease, conn)
                given_back = True
                raise
            failpoint("snapshot.after-backend")
            with self.db.write() as conn:
                conn.execute(CHECKPOINTS.update().where(CHECKPOINTS.c.id == ckpt_id).values(
                    state=READY, backend_ref=artifact.ref, size_bytes=artifact.size_bytes))
                mgr.event(conn, sandbox["id"], "checkpoint.created", payload={
                    "checkpoint": ckpt_id, "name": name, "kind": "filesystem",
                    "parent": row["parent_id"], "size_bytes": artifact.size_bytes})
                mgr.leases.give_back(lease, conn)
            given_back = True
        finally:
            if not given_back:  # a database error above: the lease must not outlive us
                with contextlib.suppress(Exception):
                    mgr.leases.give_back(lease)
        keep = (profile.get("checkpoints") or {}).get("keep")
        if keep:
            await self._keep_newest(sandbox["id"], int(keep))
        return self.resolve(ckpt_id)

    @telemetry.traced("sbx.restore")
    async def restore(self, ref: str, *, ttl: timedelta | None = None, name: str | None = None,
                      labels: Mapping[str, str] | None = None, owner: str | None = None,
                      task: str | None = None, profile_name: str | None = None
                      ) -> dict[str, Any]:
        """A new sandbox from a checkpoint, under the profile `restore_profile` chooses.
        Any number may be restored from one checkpoint (a fork). The artifact is looked for
        first: one the backend no longer has makes the checkpoint `lost` and the restore a
        Conflict, before anything is written or made."""
        ckpt = self.resolve(ref)
        if ckpt["state"] != READY:
            raise Conflict(f"checkpoint {ckpt['id']} is {ckpt['state']}: cannot restore")
        profile = restore_profile(ckpt, profile_name)
        adapter = self.mgr.adapter(ckpt["backend"])
        if ckpt["backend_ref"] and await adapter.missing_artifacts([ckpt["backend_ref"]]):
            if ckpt["install_id"] != self.mgr.install_id:  # a fleet's other host holds it
                raise Conflict(f"checkpoint {ckpt['id']} is held by another installation of "
                               f"this fleet and its artifact is not on this host's "
                               f"{ckpt['backend']} backend: restore it on the host that "
                               f"made it, or export it there and import it here")
            self._lose(ckpt)
            raise Conflict(f"checkpoint {ckpt['id']} is lost: its artifact "
                           f"({ckpt['backend_ref']}) is no longer on the {ckpt['backend']} "
                           f"backend, and is never fetched from elsewhere; remove it with "
                           f"`sbx checkpoint rm {ckpt['id']}`")
        return await self.mgr.create(profile, ttl=ttl, name=name, labels=labels, owner=owner,
                                     task=task, restore_from=ckpt)

    def _lose(self, ckpt: Mapping[str, Any]) -> bool:
        """Record a ready checkpoint `lost` (its artifact is gone), once."""
        with self.db.write() as conn:
            changed = conn.execute(CHECKPOINTS.update().where(
                CHECKPOINTS.c.id == ckpt["id"], CHECKPOINTS.c.state == READY,
                CHECKPOINTS.c.backend_ref == ckpt["backend_ref"]).values(state=LOST)).rowcount
            if changed:
                self.mgr.event(conn, ckpt["sandbox_id"], EventType.CHECKPOINT_LOST,
                               reason=Reason.GONE, payload={"checkpoint": ckpt["id"],
                                                            "backend_ref": ckpt["backend_ref"]})
        return bool(changed)

    # -- removal and retention --------------------------------------------------------------

    @telemetry.traced("sbx.checkpoint.remove")
    async def remove(self, ref: str, *, reason: str = "manual") -> dict[str, Any]:
        ckpt = self.resolve(ref)
        if ckpt["backend_ref"]:
            await self.mgr.adapter(ckpt["backend"]).delete_artifact(ckpt["backend_ref"])
        with self.db.write() as conn:
            gone = conn.execute(CHECKPOINTS.delete().where(CHECKPOINTS.c.id == ckpt["id"])).rowcount
            if gone:
                self.mgr.event(conn, ckpt["sandbox_id"], "checkpoint.removed", reason=reason,
                                payload={"checkpoint": ckpt["id"]})
        return ckpt

    async def _keep_newest(self, sandbox_id: str, keep: int) -> list[str]:
        ready = [r for r in self.list() if r["sandbox_id"] == sandbox_id and r["state"] == READY]
        surplus = ready[:-keep] if len(ready) > keep else []
        for row in surplus:
            await self.remove(row["id"], reason="retention")
        return [r["id"] for r in surplus]

    @telemetry.traced("sbx.checkpoint.prune")
    async def prune(self) -> list[str]:
        """Remove expired checkpoints (and their artifacts); apply each profile's `keep`."""
        now = to_iso(self.mgr.clock.now())
        removed = []
        rows = self.list()
        for row in rows:
            if row["state"] in (READY, LOST) and row["expires_at"] and row["expires_at"] <= now:
                await self.remove(row["id"], reason="ttl")
                removed.append(row["id"])
        for sandbox_id in {r["sandbox_id"] for r in rows if r["sandbox_id"]}:  # not imports
            keep = next(((json.loads(r["profile_json"]).get("checkpoints") or {}).get("keep")
                         for r in rows if r["sandbox_id"] == sandbox_id), None)
            if keep:
                removed += await self._keep_newest(sandbox_id, int(keep))
        return removed

    # -- reconcile --------------------------------------------------------------------------

    async def reconcile(self, backend: str, grace: timedelta) -> list[dict[str, Any]]:
        """No row without an artifact (or marked `lost`), no artifact of ours without a row,
        no artifact that nobody holds."""
        mgr = self.mgr
        adapter = mgr.adapter(backend)
        if not adapter.supports(Capability.SNAPSHOT):
            return []
        now = mgr.clock.now()
        listed = await adapter.list_artifacts({LABEL_INSTALL: mgr.install_id})
        artifacts = {a.labels.get(LABEL_CHECKPOINT): a for a in listed
                     if a.held and a.labels.get(LABEL_CHECKPOINT)}
        rows = {r["id"]: r for r in self.list()  # this installation's: a fleet's other
                if r["backend"] == backend and r["install_id"] == mgr.install_id}  # hosts judge theirs
        done = []
        for ckpt_id, row in rows.items():
            if row["state"] != PENDING or now - from_iso(row["created_at"]) < grace:
                continue
            sandbox = mgr.rows_by_ids([row["sandbox_id"]]).get(row["sandbox_id"])
            if sandbox and leased(sandbox, to_iso(now)):
                continue  # its maker may still be at work
            artifact = artifacts.get(ckpt_id)
            with self.db.write() as conn:
                if artifact:
                    conn.execute(CHECKPOINTS.update().where(CHECKPOINTS.c.id == ckpt_id).values(
                        state=READY, backend_ref=artifact.ref, size_bytes=artifact.size_bytes))
                    mgr.event(conn, row["sandbox_id"], "checkpoint.created",
                               payload={"checkpoint": ckpt_id, "completed_by": "reconcile"})
                else:
                    conn.execute(CHECKPOINTS.delete().where(CHECKPOINTS.c.id == ckpt_id))
                    mgr.event(conn, row["sandbox_id"], "checkpoint.failed",
                               payload={"checkpoint": ckpt_id, "error": "its maker died"})
            done.append({"checkpoint": ckpt_id, "action": "completed" if artifact else "removed"})
        for ckpt_id, artifact in artifacts.items():
            if ckpt_id in rows:
                continue
            with self.db.read() as conn:  # re-check: made since we listed?
                if conn.execute(sa.select(CHECKPOINTS.c.id)
                                .where(CHECKPOINTS.c.id == ckpt_id)).first():
                    continue
            await adapter.delete_artifact(artifact.ref)
            with self.db.write() as conn:
                mgr.event(conn, artifact.labels.get(LABEL_ID), "checkpoint.orphan-removed",
                           reason="orphan", payload={"checkpoint": ckpt_id,
                                                     "backend_ref": artifact.ref})
            done.append({"checkpoint": ckpt_id, "action": "orphan artifact removed"})
        held = {a.ref for a in listed if a.held}
        unlisted = [r for r in rows.values()
                    if r["state"] == READY and r["backend_ref"] and r["backend_ref"] not in held]
        gone = await adapter.missing_artifacts([r["backend_ref"] for r in unlisted]) \
            if unlisted else set()
        for row in unlisted:
            if row["backend_ref"] in gone and self._lose(row):
                done.append({"checkpoint": row["id"], "action": "lost"})
        for artifact in listed:
            if not artifact.held:
                done.append(await self._remove_loose(adapter, artifact))
        return done

    async def _remove_loose(self, adapter: Any, artifact: Any) -> dict[str, Any]:
        """Remove an artifact nobody holds (on Docker, an untagged checkpoint image no
        container uses): whichever installation made it, no row of any can reach it."""
        ckpt_id = artifact.labels.get(LABEL_CHECKPOINT)
        try:
            await adapter.delete_artifact(artifact.ref)
        except AdapterError as exc:  # used again since it was listed, say: next time
            return {"checkpoint": ckpt_id, "action": "unheld artifact kept",
                    "error": str(exc)}
        ours = artifact.labels.get(LABEL_INSTALL) == self.mgr.install_id
        with self.db.write() as conn:
            self.mgr.event(conn, artifact.labels.get(LABEL_ID) if ours else None,
                           EventType.CHECKPOINT_ORPHAN_REMOVED, reason=Reason.ORPHAN,
                           payload={"checkpoint": ckpt_id, "backend_ref": artifact.ref,
                                    "held": False})
        return {"checkpoint": ckpt_id, "action": "unheld artifact removed"}

    # -- export and import ------------------------------------------------------------------

    @telemetry.traced("sbx.checkpoint.export")
    async def export(self, ref: str, path: str) -> dict[str, Any]:
        ckpt = self.resolve(ref)
        if ckpt["state"] != READY:
            raise Conflict(f"checkpoint {ckpt['id']} is {ckpt['state']}: cannot export")
        claims = {k: ckpt[k] for k in ("id", "name", "kind", "state", "backend", "profile",
                                       "profile_json", "size_bytes", "created_at",
                                       "expires_at")}
        if is_imported(ckpt):  # passed on as the claims they came with
            claims.update(sandbox_id=ckpt["origin_sandbox_id"],
                          parent_id=ckpt["origin_parent_id"],
                          install_id=ckpt["origin_install_id"])
        else:
            claims.update(sandbox_id=ckpt["sandbox_id"], parent_id=ckpt["parent_id"],
                          install_id=ckpt["install_id"])
        manifest = {"format": ARCHIVE_FORMAT, "exported_at": to_iso(self.mgr.clock.now()),
                    "checkpoint": claims,
                    # named, not included (docs/volumes.md): an import runs under a local profile
                    "volumes_not_included": mounted_volumes(ckpt)}
        with tempfile.TemporaryDirectory() as tmp:
            artifact = Path(tmp) / "artifact.tar"
            await self.mgr.adapter(ckpt["backend"]).export_artifact(ckpt["backend_ref"],
                                                                    str(artifact))
            (Path(tmp) / "manifest.json").write_text(json.dumps(manifest, indent=1))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w:gz") as tar:
                for member in ARCHIVE_MEMBERS:
                    tar.add(Path(tmp) / member, arcname=member)
        return ckpt

    @telemetry.traced("sbx.checkpoint.import", lambda self, path, name=None: {})
    async def import_(self, path: str, name: str | None = None) -> dict[str, Any]:
        """Bring a checkpoint archive in, under `name` if given (else the archive's).

        The archive is read once, in order, within caps: its manifest is checked against
        the schema, and its id and name against this host's checkpoints (a name already
        here is refused: it would shadow a local checkpoint; the id already here is refused
        without `name`, and with it the import is a new checkpoint, of a new id, whose
        artifact the backend shares or copies), before its artifact is
        written to a temporary file; anything past a cap, or not part of a checkpoint
        archive, is refused (exit 2) before it is written or loaded. The import is a
        checkpoint of its own: its time is now, and it joins no local sandbox's lineage,
        events or evidence."""
        if name is not None:
            name = validate_name(name, "--name")
        max_manifest, max_artifact = settings.import_max_manifest(), settings.import_max_artifact()
        with _archive_members(path) as (members, tar):
            manifest = _read_manifest(path, members, tar, max_manifest)
            claims = manifest.checkpoint
            chosen = name if name is not None else claims.name
            if chosen is not None and name is None:
                validate_name(chosen, "checkpoint name in the archive (import it with --name N)")
            ckpt_id = claims.id
            if name is not None and self._here(claims.id):  # again, as another checkpoint
                ckpt_id = new_checkpoint_id()
            self._refuse_taken(ckpt_id, chosen)
            adapter = self.mgr.adapter(claims.backend)
            if not adapter.supports(Capability.SNAPSHOT):
                raise Conflict(f"the {claims.backend} backend cannot import checkpoints")
            await adapter.ensure_available()
            member = _next_member(path, members, "artifact.tar")
            if member.size > max_artifact:
                raise BadInput(f"{path}: refused: artifact.tar is {format_size(member.size)}, "
                               f"more than the cap of {format_size(max_artifact)} "
                               "(SBX_IMPORT_MAX_ARTIFACT)")
            with tempfile.TemporaryDirectory() as tmp:
                artifact = Path(tmp) / "artifact.tar"
                with open(artifact, "xb") as out:
                    _reading(path, lambda: tar.copy(member, out))
                extra = _reading(path, lambda: next(members, None))
                if extra is not None:
                    raise _not_ours(path, extra.name)
                artifact_ref = await adapter.import_artifact(
                    str(artifact), claims.id, install=self.mgr.install_id, as_checkpoint=ckpt_id)
        row = {
            "id": ckpt_id, "sandbox_id": None, "parent_id": None, "name": chosen,
            "kind": claims.kind, "state": READY, "backend": claims.backend,
            "backend_ref": artifact_ref, "install_id": self.mgr.install_id,
            "profile": claims.profile, "profile_json": claims.profile_json,
            "size_bytes": claims.size_bytes, "created_at": to_iso(self.mgr.clock.now()),
            "expires_at": None, "origin_sandbox_id": claims.sandbox_id,
            "origin_parent_id": claims.parent_id, "origin_install_id": claims.install_id,
            "exported_at": manifest.exported_at or claims.created_at,
            "owner": tenancy.owner_for(None) or self.mgr.actor,
        }
        try:
            with self.db.write() as conn:
                self._refuse_taken(ckpt_id, chosen, conn)  # again: another import may have won
                conn.execute(CHECKPOINTS.insert().values(**row))
                self.mgr.event(conn, None, "checkpoint.imported", payload={
                    "checkpoint": row["id"], "name": chosen, "from": path,
                    "origin_sandbox_id": claims.sandbox_id, "exported_at": row["exported_at"],
                    **({"archived_as": claims.id} if ckpt_id != claims.id else {})})
        except BaseException:
            with contextlib.suppress(Exception):
                if not self._here(ckpt_id):  # an import of the same id that won keeps it
                    await adapter.delete_artifact(artifact_ref)
            raise
        return self.resolve(row["id"])

    def _here(self, ckpt_id: str) -> bool:
        with self.db.read() as conn:
            return conn.execute(sa.select(CHECKPOINTS.c.id).where(
                CHECKPOINTS.c.id == ckpt_id)).first() is not None

    def _refuse_taken(self, ckpt_id: str, name: str | None, conn: Any = None) -> None:
        """Conflict when the id is here, or the name is: an import under a name already
        used would shadow that checkpoint for `sbx restore NAME`."""
        if conn is None:
            with self.db.read() as read:
                return self._refuse_taken(ckpt_id, name, read)
        if conn.execute(sa.select(CHECKPOINTS.c.id).where(CHECKPOINTS.c.id == ckpt_id)).first():
            raise Conflict(f"checkpoint {ckpt_id} is already here: import it again as another "
                           "checkpoint with --name NAME")
        if name is not None:
            holder = conn.execute(tenancy.narrow(sa.select(CHECKPOINTS.c.id).where(
                CHECKPOINTS.c.name == name), CHECKPOINTS)).first()
            if holder:
                raise Conflict(f"checkpoint name {name!r} is taken by {holder[0]} here: "
                               "import it under another with --name NAME")
        return None


def _not_ours(path: str, name: str) -> BadInput:
    return BadInput(f"{path}: refused: member {name!r} is not part of a sandboxer checkpoint "
                    f"(it holds {' then '.join(ARCHIVE_MEMBERS)}; paths stay inside it)")


def _reading(path: str, step: Any) -> Any:
    """One step of reading the archive, its failures as one line (exit 2)."""
    try:
        return step()
    except TooLarge as exc:
        raise BadInput(f"{path}: refused: {exc}") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise BadInput(f"{path}: not a sandboxer checkpoint archive: {exc}") from None


@contextlib.contextmanager
def _archive_members(path: str) -> Iterator[tuple[Iterator[tarfile.TarInfo], BoundedTar]]:
    """The archive's members as its gzip stream is read, one header at a time."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    with raw, gzip.GzipFile(fileobj=raw) as stream:
        tar = _reading(path, lambda: BoundedTar(stream, max_members=len(ARCHIVE_MEMBERS) + 1))
        try:
            yield iter(tar), tar
        finally:
            tar.close()


def _next_member(path: str, members: Iterator[tarfile.TarInfo], expected: str) -> tarfile.TarInfo:
    member = _reading(path, lambda: next(members, None))
    if member is None:
        raise BadInput(f"{path}: not a sandboxer checkpoint archive "
                       f"(needs {' then '.join(ARCHIVE_MEMBERS)})")
    if member.name != expected or not member.isfile():
        raise _not_ours(path, member.name)
    return member


def _read_manifest(path: str, members: Iterator[tarfile.TarInfo], tar: BoundedTar,
                   cap: int) -> ArchiveManifest:
    member = _next_member(path, members, "manifest.json")
    if member.size > cap:
        raise BadInput(f"{path}: refused: manifest.json is {format_size(member.size)}, more "
                       f"than the cap of {format_size(cap)} (SBX_IMPORT_MAX_MANIFEST)")
    data = _reading(path, lambda: tar.read(member))
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise BadInput(f"{path}: manifest.json is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != ARCHIVE_FORMAT:
        raise BadInput(f"{path}: not a {ARCHIVE_FORMAT} archive")
    try:
        return ArchiveManifest.model_validate(doc)
    except ValidationError as exc:
        from sandboxer.core.rules.errors import plain_problems

        raise BadInput(f"{path}: manifest.json: {plain_problems(exc.errors())[0]}") from None


def _duration(text: str) -> timedelta:
    from sandboxer.core.rules.durations import parse_duration

    return parse_duration(text, "checkpoints.ttl")
