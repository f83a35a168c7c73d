"""isolation: how each sandbox was contained (`container`, or `gvisor` under the runsc runtime)

Rows made before this revision were all made under the profile default, `container`.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(
            sa.Column("isolation", sa.String(16), nullable=False, server_default="container")
        )


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("isolation")
