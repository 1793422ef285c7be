"""change requests: raising a privacy limit or making an admin, approved by another admin

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27

With approvals on (ACCOUNTANT_APPROVALS=on), such a change is kept as a
pending request until another admin approves or denies it (DESIGN.md,
"Approvals").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "change_requests",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("target", sa.String(length=63), nullable=False),
        sa.Column("change", sa.JSON(), nullable=False),
        sa.Column("target_sha256", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=1000), nullable=False),
        sa.Column("requested_by", sa.Integer(), nullable=True),
        sa.Column("requested_by_name", sa.String(length=63), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("decided_by", sa.Integer(), nullable=True),
        sa.Column("decided_by_name", sa.String(length=63), nullable=True),
        sa.Column("decision_reason", sa.String(length=1000), nullable=True),
        sa.Column("decided_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["requested_by"],
            ["consumers.id"],
            name=op.f("fk_change_requests_requested_by_consumers"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["decided_by"],
            ["consumers.id"],
            name=op.f("fk_change_requests_decided_by_consumers"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_change_requests")),
    )
    op.create_index(
        "ix_change_requests_state", "change_requests", ["state", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_change_requests_state", table_name="change_requests")
    op.drop_table("change_requests")
