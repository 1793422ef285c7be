"""seals: keyed digests of each dataset's terms and each consumer's role, grants and keys

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows stay unsealed until a process holding the key-hash secret seals them all once
    # (accountant.seals); the secret never reaches the database, so SQL cannot.
    op.add_column("datasets", sa.Column("terms_seal", sa.String(length=64), nullable=True))
    op.add_column("consumers", sa.Column("seal", sa.String(length=64), nullable=True))
    op.add_column("key_hash_secrets", sa.Column("sealed_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("key_hash_secrets") as batch:
        batch.drop_column("sealed_at")
    with op.batch_alter_table("consumers") as batch:
        batch.drop_column("seal")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("terms_seal")
