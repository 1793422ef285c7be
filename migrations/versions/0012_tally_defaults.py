"""tallies: the running totals default to 0 in the table, so inserts name only the scope

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_TOTALS = ("total_epsilon", "total_delta", "total_rho", "max_epsilon", "max_delta", "max_rho")


def upgrade() -> None:
    with op.batch_alter_table("tallies") as batch:
        for name in _TOTALS:
            batch.alter_column(name, existing_type=sa.BigInteger(), server_default="0")


def downgrade() -> None:
    with op.batch_alter_table("tallies") as batch:
        for name in _TOTALS:
            batch.alter_column(name, existing_type=sa.BigInteger(), server_default=None)
