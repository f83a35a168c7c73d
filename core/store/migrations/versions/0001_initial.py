"""sandboxes, checkpoints, events

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

T = 27


def upgrade() -> None:
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("profile", sa.String(128), nullable=False),
        sa.Column("profile_json", sa.Text(), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("backend_ref", sa.String(256), nullable=True),
        sa.Column("install_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("task", sa.Text(), nullable=True),
        sa.Column("labels_json", sa.Text(), nullable=False, server_default="{}"),
        sa.Column("created_at", sa.String(T), nullable=False),
        sa.Column("started_at", sa.String(T), nullable=True),
        sa.Column("deadline", sa.String(T), nullable=False),
        sa.Column("hard_deadline", sa.String(T), nullable=False),
        sa.Column("last_activity_at", sa.String(T), nullable=False),
        sa.Column("ended_at", sa.String(T), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.String(T), nullable=True),
        sa.Column("fence", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_index("ix_sandboxes_name", "sandboxes", ["name"])
    op.create_index("ix_sandboxes_state", "sandboxes", ["state"])
    op.create_index("ix_sandboxes_created_at", "sandboxes", ["created_at"])
    op.create_index("ix_sandboxes_deadline", "sandboxes", ["deadline"])

    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("sandbox_id", sa.String(40), sa.ForeignKey("sandboxes.id"), nullable=False),
        sa.Column("parent_id", sa.String(40), sa.ForeignKey("checkpoints.id"), nullable=True),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("backend_ref", sa.String(256), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.String(T), nullable=False),
        sa.Column("expires_at", sa.String(T), nullable=True),
    )
    op.create_index("ix_checkpoints_sandbox_id", "checkpoints", ["sandbox_id"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("time", sa.String(T), nullable=False),
        sa.Column("sandbox_id", sa.String(40), nullable=True),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("reason", sa.String(32), nullable=True),
        sa.Column("payload_json", sa.Text(), nullable=False, server_default="{}"),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
    )
    op.create_index("ix_events_time", "events", ["time"])
    op.create_index("ix_events_sandbox_id", "events", ["sandbox_id"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("checkpoints")
    op.drop_table("sandboxes")
