"""API keys: the id of the secret their keyed hashes are made under

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One row at most (slot 1). Keys stay plain SHA-256 until the first process with a
    # key-hash secret registers it and rehashes them (accountant.key_hashing), since a
    # migration does not hold the secret.
    op.create_table(
        "key_hash_secrets",
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("slot", name=op.f("pk_key_hash_secrets")),
    )


def downgrade() -> None:
    # Keyed hashes cannot be turned back into plain ones: downgrading below 0009 leaves every
    # key unusable, and new keys must be created with 'accountant keys create'.
    op.drop_table("key_hash_secrets")
