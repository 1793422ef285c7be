"""datasets: the Renyi order of rdp datasets, fixed at creation

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for every mode but rdp; the exact decimal text of the order
    op.add_column("datasets", sa.Column("rdp_order", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("rdp_order")
