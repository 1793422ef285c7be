"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consumers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_consumers")),
        sa.UniqueConstraint("name", name=op.f("uq_consumers_name")),
    )
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("privacy_unit", sa.String(length=16), nullable=False),
        sa.Column("accounting", sa.String(length=16), nullable=False),
        sa.Column("max_partitions_per_user", sa.Integer(), nullable=True),
        sa.Column("max_records_per_user", sa.Integer(), nullable=True),
        sa.Column("limit_epsilon", sa.BigInteger(), nullable=True),
        sa.Column("limit_delta", sa.BigInteger(), nullable=True),
        sa.Column("limit_rho", sa.BigInteger(), nullable=True),
        sa.Column("partition_limit_epsilon", sa.BigInteger(), nullable=True),
        sa.Column("partition_limit_delta", sa.BigInteger(), nullable=True),
        sa.Column("partition_limit_rho", sa.BigInteger(), nullable=True),
        sa.Column("has_partition_limit", sa.Boolean(), nullable=False),
        sa.Column("ledger_seq", sa.BigInteger(), nullable=False),
        sa.Column("ledger_head", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("name", name=op.f("uq_datasets_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("consumer_id", sa.Integer(), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["consumer_id"],
            ["consumers.id"],
            name=op.f("fk_api_keys_consumer_id_consumers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_table(
        "grants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("consumer_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("has_quota", sa.Boolean(), nullable=False),
        sa.Column("quota_epsilon", sa.BigInteger(), nullable=True),
        sa.Column("quota_delta", sa.BigInteger(), nullable=True),
        sa.Column("quota_rho", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["consumer_id"],
            ["consumers.id"],
            name=op.f("fk_grants_consumer_id_consumers"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_grants_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_grants")),
        sa.UniqueConstraint(
            "consumer_id", "dataset_id", name=op.f("uq_grants_consumer_id_dataset_id")
        ),
    )
    op.create_table(
        "ledger_entries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("charge_id", sa.String(length=36), nullable=True),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("consumer_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("mechanism", sa.String(length=63), nullable=True),
        sa.Column("release", sa.String(length=16), nullable=True),
        sa.Column("partitions", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("cost_epsilon", sa.BigInteger(), nullable=False),
        sa.Column("cost_delta", sa.BigInteger(), nullable=False),
        sa.Column("cost_rho", sa.BigInteger(), nullable=False),
        sa.Column("multiplicity", sa.BigInteger(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["consumer_id"],
            ["consumers.id"],
            name=op.f("fk_ledger_entries_consumer_id_consumers"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_ledger_entries_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
        sa.UniqueConstraint("charge_id", name=op.f("uq_ledger_entries_charge_id")),
        sa.UniqueConstraint("dataset_id", "seq", name=op.f("uq_ledger_entries_dataset_id_seq")),
    )
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_entries_consumer", ["consumer_id", "id"], unique=False)

    op.create_table(
        "partitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_partitions_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_partitions")),
        sa.UniqueConstraint("dataset_id", "key", name=op.f("uq_partitions_dataset_id_key")),
    )
    op.create_table(
        "tallies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("consumer_id", sa.Integer(), nullable=False),
        sa.Column("period_seconds", sa.Integer(), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("total_epsilon", sa.BigInteger(), nullable=False),
        sa.Column("total_delta", sa.BigInteger(), nullable=False),
        sa.Column("total_rho", sa.BigInteger(), nullable=False),
        sa.Column("max_epsilon", sa.BigInteger(), nullable=False),
        sa.Column("max_delta", sa.BigInteger(), nullable=False),
        sa.Column("max_rho", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_tallies_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tallies")),
        sa.UniqueConstraint(
            "dataset_id",
            "kind",
            "consumer_id",
            "period_seconds",
            "window_start",
            name=op.f("uq_tallies_dataset_id_kind_consumer_id_period_seconds_window_start"),
        ),
    )
    op.create_table(
        "window_budgets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("period_seconds", sa.Integer(), nullable=False),
        sa.Column("limit_epsilon", sa.BigInteger(), nullable=True),
        sa.Column("limit_delta", sa.BigInteger(), nullable=True),
        sa.Column("limit_rho", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_window_budgets_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_window_budgets")),
        sa.UniqueConstraint(
            "dataset_id", "period_seconds", name=op.f("uq_window_budgets_dataset_id_period_seconds")
        ),
    )
    op.create_table(
        "tally_spends",
        sa.Column("tally_id", sa.Integer(), nullable=False),
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("epsilon", sa.BigInteger(), nullable=False),
        sa.Column("delta", sa.BigInteger(), nullable=False),
        sa.Column("rho", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["partition_id"],
            ["partitions.id"],
            name=op.f("fk_tally_spends_partition_id_partitions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tally_id"],
            ["tallies.id"],
            name=op.f("fk_tally_spends_tally_id_tallies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tally_id", "partition_id", name=op.f("pk_tally_spends")),
    )
    with op.batch_alter_table("tally_spends", schema=None) as batch_op:
        batch_op.create_index("ix_tally_spends_tally_delta", ["tally_id", "delta"], unique=False)
        batch_op.create_index(
            "ix_tally_spends_tally_epsilon", ["tally_id", "epsilon"], unique=False
        )
        batch_op.create_index("ix_tally_spends_tally_rho", ["tally_id", "rho"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tally_spends", schema=None) as batch_op:
        batch_op.drop_index("ix_tally_spends_tally_rho")
        batch_op.drop_index("ix_tally_spends_tally_epsilon")
        batch_op.drop_index("ix_tally_spends_tally_delta")

    op.drop_table("tally_spends")
    op.drop_table("window_budgets")
    op.drop_table("tallies")
    op.drop_table("partitions")
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_entries_consumer")

    op.drop_table("ledger_entries")
    op.drop_table("grants")
    op.drop_table("api_keys")
    op.drop_table("datasets")
    op.drop_table("consumers")
