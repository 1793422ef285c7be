"""datasets keep the description they were created with

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28

POST /v1/datasets accepted a description and kept nothing of it; GET shows the
dataset as created, so it is kept and shown. It is no part of the dataset's
terms (its seal does not cover it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("datasets", sa.Column("description", sa.String(length=1000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("description")
