"""Public halves of every receipt-signing key ever used, for verification after rotation."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from accountant.models.base import Base, Microseconds


class SigningKey(Base):
    __tablename__ = "signing_keys"

    kid: Mapped[str] = mapped_column(String(32), primary_key=True)
    public_jwk: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[Microseconds]
