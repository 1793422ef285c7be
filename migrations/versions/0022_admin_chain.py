"""the ledger chain of approved new admins

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28

An approved new admin consumer or admin key is ledgered with both names and
both reasons (DESIGN.md, "Approvals"). Such a change belongs to no dataset and
no population, so its entries form a chain of their own, owned by the one row
of admin_chains, which the first such approval makes. The request keeps the
hash of its entry, which verify looks for (approvals from before have none).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "admin_chains",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("ledger_seq", sa.BigInteger(), nullable=False),
        sa.Column("ledger_head", sa.String(length=64), nullable=False),
        sa.Column("head_seal", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_chains")),
        sa.UniqueConstraint("name", name=op.f("uq_admin_chains_name")),
    )
    with op.batch_alter_table("ledger_entries") as batch:
        batch.add_column(sa.Column("admin_chain_id", sa.Integer(), nullable=True))
        batch.create_unique_constraint(
            batch.f("uq_ledger_entries_admin_chain_id_seq"), ["admin_chain_id", "seq"]
        )
        batch.create_foreign_key(
            batch.f("fk_ledger_entries_admin_chain_id_admin_chains"),
            "admin_chains",
            ["admin_chain_id"],
            ["id"],
            ondelete="CASCADE",
        )
    op.add_column("change_requests", sa.Column("ledger_hash", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("change_requests") as batch:
        batch.drop_column("ledger_hash")
    op.execute("DELETE FROM ledger_entries WHERE admin_chain_id IS NOT NULL")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_constraint(
            batch.f("fk_ledger_entries_admin_chain_id_admin_chains"), type_="foreignkey"
        )
        batch.drop_constraint(batch.f("uq_ledger_entries_admin_chain_id_seq"), type_="unique")
        batch.drop_column("admin_chain_id")
    op.drop_table("admin_chains")
