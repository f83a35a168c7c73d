"""due indexes: a reap cycle between full looks reads only what may be due, through indexes

`inventory.due_sandboxes` reads the rows past their deadline (`ix_sandboxes_deadline`), in a
state other than running, paused or warm (`ix_sandboxes_state`), a pool's members and the
sandboxes with an idle limit. The last two had no index, so the read walked every row: about
8 ms at 10,000 sandboxes, in every cycle. These partial indexes hold only the rows that have
a pool or an idle limit. Adding an index rebuilds no table, so 0017's triggers stay.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

INDEXES = {"ix_sandboxes_pool": "pool", "ix_sandboxes_idle_timeout_s": "idle_timeout_s"}


def upgrade() -> None:
    for name, column in INDEXES.items():
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(name, "sandboxes", [column], sqlite_where=where, postgresql_where=where)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, "sandboxes")
