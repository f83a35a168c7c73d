"""processes: background processes started in sandboxes, and how they ended

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

T = 27


def upgrade() -> None:
    op.create_table(
        "processes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("sandbox_id", sa.String(40), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("argv_json", sa.Text(), nullable=False),
        sa.Column("env_names_json", sa.Text(), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("user", sa.String(256), nullable=True),
        sa.Column("stdin", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.String(T), nullable=False),
        sa.Column("started_by", sa.String(256), nullable=False),
        sa.Column("ended_at", sa.String(T), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
    )
    op.create_index("ix_processes_sandbox_pid", "processes", ["sandbox_id", "pid"])
    op.create_index("ix_processes_owner", "processes", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_processes_owner", "processes")
    op.drop_index("ix_processes_sandbox_pid", "processes")
    op.drop_table("processes")
