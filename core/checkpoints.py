"""Checkpoints: snapshot, restore (and so fork), lineage, retention, export and import.

A snapshot follows the operation pattern on a checkpoint row: the row is written `pending`
(with its event) while the sandbox's lease is held, the backend makes the artifact
(labelled `sbx.checkpoint`), and a second transaction records it `ready`. Reconcile
completes or removes a pending row whose maker died, and removes an artifact of this
installation that no row claims, so no row lacks an artifact and no artifact lacks a row.
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from ulid import ULID

from adapters.base import LABEL_CHECKPOINT, LABEL_ID, LABEL_INSTALL, Capability
from core.clock import from_iso, to_iso
from core.errors import BadInput, Conflict
from core.failpoints import failpoint
from core.models import Checkpoint
from core.states import ACTIVE, leased

if TYPE_CHECKING:
    from core.manager import Manager

CHECKPOINTS = Checkpoint.__table__
PREFIX = "ckpt-"
ARCHIVE_FORMAT = "sandboxer-checkpoint/1"
ARCHIVE_MEMBERS = {"manifest.json", "artifact.tar"}


def checkpoint_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint as the CLI and the API show it (without its stored profile)."""
    return {k: v for k, v in row.items() if k != "profile_json"}


def new_checkpoint_id() -> str:
    return PREFIX + str(ULID()).lower()


