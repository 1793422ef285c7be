"""The ledger: every charge (granted or denied) and every limit change, hash-chained per dataset."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from accountant.exact import Amount
from accountant.models.base import Base, Microseconds, Units


class LedgerEntry(Base):
    """One append-only entry. ``seq`` counts entries per chain (a dataset's, a
    population's, or the admins' chain) from 1;
    ``hash`` = SHA-256 of ``prev_hash`` and the entry's canonical JSON."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        UniqueConstraint("dataset_id", "seq"),
        UniqueConstraint("population_id", "seq"),
        UniqueConstraint("admin_chain_id", "seq"),
        Index("ix_ledger_entries_consumer", "consumer_id", "id"),
    )

    # INTEGER on SQLite, where only that type is an auto-incrementing rowid alias.
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    seq: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    charge_id: Mapped[str | None] = mapped_column(String(36), unique=True, nullable=True)
    #: The chain's owner: a dataset, or a population (whose chain records its limit), ...
    dataset_id: Mapped[int | None] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), nullable=True
    )
    population_id: Mapped[int | None] = mapped_column(
        ForeignKey("populations.id", ondelete="CASCADE"), nullable=True
    )
    #: ... or the chain of approved new admins (``AdminChain``).
    admin_chain_id: Mapped[int | None] = mapped_column(
        ForeignKey("admin_chains.id", ondelete="CASCADE"), nullable=True
    )
    consumer_id: Mapped[int | None] = mapped_column(
        ForeignKey("consumers.id", ondelete="SET NULL"), nullable=True
    )
    status: Mapped[str] = mapped_column(String(16))
    mechanism: Mapped[str | None] = mapped_column(String(63), nullable=True)
    release: Mapped[str | None] = mapped_column(String(16), nullable=True)
    partitions: Mapped[list[str]] = mapped_column(JSON, default=list)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    cost_epsilon: Mapped[Units]
    cost_delta: Mapped[Units]
    cost_rho: Mapped[Units]
    multiplicity: Mapped[int] = mapped_column(BigInteger, default=1)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: For a granted charge: the id of the noise secret and the mechanism implementation
    #: ("plugin/name/version") that produced its output; a replay must find both again.
    noise_secret: Mapped[str | None] = mapped_column(String(32), nullable=True)
    implementation: Mapped[str | None] = mapped_column(String(255), nullable=True)
    #: The dataset's lifetime loss after this entry (NULL on entries from before 0007). Not
    #: hashed: it follows from the chain and the accounting rules.
    loss_after_epsilon: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    loss_after_delta: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    loss_after_rho: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: The hold an entry of kind ``hold`` made, or a draw (a charge) or ``settle`` used.
    hold_id: Mapped[str | None] = mapped_column(String(36), nullable=True, index=True)
    created_at: Mapped[Microseconds]
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))

    @property
    def cost(self) -> Amount:
        return Amount(self.cost_epsilon, self.cost_delta, self.cost_rho)

    @property
    def loss_after(self) -> Amount | None:
        if self.loss_after_epsilon is None:
            return None
        return Amount(self.loss_after_epsilon, self.loss_after_delta or 0, self.loss_after_rho or 0)
