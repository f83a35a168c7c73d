"""due indexes: a reap cycle between full looks reads only what may be due, through indexes

`inventory.due_sandboxes` reads the live rows (state other than destroyed) past their
deadline, those in a state other than running, paused or warm, a pool's members and the
sandboxes with an idle limit. Written as one condition of ORs, SQLite walked every row, about
8 ms at 10,000 sandboxes in every cycle; and destroyed rows stay (the history), so an index
of every row's deadline would still step through every sandbox ever destroyed. Each part now
has a partial index that holds only the live rows it may read; the query names each index's
condition word for word, which is how SQLite knows it may use it. Adding an index rebuilds no
table, so 0017's triggers stay.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

LIVE = "state <> 'destroyed'"
INDEXES = {  # name: (column, the rows it holds)
    "ix_sandboxes_live_deadline": ("deadline", LIVE),
    "ix_sandboxes_unsettled": ("state", "state NOT IN ('running', 'paused', 'warm', 'destroyed')"),
    "ix_sandboxes_live_pool": ("pool", f"pool IS NOT NULL AND {LIVE}"),
    "ix_sandboxes_live_idle": ("idle_timeout_s", f"idle_timeout_s IS NOT NULL AND {LIVE}"),
}


def upgrade() -> None:
    for name, (column, rows) in INDEXES.items():
        where = sa.text(rows)
        op.create_index(name, "sandboxes", [column], sqlite_where=where, postgresql_where=where)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, "sandboxes")
