"""idle timeout and expiry-warning columns on sandboxes

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("idle_timeout_s", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("warned_deadline", sa.String(27), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("warned_deadline")
        batch.drop_column("idle_timeout_s")
