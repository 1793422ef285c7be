"""ledger entries: the dataset's lifetime loss after each entry

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COLUMNS = ("loss_after_epsilon", "loss_after_delta", "loss_after_rho")


def upgrade() -> None:
    for name in _COLUMNS:  # NULL on entries written before: not recorded then
        op.add_column("ledger_entries", sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries") as batch:
        for name in _COLUMNS:
            batch.drop_column(name)
