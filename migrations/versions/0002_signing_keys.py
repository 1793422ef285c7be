"""signing keys

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.String(length=32), nullable=False),
        sa.Column("public_jwk", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("kid", name=op.f("pk_signing_keys")),
    )


def downgrade() -> None:
    op.drop_table("signing_keys")
