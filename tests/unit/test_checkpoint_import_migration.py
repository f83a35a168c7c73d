"""Migration 0008: imports recorded before it stop posing as checkpoints of local sandboxes."""

import json

import sqlalchemy as sa

from sandboxer.core.store.db import Database
from sandboxer.core.store.migrations import upgrade

LOCAL = "ckpt-" + "1" * 26
IMPORTED = "ckpt-" + "2" * 26


def _checkpoint(ckpt_id: str, sandbox_id: str, parent_id: str | None, created_at: str) -> dict:
    return {"id": ckpt_id, "sandbox_id": sandbox_id, "parent_id": parent_id, "name": None,
            "kind": "filesystem", "state": "ready", "backend": "docker",
            "backend_ref": f"sandboxer/checkpoint:{ckpt_id}", "install_id": "inst-here",
            "profile": "default", "profile_json": "{}", "size_bytes": 1,
            "created_at": created_at, "expires_at": None}


def test_imports_recorded_before_0008_keep_their_archives_claims_as_claims(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    with db.engine.begin() as conn:
        upgrade(conn, "0007")
        conn.execute(sa.text("INSERT INTO checkpoints VALUES (:id, :sandbox_id, :parent_id, "
                             ":name, :kind, :state, :backend, :backend_ref, :install_id, "
                             ":profile, :profile_json, :size_bytes, :created_at, :expires_at)"),
                     [_checkpoint(LOCAL, "sbx-local", None, "2026-01-01T00:00:00.000000Z"),
                      # what an import wrote: the archive's sandbox, parent and time as its own
                      _checkpoint(IMPORTED, "sbx-local", LOCAL, "2999-12-31T23:59:59.000000Z")])
        conn.execute(sa.text("INSERT INTO events (id, time, sandbox_id, type, actor, "
                             "payload_json, prev_hash, hash) VALUES (1, :time, 'sbx-local', "
                             "'checkpoint.imported', 'me', :payload, '0', 'h1')"),
                     {"time": "2026-02-01T00:00:00.000000Z",
                      "payload": json.dumps({"checkpoint": IMPORTED, "from": "a.tgz"})})
    db.migrate()
    with db.engine.connect() as conn:
        rows = {r["id"]: dict(r) for r in conn.execute(
            sa.text("SELECT * FROM checkpoints")).mappings()}
    imported, local = rows[IMPORTED], rows[LOCAL]
    assert (imported["sandbox_id"], imported["parent_id"]) == (None, None)
    assert (imported["origin_sandbox_id"], imported["origin_parent_id"]) == ("sbx-local", LOCAL)
    assert imported["exported_at"] == "2999-12-31T23:59:59.000000Z"
    assert imported["created_at"] == "2026-02-01T00:00:00.000000Z"  # when it was imported
    assert (local["sandbox_id"], local["exported_at"], local["origin_sandbox_id"]) == (
        "sbx-local", None, None)
