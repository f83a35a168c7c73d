"""the HTTP service: API keys (their hash only) and the creates made under an Idempotency-Key

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

T = 27


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.String(T), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.Column("revoked_at", sa.String(T), nullable=True),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("principal", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("sandbox_id", sa.String(40), nullable=True),
        sa.Column("created_at", sa.String(T), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_table("api_keys")
