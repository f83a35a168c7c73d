"""checkpoints outlive their sandbox and travel between hosts: no foreign key to the
sandbox, their own copy of the profile, a pending state while the backend makes them;
sandboxes remember the checkpoint they were restored from

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_table("checkpoints")
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("sandbox_id", sa.String(40), nullable=False),
        sa.Column("parent_id", sa.String(40), nullable=True),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("backend_ref", sa.String(256), nullable=True),
        sa.Column("install_id", sa.String(64), nullable=False),
        sa.Column("profile", sa.String(128), nullable=False),
        sa.Column("profile_json", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.String(27), nullable=False),
        sa.Column("expires_at", sa.String(27), nullable=True),
    )
    op.create_index("ix_checkpoints_sandbox_id", "checkpoints", ["sandbox_id"])
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("restored_from", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("restored_from")
