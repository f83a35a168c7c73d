"""change_seq: where each sandbox row stands in the order of changes, for watchers

Every insert or update of a sandbox row sets its `change_seq`, by a trigger, so no writer can
forget it (raw SQL included), and a watcher reads only the rows changed since its last look
(`sandboxer.core.follow.watch`, docs/design.md "Watching the inventory"):

- SQLite, whose writers take turns: one more than the largest so far, so the order is the
  commit order.
- PostgreSQL: the writing transaction's id (`txid_current()`). Ids are handed out when a
  transaction first writes, not when it commits, so a watcher reads from the oldest
  transaction still running at its previous look (`txid_snapshot_xmin`), not past the
  largest id it saw.

Rows made before this revision have 0: a watcher's first look reads every row anyway.
A later migration that rebuilds the sandboxes table on SQLite (batch mode) drops these
triggers and must make them again (tests/api/test_watch_changes.py fails if it does not).

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

SQLITE_NEXT = "(SELECT coalesce(max(change_seq), 0) + 1 FROM sandboxes)"
SQLITE_TRIGGERS = (
    "CREATE TRIGGER sandboxes_change_seq_insert AFTER INSERT ON sandboxes BEGIN "
    f"UPDATE sandboxes SET change_seq = {SQLITE_NEXT} WHERE id = NEW.id; END",
    # WHEN: the trigger's own update does not set it again
    "CREATE TRIGGER sandboxes_change_seq_update AFTER UPDATE ON sandboxes "
    "WHEN NEW.change_seq IS OLD.change_seq BEGIN "
    f"UPDATE sandboxes SET change_seq = {SQLITE_NEXT} WHERE id = NEW.id; END",
)
POSTGRES = (
    "CREATE FUNCTION sandboxes_change_seq() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN NEW.change_seq := txid_current(); RETURN NEW; END $$",
    "CREATE TRIGGER sandboxes_change_seq BEFORE INSERT OR UPDATE ON sandboxes "
    "FOR EACH ROW EXECUTE FUNCTION sandboxes_change_seq()",
)


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("change_seq", sa.BigInteger(), nullable=False,
                                   server_default="0"))
    op.create_index("ix_sandboxes_change_seq", "sandboxes", ["change_seq"])
    dialect = op.get_bind().dialect.name
    for statement in SQLITE_TRIGGERS if dialect == "sqlite" else POSTGRES:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS sandboxes_change_seq_insert")
        op.execute("DROP TRIGGER IF EXISTS sandboxes_change_seq_update")
    else:
        op.execute("DROP TRIGGER IF EXISTS sandboxes_change_seq ON sandboxes")
        op.execute("DROP FUNCTION IF EXISTS sandboxes_change_seq()")
    op.drop_index("ix_sandboxes_change_seq", "sandboxes")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("change_seq")
