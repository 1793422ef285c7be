"""Dashboard sessions: one row per sign-in, deleted at sign-out."""

from __future__ import annotations

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from accountant.models.base import Base, Microseconds


class DashboardSession(Base):
    """A signed-in dashboard session. The cookie holds a random token and this row only its
    SHA-256, so the table signs no one in; a page is served only while the row exists."""

    __tablename__ = "dashboard_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"))
    created_at: Mapped[Microseconds]
