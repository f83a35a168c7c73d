"""reconcile_seq: where each sandbox row stands in the order of changes a reconcile must see

The reaper between full looks (docs/reliability.md, 23) looks in full again when the
database changed since its last full look. `change_seq` (0016) moves on every write, an
exec's mark of activity too, so an installation that runs commands between its reaps looked
in full each cycle. `reconcile_seq` moves, by a trigger as `change_seq` does, on every insert
and on every update that sets a column other than these:

- `last_activity_at`: activity; a cycle between full looks reads the rows past their idle
  limit through it anyway;
- `warned_deadline`: the reaper's own note that it warned of an expiry;
- `change_seq` and `reconcile_seq` themselves.

TRACKED lists the columns at this revision; a later migration that adds a column to
sandboxes makes these triggers again with it (tests/store/test_reconcile_seq.py fails when a
column is neither tracked nor named above). A migration that rebuilds the table on SQLite
(batch mode) drops the triggers and must make them again.

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UNTRACKED = ("last_activity_at", "warned_deadline", "change_seq", "reconcile_seq")
TRACKED = ("id", "name", "profile", "profile_json", "backend", "backend_ref", "install_id",
           "state", "owner", "task", "labels_json", "created_at", "started_at", "deadline",
           "hard_deadline", "ended_at", "error", "lease_owner", "lease_expires_at", "fence",
           "idle_timeout_s", "restored_from", "backend_instance", "host", "pool", "launch",
           "isolation")

SQLITE_NEXT = "(SELECT coalesce(max(reconcile_seq), 0) + 1 FROM sandboxes)"
SQLITE_TRIGGERS = (
    "CREATE TRIGGER sandboxes_reconcile_seq_insert AFTER INSERT ON sandboxes BEGIN "
    f"UPDATE sandboxes SET reconcile_seq = {SQLITE_NEXT} WHERE id = NEW.id; END",
    f"CREATE TRIGGER sandboxes_reconcile_seq_update AFTER UPDATE OF {', '.join(TRACKED)} "
    f"ON sandboxes BEGIN UPDATE sandboxes SET reconcile_seq = {SQLITE_NEXT} "
    "WHERE id = NEW.id; END",
)
POSTGRES = (
    "CREATE FUNCTION sandboxes_reconcile_seq() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN NEW.reconcile_seq := txid_current(); RETURN NEW; END $$",
    "CREATE TRIGGER sandboxes_reconcile_seq_insert BEFORE INSERT ON sandboxes "
    "FOR EACH ROW EXECUTE FUNCTION sandboxes_reconcile_seq()",
    f"CREATE TRIGGER sandboxes_reconcile_seq_update BEFORE UPDATE OF {', '.join(TRACKED)} "
    "ON sandboxes FOR EACH ROW EXECUTE FUNCTION sandboxes_reconcile_seq()",
)


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("reconcile_seq", sa.BigInteger(), nullable=False,
                                   server_default="0"))
    op.create_index("ix_sandboxes_reconcile_seq", "sandboxes", ["reconcile_seq"])
    dialect = op.get_bind().dialect.name
    for statement in SQLITE_TRIGGERS if dialect == "sqlite" else POSTGRES:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS sandboxes_reconcile_seq_insert")
        op.execute("DROP TRIGGER IF EXISTS sandboxes_reconcile_seq_update")
    else:
        op.execute("DROP TRIGGER IF EXISTS sandboxes_reconcile_seq_insert ON sandboxes")
        op.execute("DROP TRIGGER IF EXISTS sandboxes_reconcile_seq_update ON sandboxes")
        op.execute("DROP FUNCTION IF EXISTS sandboxes_reconcile_seq()")
    op.drop_index("ix_sandboxes_reconcile_seq", "sandboxes")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("reconcile_seq")
