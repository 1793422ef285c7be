"""Holds: budget reserved, and charged at once, for a job that runs elsewhere (DESIGN.md)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from accountant.exact import Amount
from accountant.models.base import Base, Microseconds, Units


class Hold(Base):
    """One hold. ``amount`` is its per-release cost, charged ``multiplicity`` times to the
    running totals when it was granted, to the scopes listed in ``scopes`` (the lifetime,
    the holder's quota and the windows current then, as ``[kind, consumer, period,
    start]``), which a settle gives back to. ``drawn`` is what charges made with it took.
    ``state`` is ``open`` until settled or released (``settled``); an open hold whose
    ``expires_at`` has come reads ``expired``, decided at each read."""

    __tablename__ = "holds"
    __table_args__ = (Index("ix_holds_dataset", "dataset_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    consumer_id: Mapped[int | None] = mapped_column(
        ForeignKey("consumers.id", ondelete="SET NULL"), nullable=True
    )
    release: Mapped[str] = mapped_column(String(16))
    partitions: Mapped[list[str]] = mapped_column(JSON)
    mechanism: Mapped[str | None] = mapped_column(String(63), nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    amount_epsilon: Mapped[Units]
    amount_delta: Mapped[Units]
    amount_rho: Mapped[Units]
    multiplicity: Mapped[int] = mapped_column(BigInteger)
    drawn_epsilon: Mapped[Units]
    drawn_delta: Mapped[Units]
    drawn_rho: Mapped[Units]
    scopes: Mapped[list[list[Any]]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    purpose: Mapped[str | None] = mapped_column(String(500), nullable=True)
    created_at: Mapped[Microseconds]
    expires_at: Mapped[Microseconds]
    settled_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: Who settled or released it, and what its job used in all (per release).
    settled_by: Mapped[int | None] = mapped_column(
        ForeignKey("consumers.id", ondelete="SET NULL"), nullable=True
    )
    used_epsilon: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    used_delta: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    used_rho: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    @property
    def amount(self) -> Amount:
        return Amount(self.amount_epsilon, self.amount_delta, self.amount_rho)

    @property
    def drawn(self) -> Amount:
        return Amount(self.drawn_epsilon, self.drawn_delta, self.drawn_rho)

    @property
    def used(self) -> Amount | None:
        if self.used_epsilon is None:
            return None
        return Amount(self.used_epsilon, self.used_delta or 0, self.used_rho or 0)
