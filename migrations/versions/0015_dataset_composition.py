"""datasets: how approx releases compose, basic or advanced, fixed at creation

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # every dataset made before composed by basic composition; delta' only for advanced
    op.add_column(
        "datasets",
        sa.Column("composition", sa.String(16), nullable=False, server_default="basic"),
    )
    op.add_column("datasets", sa.Column("composition_delta", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("composition_delta")
        batch.drop_column("composition")
