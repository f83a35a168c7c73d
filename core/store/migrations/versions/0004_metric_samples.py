"""metric samples, kept at a bounded rate for history

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("sandbox_id", sa.String(40), nullable=False),
        sa.Column("time", sa.String(27), nullable=False),
        sa.Column("cpu_pct", sa.Float(), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_limit", sa.BigInteger(), nullable=True),
        sa.Column("net_rx_bytes", sa.BigInteger(), nullable=True),
        sa.Column("net_tx_bytes", sa.BigInteger(), nullable=True),
        sa.Column("pids", sa.Integer(), nullable=True),
    )
    op.create_index("ix_metric_samples_sandbox_time", "metric_samples", ["sandbox_id", "time"])


def downgrade() -> None:
    op.drop_table("metric_samples")
