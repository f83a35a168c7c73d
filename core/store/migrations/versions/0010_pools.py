"""warm pools: the pool a sandbox was made for and how a create was served (warm or cold),
and the sizes `sbx pool set` gives pools

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

T = 27


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("pool", sa.String(128), nullable=True))
        batch.add_column(sa.Column("launch", sa.String(8), nullable=True))
    op.create_table(
        "pools",
        sa.Column("profile", sa.String(128), primary_key=True),
        sa.Column("size", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.String(T), nullable=False),
        sa.Column("set_at", sa.String(T), nullable=True),
        sa.Column("set_by", sa.String(256), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("pools")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("launch")
        batch.drop_column("pool")
