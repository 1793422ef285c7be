"""charge counts by dataset, mechanism and outcome, so that /metrics never reads the ledger

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "charge_counts",
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("mechanism", sa.String(length=63), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("count", sa.BigInteger(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            ondelete="CASCADE",
            name=op.f("fk_charge_counts_dataset_id_datasets"),
        ),
        sa.PrimaryKeyConstraint(
            "dataset_id", "mechanism", "outcome", name=op.f("pk_charge_counts")
        ),
    )
    # the counts of the charges already in the ledger: read once, here
    op.execute(
        "INSERT INTO charge_counts (dataset_id, mechanism, outcome, count) "
        "SELECT dataset_id, COALESCE(mechanism, ''), status, COUNT(*) "
        "FROM ledger_entries WHERE kind = 'charge' "
        "GROUP BY dataset_id, COALESCE(mechanism, ''), status"
    )


def downgrade() -> None:
    op.drop_table("charge_counts")
