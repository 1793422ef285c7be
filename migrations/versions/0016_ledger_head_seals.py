"""head seals: each dataset's chain head sealed, and when head seals began

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Heads stay unsealed until 'accountant seals init' seals them as they stand
    # (accountant.seals); the secret never reaches the database, so SQL cannot.
    op.add_column("datasets", sa.Column("head_seal", sa.String(length=64), nullable=True))
    op.add_column("key_hash_secrets", sa.Column("heads_sealed_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("key_hash_secrets") as batch:
        batch.drop_column("heads_sealed_at")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("head_seal")
