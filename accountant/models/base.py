"""The declarative base: a constraint naming convention and reusable column types."""

from __future__ import annotations

from typing import Annotated

from sqlalchemy import BigInteger, MetaData, String
from sqlalchemy.orm import DeclarativeBase, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: A privacy amount in integer units (see ``accountant.exact``); exact on every backend.
Units = Annotated[int, mapped_column(BigInteger, nullable=False, default=0)]
#: A running total of a scope (``Tally``) or of a part of a partition's spend
#: (``TallySpend``), 0 until the first charge: a default the table holds, so an insert
#: names only what it sets.
RunningTotal = Annotated[int, mapped_column(BigInteger, nullable=False, server_default="0")]
#: An optional limit in integer units; NULL means "not limited in this component".
LimitUnits = Annotated[int | None, mapped_column(BigInteger, nullable=True)]
#: A moment as integer microseconds since the epoch, UTC: exact and sortable everywhere.
Microseconds = Annotated[int, mapped_column(BigInteger, nullable=False)]
Name = Annotated[str, mapped_column(String(63), nullable=False)]


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
