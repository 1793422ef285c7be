"""Consumers (callers with a role), their hashed API keys and their dataset grants."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from accountant.exact import Limit
from accountant.models.base import Base, LimitUnits, Microseconds, Name


class Consumer(Base):
    __tablename__ = "consumers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[Name] = mapped_column(unique=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[Microseconds]
    #: ``seals.of_consumer``: its role, grants, quotas and keys as the service last set them.
    seal: Mapped[str | None] = mapped_column(String(64))

    grants: Mapped[list[Grant]] = relationship(
        back_populates="consumer", cascade="all, delete-orphan"
    )
    keys: Mapped[list[ApiKey]] = relationship(
        back_populates="consumer", cascade="all, delete-orphan"
    )


class ApiKey(Base):
    """An API key, stored only as its SHA-256; ``prefix`` identifies it to people."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    consumer_id: Mapped[int] = mapped_column(ForeignKey("consumers.id", ondelete="CASCADE"))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[Microseconds]
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    consumer: Mapped[Consumer] = relationship(back_populates="keys")


class Grant(Base):
    """A consumer's access to one dataset, with an optional quota (a consumer scope limit)."""

    __tablename__ = "grants"
    __table_args__ = (UniqueConstraint("consumer_id", "dataset_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    consumer_id: Mapped[int] = mapped_column(ForeignKey("consumers.id", ondelete="CASCADE"))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    has_quota: Mapped[bool] = mapped_column(default=False)
    quota_epsilon: Mapped[LimitUnits]
    quota_delta: Mapped[LimitUnits]
    quota_rho: Mapped[LimitUnits]

    consumer: Mapped[Consumer] = relationship(back_populates="grants")

    @property
    def quota(self) -> Limit | None:
        if not self.has_quota:
            return None
        return Limit(self.quota_epsilon, self.quota_delta, self.quota_rho)
