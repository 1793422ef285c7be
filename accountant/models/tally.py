"""Running totals of a scope: T, the largest s(p), and s(p) per partition.

A tally is one scope of one dataset: its lifetime (``kind = "lifetime"``),
one consumer's charges (``"consumer"``), or one aligned window of a period
(``"window"``). Unused key columns hold 0 so the unique key has no NULLs.
On datasets with the top-k rule, T and s(p) are also kept apart for the
joint and the parallel releases (T_J, T_P, s_J(p), s_P(p)) for its second
term (``accounting.loss``); elsewhere they stay 0. Rows from before that
split count all of their spend as parallel (migration 0014), which is
sound: the term is sound for any division of the charges into two sets.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, UniqueConstraint, text
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
    total_joint_epsilon: Mapped[RunningTotal]
    total_joint_delta: Mapped[RunningTotal]
    total_joint_rho: Mapped[RunningTotal]
    total_parallel_epsilon: Mapped[RunningTotal]
    total_parallel_delta: Mapped[RunningTotal]
    total_parallel_rho: Mapped[RunningTotal]

    @property
    def total(self) -> Amount:
        return Amount(self.total_epsilon, self.total_delta, self.total_rho)

    @property
    def joint_total(self) -> Amount:
        return Amount(self.total_joint_epsilon, self.total_joint_delta, self.total_joint_rho)

    @property
    def parallel_total(self) -> Amount:
        return Amount(
            self.total_parallel_epsilon, self.total_parallel_delta, self.total_parallel_rho
        )

    @property
    def max_spend(self) -> Amount:
        return Amount(self.max_epsilon, self.max_delta, self.max_rho)


#: s(p), s_J(p) and s_P(p): the columns of ``TallySpend`` per part, as ``accounting.loss``
#: names the parts.
PART_PREFIXES: dict[str, str] = {"every": "", "joint": "joint_", "parallel": "parallel_"}


def _spend_index(column: str) -> Index:
    """s(p) is indexed whole; s_J(p) and s_P(p) only where positive, which they are only on
    datasets with the top-k rule (``LossRule.parts``), so no other charge writes them."""
    where = None if column in ("epsilon", "delta", "rho") else text(f"{column} > 0")
    return Index(
        f"ix_tally_spends_tally_{column}",
        "tally_id",
        column,
        postgresql_where=where,
        sqlite_where=where,
    )


class TallySpend(Base):
    """s(p), s_J(p) and s_P(p) of one partition in one scope; each indexed per component for
    the top-k rule."""

    __tablename__ = "tally_spends"
    __table_args__ = tuple(
        _spend_index(f"{prefix}{name}")
        for prefix in PART_PREFIXES.values()
        for name in ("epsilon", "delta", "rho")
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
    joint_epsilon: Mapped[RunningTotal]
    joint_delta: Mapped[RunningTotal]
    joint_rho: Mapped[RunningTotal]
    parallel_epsilon: Mapped[RunningTotal]
    parallel_delta: Mapped[RunningTotal]
    parallel_rho: Mapped[RunningTotal]

    @property
    def parts(self) -> dict[str, Amount]:
        """s(p), s_J(p) and s_P(p), by the part's name in ``accounting.loss``."""
        return {
            "every": Amount(self.epsilon, self.delta, self.rho),
            "joint": Amount(self.joint_epsilon, self.joint_delta, self.joint_rho),
            "parallel": Amount(self.parallel_epsilon, self.parallel_delta, self.parallel_rho),
        }
