"""Idempotency keys: one row per (consumer, key), written in the charge's own transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from accountant.models.base import Base, Microseconds


class IdempotencyKey(Base):
    """The facts of a keyed charge's first answer, without its output (regenerated on
    replay); ``services.charge_responses`` states them."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("consumer_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    consumer_id: Mapped[int] = mapped_column(ForeignKey("consumers.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    charge_id: Mapped[str] = mapped_column(String(36))
    facts: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[Microseconds]
