"""replay provenance: noise secrets, and the secret and implementation of each charge

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "noise_secrets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("current", sa.Boolean(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("retired_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_noise_secrets")),
        sa.UniqueConstraint("current", name=op.f("uq_noise_secrets_current")),
    )
    op.add_column("ledger_entries", sa.Column("noise_secret", sa.String(length=32), nullable=True))
    op.add_column(
        "ledger_entries", sa.Column("implementation", sa.String(length=255), nullable=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("implementation")
        batch.drop_column("noise_secret")
    op.drop_table("noise_secrets")
