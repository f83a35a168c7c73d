"""tenants: the owner of each checkpoint, an index on the sandboxes' owner, and each tenant's
quotas

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

T = 27


def upgrade() -> None:
    op.create_index("ix_sandboxes_owner", "sandboxes", ["owner"])
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("owner", sa.String(256), nullable=True))
    # a snapshot's tenant is its sandbox's owner
    op.execute("UPDATE checkpoints SET owner = (SELECT owner FROM sandboxes "
               "WHERE sandboxes.id = checkpoints.sandbox_id) WHERE sandbox_id IS NOT NULL")
    op.create_index("ix_checkpoints_owner", "checkpoints", ["owner"])
    op.create_table(
        "tenants",
        sa.Column("owner", sa.String(256), primary_key=True),
        sa.Column("max_sandboxes", sa.Integer(), nullable=True),
        sa.Column("max_ttl_s", sa.Integer(), nullable=True),
        sa.Column("max_execs", sa.Integer(), nullable=True),
        sa.Column("set_at", sa.String(T), nullable=False),
        sa.Column("set_by", sa.String(256), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tenants")
    op.drop_index("ix_checkpoints_owner", "checkpoints")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("owner")
    op.drop_index("ix_sandboxes_owner", "sandboxes")
