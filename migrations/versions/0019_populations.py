"""populations: a lifetime budget over several datasets of the same people

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27

A population's loss is the sum of its member datasets' lifetime losses
(DESIGN.md, "Populations"), kept on its row as a running total. A dataset
names the population it joined at creation. Ledger entries belong to a
dataset's chain or to a population's, which records the population's limit.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "populations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("privacy_unit", sa.String(length=16), nullable=False),
        sa.Column("accounting", sa.String(length=16), nullable=False),
        sa.Column("rdp_order", sa.String(length=40), nullable=True),
        sa.Column("limit_epsilon", sa.BigInteger(), nullable=True),
        sa.Column("limit_delta", sa.BigInteger(), nullable=True),
        sa.Column("limit_rho", sa.BigInteger(), nullable=True),
        sa.Column("loss_epsilon", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("loss_delta", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("loss_rho", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("ledger_seq", sa.BigInteger(), nullable=False),
        sa.Column("ledger_head", sa.String(length=64), nullable=False),
        sa.Column("head_seal", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_populations")),
        sa.UniqueConstraint("name", name=op.f("uq_populations_name")),
    )
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("population_id", sa.Integer(), nullable=True))
        batch.create_index(batch.f("ix_datasets_population_id"), ["population_id"], unique=False)
        batch.create_foreign_key(
            batch.f("fk_datasets_population_id_populations"),
            "populations",
            ["population_id"],
            ["id"],
            ondelete="RESTRICT",
        )
    with op.batch_alter_table("ledger_entries") as batch:
        batch.add_column(sa.Column("population_id", sa.Integer(), nullable=True))
        batch.alter_column("dataset_id", existing_type=sa.Integer(), nullable=True)
        batch.create_unique_constraint(
            batch.f("uq_ledger_entries_population_id_seq"), ["population_id", "seq"]
        )
        batch.create_foreign_key(
            batch.f("fk_ledger_entries_population_id_populations"),
            "populations",
            ["population_id"],
            ["id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    op.execute("DELETE FROM ledger_entries WHERE population_id IS NOT NULL")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_constraint(
            batch.f("fk_ledger_entries_population_id_populations"), type_="foreignkey"
        )
        batch.drop_constraint(batch.f("uq_ledger_entries_population_id_seq"), type_="unique")
        batch.alter_column("dataset_id", existing_type=sa.Integer(), nullable=False)
        batch.drop_column("population_id")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_constraint(batch.f("fk_datasets_population_id_populations"), type_="foreignkey")
        batch.drop_index(batch.f("ix_datasets_population_id"))
        batch.drop_column("population_id")
    op.drop_table("populations")
