"""Datasets, their lifetime and partition limits, and their window budgets."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from accountant.accounting.modes import Mode, mode_of
from accountant.exact import Limit
from accountant.models.base import Base, LimitUnits, Microseconds, Name
from accountant.models.population import Population


class Dataset(Base):
    """A named body of sensitive data; its row is the lock every charge on it takes.

    ``limit_*`` is the lifetime budget and ``partition_limit_*`` the optional
    per-partition one. On zcdp, rdp and gdp datasets ``limit_epsilon``/``limit_delta``
    are the stated budget and ``limit_rho`` the enforced one (rho, the Renyi divergence at
    ``rdp_order``, or mu^2). On approx datasets with advanced composition ``limit_rho`` is
    the filter's rho* and ``limit_delta`` delta'' = delta - ``composition_delta``, both
    enforced (``accounting.advanced``). ``ledger_seq`` and ``ledger_head`` are the end of the
    dataset's ledger chain, and ``head_seal`` the service's seal of that end
    (``accountant.seals.of_head``).
    """

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[Name] = mapped_column(unique=True)
    privacy_unit: Mapped[str] = mapped_column(String(16))
    accounting: Mapped[str] = mapped_column(String(16))
    #: rdp datasets: the Renyi order as exact decimal text, fixed at creation.
    rdp_order: Mapped[str | None] = mapped_column(String(40))
    #: approx datasets: "basic" or "advanced" composition, fixed at creation.
    composition: Mapped[str] = mapped_column(String(16), default="basic", server_default="basic")
    #: advanced composition only: delta', the filter's share of the delta budget (units).
    composition_delta: Mapped[LimitUnits]
    #: The population the dataset joined at creation, for life (None: none).
    population_id: Mapped[int | None] = mapped_column(
        ForeignKey("populations.id", ondelete="RESTRICT"), nullable=True, index=True
    )
    max_partitions_per_user: Mapped[int | None] = mapped_column(Integer)
    max_records_per_user: Mapped[int | None] = mapped_column(Integer)
    #: what the admin said the dataset is, shown with it; no part of its terms
    description: Mapped[str | None] = mapped_column(String(1000))
    limit_epsilon: Mapped[LimitUnits]
    limit_delta: Mapped[LimitUnits]
    limit_rho: Mapped[LimitUnits]
    partition_limit_epsilon: Mapped[LimitUnits]
    partition_limit_delta: Mapped[LimitUnits]
    partition_limit_rho: Mapped[LimitUnits]
    has_partition_limit: Mapped[bool] = mapped_column(default=False)
    ledger_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    ledger_head: Mapped[str] = mapped_column(String(64), default="")
    #: ``seals.of_head`` of (name, ledger_seq, ledger_head), written with them by each append.
    head_seal: Mapped[str | None] = mapped_column(String(64))
    #: ``services.terms.digest`` of the limits as the service last set them.
    terms_sha256: Mapped[str] = mapped_column(String(64), default="", server_default="")
    #: ``seals.of_terms`` of that digest: only a holder of the key-hash secret can make it.
    terms_seal: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[Microseconds]

    population: Mapped[Population | None] = relationship()
    windows: Mapped[list[WindowBudget]] = relationship(
        back_populates="dataset",
        order_by="WindowBudget.period_seconds",
        cascade="all, delete-orphan",
    )

    @property
    def limit(self) -> Limit:
        return Limit(self.limit_epsilon, self.limit_delta, self.limit_rho)

    @property
    def mode(self) -> Mode:
        return mode_of(self.accounting, self.rdp_order, self.composition_delta)

    @property
    def partition_limit(self) -> Limit | None:
        if not self.has_partition_limit:
            return None
        return Limit(
            self.partition_limit_epsilon, self.partition_limit_delta, self.partition_limit_rho
        )


class WindowBudget(Base):
    """A limit on the charges of one dataset inside each aligned window of a period."""

    __tablename__ = "window_budgets"
    __table_args__ = (UniqueConstraint("dataset_id", "period_seconds"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    period_seconds: Mapped[int] = mapped_column(Integer)
    limit_epsilon: Mapped[LimitUnits]
    limit_delta: Mapped[LimitUnits]
    limit_rho: Mapped[LimitUnits]

    dataset: Mapped[Dataset] = relationship(back_populates="windows")

    @property
    def limit(self) -> Limit:
        return Limit(self.limit_epsilon, self.limit_delta, self.limit_rho)
