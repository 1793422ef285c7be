"""datasets: the digest of their accounting terms, to catch a limit edited in the database

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from accountant.services.terms import digest_of

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

#: The terms as they were at this revision (``rdp_order`` came with 0008).
_FIELDS = (
    "privacy_unit",
    "accounting",
    "max_partitions_per_user",
    "max_records_per_user",
    "limit_epsilon",
    "limit_delta",
    "limit_rho",
    "has_partition_limit",
    "partition_limit_epsilon",
    "partition_limit_delta",
    "partition_limit_rho",
)


def upgrade() -> None:
    op.add_column(
        "datasets",
        sa.Column("terms_sha256", sa.String(length=64), nullable=False, server_default=""),
    )
    connection = op.get_bind()
    windows: dict[int, list[tuple[int, int, int, int]]] = {}
    for row in connection.execute(
        sa.text(
            "SELECT dataset_id, period_seconds, limit_epsilon, limit_delta, limit_rho "
            "FROM window_budgets"
        )
    ):
        windows.setdefault(row[0], []).append(tuple(row[1:]))
    rows = connection.execute(sa.text(f"SELECT id, {', '.join(_FIELDS)} FROM datasets"))
    for row in rows.mappings().all():
        connection.execute(
            sa.text("UPDATE datasets SET terms_sha256 = :d WHERE id = :id"),
            {"d": digest_of(row, windows.get(row["id"], [])), "id": row["id"]},
        )


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("terms_sha256")
