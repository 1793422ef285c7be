"""The secret the database's API keys are hashed under, by its public id (never the secret)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from accountant.models.base import Base, Microseconds


class KeyHashSecret(Base):
    """One row at most (``slot`` 1): the id of the key-hash secret (``accountant.key_hashing``)."""

    __tablename__ = "key_hash_secrets"

    slot: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[Microseconds]
    #: When every dataset and consumer was first sealed (``accountant.seals``).
    sealed_at: Mapped[int | None] = mapped_column(BigInteger)
    #: When every dataset's chain head was first sealed (``accountant.seals.of_head``).
    heads_sealed_at: Mapped[int | None] = mapped_column(BigInteger)
