"""Running totals of a scope: T, the largest s(p), and s(p) per partition.

A tally is one scope of one dataset: its lifetime (``kind = "lifetime"``),
one consumer's charges (``"consumer"``), or one aligned window of a period
(``"window"``). Unused key columns hold 0 so the unique key has no NULLs.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from accountant.exact import Amount
from accountant.models.base import Base, RunningTotal, Units


class Tally(Base):
    __tablename__ = "tallies"
    __table_args__ = (
        UniqueConstraint("dataset_id", "kind", "consumer_id", "period_seconds", "window_start"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    consumer_id: Mapped[int] = mapped_column(Integer, default=0)
    period_seconds: Mapped[int] = mapped_column(Integer, default=0)
    window_start: Mapped[int] = mapped_column(BigInteger, default=0)
    total_epsilon: Mapped[RunningTotal]
    total_delta: Mapped[RunningTotal]
    total_rho: Mapped[RunningTotal]
    max_epsilon: Mapped[RunningTotal]
    max_delta: Mapped[RunningTotal]
    max_rho: Mapped[RunningTotal]

    @property
    def total(self) -> Amount:
        return Amount(self.total_epsilon, self.total_delta, self.total_rho)

    @property
    def max_spend(self) -> Amount:
        return Amount(self.max_epsilon, self.max_delta, self.max_rho)


class TallySpend(Base):
    """s(p) of one partition in one scope; indexed per component for the top-k rule."""

    __tablename__ = "tally_spends"
    __table_args__ = (
        Index("ix_tally_spends_tally_epsilon", "tally_id", "epsilon"),
        Index("ix_tally_spends_tally_delta", "tally_id", "delta"),
        Index("ix_tally_spends_tally_rho", "tally_id", "rho"),
    )

    tally_id: Mapped[int] = mapped_column(
        ForeignKey("tallies.id", ondelete="CASCADE"), primary_key=True
    )
    partition_id: Mapped[int] = mapped_column(
        ForeignKey("partitions.id", ondelete="CASCADE"), primary_key=True
    )
    epsilon: Mapped[Units]
    delta: Mapped[Units]
    rho: Mapped[Units]
