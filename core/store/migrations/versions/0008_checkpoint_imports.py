"""an imported checkpoint belongs to no local sandbox: its archive's sandbox, parent and
installation are kept as claims (origin_*), with the archive's time (exported_at), and
sandbox_id may be empty; imports made before this revision are moved to the claims

Revision ID: 0008
Revises: 0007
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("sandbox_id", existing_type=sa.String(40), nullable=True)
        batch.add_column(sa.Column("origin_sandbox_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("origin_parent_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("origin_install_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("exported_at", sa.String(27), nullable=True))
    # Imports recorded before: their row holds the archive's sandbox, parent and time as if
    # they were local. Their `checkpoint.imported` event says which rows they are.
    conn = op.get_bind()
    checkpoints = sa.table("checkpoints", *(sa.column(c) for c in (
        "id", "sandbox_id", "parent_id", "created_at", "origin_sandbox_id", "origin_parent_id",
        "exported_at")))
    events = sa.table("events", sa.column("type"), sa.column("time"), sa.column("payload_json"))
    imported = {}
    for time, payload in conn.execute(sa.select(events.c.time, events.c.payload_json)
                                      .where(events.c.type == "checkpoint.imported")):
        try:
            imported[json.loads(payload or "{}")["checkpoint"]] = time
        except (ValueError, KeyError, TypeError):
            continue
    for ckpt_id, time in imported.items():
        row = conn.execute(sa.select(checkpoints).where(checkpoints.c.id == ckpt_id)
                           ).mappings().first()
        if row is None or row["exported_at"] is not None:
            continue
        conn.execute(checkpoints.update().where(checkpoints.c.id == ckpt_id).values(
            origin_sandbox_id=row["sandbox_id"], origin_parent_id=row["parent_id"],
            exported_at=row["created_at"], created_at=time, sandbox_id=None, parent_id=None))


def downgrade() -> None:
    conn = op.get_bind()
    conn.execute(sa.text("UPDATE checkpoints SET sandbox_id = origin_sandbox_id, "
                         "parent_id = origin_parent_id WHERE exported_at IS NOT NULL"))
    conn.execute(sa.text("UPDATE checkpoints SET sandbox_id = '' WHERE sandbox_id IS NULL"))
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("exported_at")
        batch.drop_column("origin_install_id")
        batch.drop_column("origin_parent_id")
        batch.drop_column("origin_sandbox_id")
        batch.alter_column("sandbox_id", existing_type=sa.String(40), nullable=False)