class Checkpoints:
    def __init__(self, mgr: Manager) -> None:
        self.mgr = mgr
        self.db = mgr.db

    # -- reading ----------------------------------------------------------------------------

    def resolve(self, ref: str) -> dict[str, Any]:
        """A checkpoint by id, name or unique id prefix (with or without `ckpt-`; core.refs)."""
        from core.refs import resolve

        with self.db.read() as conn:
            return resolve(conn, CHECKPOINTS, ref, id_prefix=PREFIX, what="checkpoint")

    def list(self, sandbox_ref: str | None = None) -> list[dict[str, Any]]:
        query = sa.select(CHECKPOINTS).order_by(CHECKPOINTS.c.created_at, CHECKPOINTS.c.id)
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

    async def snapshot(self, ref: str, name: str | None = None) -> dict[str, Any]:
        mgr = self.mgr
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
            "name": name, "kind": "filesystem", "state": "pending",
            "backend": sandbox["backend"], "backend_ref": None, "install_id": mgr.install_id,
            "profile": sandbox["profile"], "profile_json": sandbox["profile_json"],
            "created_at": to_iso(now),
            "expires_at": to_iso(now + _duration(keep_for)) if keep_for else None,
        }
        # The lease and the intent in one transaction, the result and the release in another:
        # nobody destroys the sandbox while its filesystem is being saved.
        with self.db.write() as conn:
            lease = mgr._take(sandbox["id"], ACTIVE, "snapshot", conn)
            conn.execute(CHECKPOINTS.insert().values(**row))
            mgr._event(conn, sandbox["id"], "checkpoint.creating",
                       payload={"checkpoint": ckpt_id, "name": name,
                                "parent": row["parent_id"]})
        given_back = False
        try:
            failpoint("snapshot.after-intent")
            labels = {LABEL_CHECKPOINT: ckpt_id, LABEL_INSTALL: mgr.install_id,
                      LABEL_ID: sandbox["id"]}
            try:
                async with mgr._holding(lease):
                    artifact = await adapter.snapshot(sandbox["backend_ref"], labels)
            except BaseException as exc:
                with self.db.write() as conn:
                    conn.execute(CHECKPOINTS.delete().where(CHECKPOINTS.c.id == ckpt_id))
                    mgr._event(conn, sandbox["id"], "checkpoint.failed",
                               payload={"checkpoint": ckpt_id, "error": str(exc)})
                    mgr._give_back(lease, conn)
                given_back = True
                raise
            failpoint("snapshot.after-backend")
            with self.db.write() as conn:
                conn.execute(CHECKPOINTS.update().where(CHECKPOINTS.c.id == ckpt_id).values(
                    state="ready", backend_ref=artifact.ref, size_bytes=artifact.size_bytes))
                mgr._event(conn, sandbox["id"], "checkpoint.created", payload={
                    "checkpoint": ckpt_id, "name": name, "kind": "filesystem",
                    "parent": row["parent_id"], "size_bytes": artifact.size_bytes})
                mgr._give_back(lease, conn)
            given_back = True
        finally:
            if not given_back:  # a database error above: the lease must not outlive us
                with contextlib.suppress(Exception):
                    mgr._give_back(lease)
        keep = (profile.get("checkpoints") or {}).get("keep")
        if keep:
            await self._keep_newest(sandbox["id"], int(keep))
        return self.resolve(ckpt_id)

    async def restore(self, ref: str, *, ttl: timedelta | None = None, name: str | None = None,
                      labels: Mapping[str, str] | None = None, owner: str | None = None,
                      task: str | None = None) -> dict[str, Any]:
        """A new sandbox from a checkpoint, with the profile the checkpoint was taken under.
        Any number may be restored from one checkpoint (a fork)."""
        from core.profiles import Profile

        ckpt = self.resolve(ref)
        if ckpt["state"] != "ready":
            raise Conflict(f"checkpoint {ckpt['id']} is {ckpt['state']}: cannot restore")
        profile = Profile.model_validate(json.loads(ckpt["profile_json"]))
        return await self.mgr.create(profile, ttl=ttl, name=name, labels=labels, owner=owner,
                                     task=task, restore_from=ckpt)

    # -- removal and retention --------------------------------------------------------------

    async def remove(self, ref: str, *, reason: str = "manual") -> dict[str, Any]:
        ckpt = self.resolve(ref)
        if ckpt["backend_ref"]:
            await self.mgr.adapter(ckpt["backend"]).delete_artifact(ckpt["backend_ref"])
        with self.db.write() as conn:
            gone = conn.execute(CHECKPOINTS.delete().where(CHECKPOINTS.c.id == ckpt["id"])).rowcount
            if gone:
                self.mgr._event(conn, ckpt["sandbox_id"], "checkpoint.removed", reason=reason,
                                payload={"checkpoint": ckpt["id"]})
        return ckpt

    async def _keep_newest(self, sandbox_id: str, keep: int) -> list[str]:
        ready = [r for r in self.list() if r["sandbox_id"] == sandbox_id and r["state"] == "ready"]
        surplus = ready[:-keep] if len(ready) > keep else []
        for row in surplus:
            await self.remove(row["id"], reason="retention")
        return [r["id"] for r in surplus]

    async def prune(self) -> list[str]:
        """Remove expired checkpoints (and their artifacts); apply each profile's `keep`."""
        now = to_iso(self.mgr.clock.now())
        removed = []
        rows = self.list()
        for row in rows:
            if row["state"] == "ready" and row["expires_at"] and row["expires_at"] <= now:
                await self.remove(row["id"], reason="ttl")
                removed.append(row["id"])
        for sandbox_id in {r["sandbox_id"] for r in rows}:
            keep = next(((json.loads(r["profile_json"]).get("checkpoints") or {}).get("keep")
                         for r in rows if r["sandbox_id"] == sandbox_id), None)
            if keep:
                removed += await self._keep_newest(sandbox_id, int(keep))
        return removed

    # -- reconcile --------------------------------------------------------------------------

    async def reconcile(self, backend: str, grace: timedelta) -> list[dict[str, Any]]:
        """No row without an artifact, no artifact of ours without a row."""
        mgr = self.mgr
        adapter = mgr.adapter(backend)
        if not adapter.supports(Capability.SNAPSHOT):
            return []
        now = mgr.clock.now()
        artifacts = {a.labels.get(LABEL_CHECKPOINT): a for a in
                     await adapter.list_artifacts({LABEL_INSTALL: mgr.install_id})
                     if a.labels.get(LABEL_CHECKPOINT)}
        rows = {r["id"]: r for r in self.list() if r["backend"] == backend}
        done = []
        for ckpt_id, row in rows.items():
            if row["state"] != "pending" or now - from_iso(row["created_at"]) < grace:
                continue
            sandbox = mgr.rows_by_ids([row["sandbox_id"]]).get(row["sandbox_id"])
            if sandbox and leased(sandbox, to_iso(now)):
                continue  # its maker may still be at work
            artifact = artifacts.get(ckpt_id)
            with self.db.write() as conn:
                if artifact:
                    conn.execute(CHECKPOINTS.update().where(CHECKPOINTS.c.id == ckpt_id).values(
                        state="ready", backend_ref=artifact.ref, size_bytes=artifact.size_bytes))
                    mgr._event(conn, row["sandbox_id"], "checkpoint.created",
                               payload={"checkpoint": ckpt_id, "completed_by": "reconcile"})
                else:
                    conn.execute(CHECKPOINTS.delete().where(CHECKPOINTS.c.id == ckpt_id))
                    mgr._event(conn, row["sandbox_id"], "checkpoint.failed",
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
                mgr._event(conn, artifact.labels.get(LABEL_ID), "checkpoint.orphan-removed",
                           reason="orphan", payload={"checkpoint": ckpt_id,
                                                     "backend_ref": artifact.ref})
            done.append({"checkpoint": ckpt_id, "action": "orphan artifact removed"})
        return done

    # -- export and import ------------------------------------------------------------------

    async def export(self, ref: str, path: str) -> dict[str, Any]:
        ckpt = self.resolve(ref)
        if ckpt["state"] != "ready":
            raise Conflict(f"checkpoint {ckpt['id']} is {ckpt['state']}: cannot export")
        manifest = {"format": ARCHIVE_FORMAT,
                    "checkpoint": {k: v for k, v in ckpt.items() if k != "backend_ref"}}
        with tempfile.TemporaryDirectory() as tmp:
            artifact = Path(tmp) / "artifact.tar"
            await self.mgr.adapter(ckpt["backend"]).export_artifact(ckpt["backend_ref"],
                                                                    str(artifact))
            (Path(tmp) / "manifest.json").write_text(json.dumps(manifest, indent=1))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w:gz") as tar:
                tar.add(Path(tmp) / "manifest.json", arcname="manifest.json")
                tar.add(artifact, arcname="artifact.tar")
        return ckpt

    async def import_(self, path: str) -> dict[str, Any]:
        """Bring a checkpoint archive in. One that is not ours, or whose paths leave its
        folder, is refused (exit 2) before anything is written or loaded."""
        manifest, members = _read_archive(path)
        ckpt = manifest["checkpoint"]
        with self.db.read() as conn:
            if conn.execute(sa.select(CHECKPOINTS.c.id)
                            .where(CHECKPOINTS.c.id == ckpt["id"])).first():
                raise Conflict(f"checkpoint {ckpt['id']} is already here")
        adapter = self.mgr.adapter(ckpt["backend"])
        if not adapter.supports(Capability.SNAPSHOT):
            raise Conflict(f"the {ckpt['backend']} backend cannot import checkpoints")
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(path, "r:gz") as tar:
            tar.extract(members["artifact.tar"], tmp, filter="data")
            artifact_ref = await adapter.import_artifact(str(Path(tmp) / "artifact.tar"),
                                                         ckpt["id"])
        row = {k: ckpt.get(k) for k in ("id", "sandbox_id", "parent_id", "name", "kind",
                                        "backend", "profile", "profile_json", "size_bytes",
                                        "created_at", "expires_at")}
        row.update(state="ready", backend_ref=artifact_ref, install_id=self.mgr.install_id)
        with self.db.write() as conn:
            conn.execute(CHECKPOINTS.insert().values(**row))
            self.mgr._event(conn, row["sandbox_id"], "checkpoint.imported",
                            payload={"checkpoint": row["id"], "from": path})
        return self.resolve(row["id"])


def _read_archive(path: str) -> tuple[dict[str, Any], dict[str, tarfile.TarInfo]]:
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                name = member.name
                if name.startswith("/") or ".." in Path(name).parts or not (
                        member.isfile() and name in ARCHIVE_MEMBERS):
                    raise BadInput(f"{path}: refused: member {name!r} is not part of a "
                                   "sandboxer checkpoint (paths must stay inside the archive)")
            by_name = {m.name: m for m in members}
            if set(by_name) != ARCHIVE_MEMBERS:
                raise BadInput(f"{path}: not a sandboxer checkpoint archive "
                               f"(needs {', '.join(sorted(ARCHIVE_MEMBERS))})")
            manifest = json.load(tar.extractfile(by_name["manifest.json"]))
    except (tarfile.TarError, OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path}: not a sandboxer checkpoint archive: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ARCHIVE_FORMAT or \
            not isinstance(manifest.get("checkpoint"), dict) or \
            not str(manifest["checkpoint"].get("id", "")).startswith(PREFIX):
        raise BadInput(f"{path}: not a {ARCHIVE_FORMAT} archive")
    return manifest, by_name


def _duration(text: str) -> timedelta:
    from core.durations import parse_duration

    return parse_duration(text, "checkpoints.ttl")
