"""dashboard sessions: signing out deletes the session's row, ending every copy of its cookie

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Cookies from before hold a key id and no session token: they lead to the sign-in page.
    op.create_table(
        "dashboard_sessions",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key_id"],
            ["api_keys.id"],
            ondelete="CASCADE",
            name=op.f("fk_dashboard_sessions_key_id_api_keys"),
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_dashboard_sessions")),
    )


def downgrade() -> None:
    op.drop_table("dashboard_sessions")
