"""Populations: budgets over several datasets of the same people (DESIGN.md)."""

from __future__ import annotations

from sqlalchemy import BigInteger, String
from sqlalchemy.orm import Mapped, mapped_column

from accountant.accounting.modes import Mode, mode_of
from accountant.exact import Amount, Limit
from accountant.models.base import Base, LimitUnits, Microseconds, Name, RunningTotal


class Population(Base):
    """A lifetime budget over its member datasets: its loss is the sum of their lifetime
    losses, kept here as a running total (``loss_*``) that every grant, hold and settle on a
    member moves by the member's change, under this row's lock. ``limit_*`` is enforced as
    a dataset's lifetime limit is (on zcdp, rdp and gdp ``limit_rho``, the others stated).
    ``ledger_seq``, ``ledger_head`` and ``head_seal`` are the end of the population's own
    ledger chain, which records its limit changes."""

    __tablename__ = "populations"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[Name] = mapped_column(unique=True)
    privacy_unit: Mapped[str] = mapped_column(String(16))
    accounting: Mapped[str] = mapped_column(String(16))
    #: rdp populations: the Renyi order as exact decimal text, fixed at creation.
    rdp_order: Mapped[str | None] = mapped_column(String(40))
    limit_epsilon: Mapped[LimitUnits]
    limit_delta: Mapped[LimitUnits]
    limit_rho: Mapped[LimitUnits]
    loss_epsilon: Mapped[RunningTotal]
    loss_delta: Mapped[RunningTotal]
    loss_rho: Mapped[RunningTotal]
    ledger_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    ledger_head: Mapped[str] = mapped_column(String(64), default="")
    #: ``seals.of_head`` of (name, ledger_seq, ledger_head), written with them by each append.
    head_seal: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[Microseconds]

    @property
    def limit(self) -> Limit:
        return Limit(self.limit_epsilon, self.limit_delta, self.limit_rho)

    @property
    def loss(self) -> Amount:
        return Amount(self.loss_epsilon, self.loss_delta, self.loss_rho)

    @property
    def mode(self) -> Mode:
        return mode_of(self.accounting, self.rdp_order, None)
