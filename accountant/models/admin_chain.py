"""The ledger chain of approved changes that make a new admin (DESIGN.md, "Approvals")."""

from __future__ import annotations

from sqlalchemy import BigInteger, String
from sqlalchemy.orm import Mapped, mapped_column

from accountant.accounting.modes import Mode, mode_of
from accountant.models.base import Base, Microseconds

#: The chain's name, as the ledger's ``dataset`` field and its heads state it: no dataset
#: or population can have it (a name of theirs begins with a letter or a digit), and a CSV
#: export writes it as it is (a cell beginning with = + - @ is escaped there).
ADMINS = "_admins"


class AdminChain(Base):
    """The owner of the chain that records each approved new admin consumer and admin key,
    with both names and both reasons: neither a dataset's nor a population's, so a chain of
    its own. One row, named ``ADMINS``, made by the first such approval. ``ledger_seq``,
    ``ledger_head`` and ``head_seal`` are the end of its chain, as a dataset's."""

    __tablename__ = "admin_chains"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    ledger_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    ledger_head: Mapped[str] = mapped_column(String(64), default="")
    #: ``seals.of_head`` of (name, ledger_seq, ledger_head), written with them by each append.
    head_seal: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[Microseconds]

    #: Its entries cost nothing; they are stated in pure epsilon, as zero.
    limit_delta = None

    @property
    def mode(self) -> Mode:
        return mode_of("pure", None, None)
