"""event delivery: a cursor per sink, and events waiting for a retry or parked

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

T = 27


def upgrade() -> None:
    op.create_table(
        "sink_cursors",
        sa.Column("sink", sa.String(64), primary_key=True),
        sa.Column("delivered_id", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.String(T), nullable=True),
        sa.Column("fence", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_table(
        "deliveries",
        sa.Column("sink", sa.String(64), primary_key=True),
        sa.Column("event_id", sa.Integer(), primary_key=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.String(T), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("parked", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_table("deliveries")
    op.drop_table("sink_cursors")
