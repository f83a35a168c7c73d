"""volumes: named storage that outlives a sandbox, and which sandbox mounts which (docs/volumes.md)

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

T = 27


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("backend_ref", sa.String(256), nullable=True),
        sa.Column("backend_instance", sa.String(128), nullable=True),
        sa.Column("install_id", sa.String(64), nullable=False),
        sa.Column("labels_json", sa.Text(), nullable=False, server_default="{}"),
        sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.String(T), nullable=False),
        sa.Column("expires_at", sa.String(T), nullable=True),
    )
    op.create_index("ix_volumes_owner_name", "volumes", ["owner", "name"], unique=True)
    op.create_table(
        "mounts",
        sa.Column("sandbox_id", sa.String(40), primary_key=True),
        sa.Column("volume_id", sa.String(40), primary_key=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("read_only", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_mounts_volume_id", "mounts", ["volume_id"])


def downgrade() -> None:
    op.drop_index("ix_mounts_volume_id", "mounts")
    op.drop_table("mounts")
    op.drop_index("ix_volumes_owner_name", "volumes")
    op.drop_table("volumes")
