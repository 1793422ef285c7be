"""API keys: the display prefix no longer holds any character of the secret

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Keys were shown to admins and auditors by their first 12 characters: 8 characters of a
    # generated key's secret, and 12 of a human-chosen first admin key. Keep only the fixed
    # marker of generated keys; the key's random id identifies it.
    op.execute(
        "UPDATE api_keys SET prefix = CASE WHEN prefix LIKE 'pba\\_%' ESCAPE '\\' "
        "THEN 'pba_' ELSE '' END"
    )


def downgrade() -> None:
    pass  # the removed characters are gone; an empty or fixed prefix is valid in 0004 too
