"""How many charges each dataset has had, by mechanism and outcome: what /metrics reports,
kept by every charge's own transaction so that a scrape never reads the ledger."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from accountant.models.base import Base


class ChargeCount(Base):
    __tablename__ = "charge_counts"

    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    mechanism: Mapped[str] = mapped_column(String(63), primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16), primary_key=True)  # granted or denied
    count: Mapped[int] = mapped_column(BigInteger, server_default="0")
