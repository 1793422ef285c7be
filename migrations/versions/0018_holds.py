"""holds: budget reserved and charged at once for jobs that run elsewhere

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26

A hold is charged in full when granted (DESIGN.md, "Jobs that run
elsewhere: holds"); its row keeps what it charged and to which scopes, so that
a settle can give back what the job did not use. Ledger entries gain the id of
the hold they made, drew on or settled, hashed only when present, so older
entries keep their hashes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "holds",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("consumer_id", sa.Integer(), nullable=True),
        sa.Column("release", sa.String(length=16), nullable=False),
        sa.Column("partitions", sa.JSON(), nullable=False),
        sa.Column("mechanism", sa.String(length=63), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("amount_epsilon", sa.BigInteger(), nullable=False),
        sa.Column("amount_delta", sa.BigInteger(), nullable=False),
        sa.Column("amount_rho", sa.BigInteger(), nullable=False),
        sa.Column("multiplicity", sa.BigInteger(), nullable=False),
        sa.Column("drawn_epsilon", sa.BigInteger(), nullable=False),
        sa.Column("drawn_delta", sa.BigInteger(), nullable=False),
        sa.Column("drawn_rho", sa.BigInteger(), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("purpose", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("settled_at", sa.BigInteger(), nullable=True),
        sa.Column("settled_by", sa.Integer(), nullable=True),
        sa.Column("used_epsilon", sa.BigInteger(), nullable=True),
        sa.Column("used_delta", sa.BigInteger(), nullable=True),
        sa.Column("used_rho", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["consumer_id"],
            ["consumers.id"],
            name=op.f("fk_holds_consumer_id_consumers"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["settled_by"],
            ["consumers.id"],
            name=op.f("fk_holds_settled_by_consumers"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_holds_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_holds")),
    )
    op.create_index("ix_holds_dataset", "holds", ["dataset_id", "created_at"], unique=False)
    op.add_column("ledger_entries", sa.Column("hold_id", sa.String(length=36), nullable=True))
    op.create_index(op.f("ix_ledger_entries_hold_id"), "ledger_entries", ["hold_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_ledger_entries_hold_id"), table_name="ledger_entries")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("hold_id")
    op.drop_index("ix_holds_dataset", table_name="holds")
    op.drop_table("holds")
