"""The noise secrets a database has known: at most one current, the rest retired."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from accountant.models.base import Base, Microseconds


class NoiseSecret(Base):
    """The public id of a noise secret (never the secret). ``current`` is true for the one in
    use and NULL for retired ones; a unique constraint on it allows one current row."""

    __tablename__ = "noise_secrets"
    __table_args__ = (UniqueConstraint("current"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    current: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    created_at: Mapped[Microseconds]
    retired_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
