"""Partitions: disjoint blocks of a dataset, named by public keys."""

from __future__ import annotations

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from accountant.models.base import Base, Microseconds


class Partition(Base):
    __tablename__ = "partitions"
    __table_args__ = (UniqueConstraint("dataset_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[Microseconds]
