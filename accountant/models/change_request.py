"""Requests for changes that need a second admin's approval (DESIGN.md, "Approvals")."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from accountant.models.base import Base, Microseconds


class ChangeRequest(Base):
    """One request: a change that raises a privacy limit, makes a new admin, or raises a
    service's quota, as asked, waiting for another admin. ``change`` is the body of the
    change as it would have been applied; ``target_sha256`` the digest of its target when
    asked (a request whose target changed since cannot be approved). ``state`` is
    ``pending`` until decided (``approved`` or ``denied``); a pending request whose
    ``expires_at`` has come reads ``expired``, decided at each read."""

    __tablename__ = "change_requests"
    __table_args__ = (Index("ix_change_requests_state", "state", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(63))
    change: Mapped[dict[str, Any]] = mapped_column(JSON)
    target_sha256: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(1000))
    requested_by: Mapped[int | None] = mapped_column(
        ForeignKey("consumers.id", ondelete="SET NULL"), nullable=True
    )
    requested_by_name: Mapped[str] = mapped_column(String(63))
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[Microseconds]
    expires_at: Mapped[Microseconds]
    decided_by: Mapped[int | None] = mapped_column(
        ForeignKey("consumers.id", ondelete="SET NULL"), nullable=True
    )
    decided_by_name: Mapped[str | None] = mapped_column(String(63), nullable=True)
    decision_reason: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    decided_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: An approved new admin or admin key: the hash of the admins' chain entry that ledgers
    #: it (NULL on approvals from before that chain), which ``verify`` looks for.
    ledger_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)

    def state_at(self, now_us: int) -> str:
        """Its state at ``now_us``: a pending request past its expiry is ``expired``."""
        if self.state == "pending" and self.expires_at <= now_us:
            return "expired"
        return self.state
