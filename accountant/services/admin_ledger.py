"""The admins' chain: each approved new admin consumer and admin key, ledgered with both
names and both reasons (DESIGN.md, "Approvals").

Such a change belongs to no dataset and no population, so it joins a chain of its own,
owned by the one ``AdminChain`` row, which the first such approval makes. The row is
locked before the entry is appended, as a dataset's is, so the chain never forks.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from accountant import seals
from accountant.driver import Driver
from accountant.key_hashing import KeyHasher
from accountant.models import AdminChain
from accountant.models.admin_chain import ADMINS
from accountant.services import ledger


def record(
    session: Session,
    requester: ledger.Actor,
    detail: dict[str, Any],
    *,
    now: int,
    hasher: KeyHasher,
) -> str:
    """Append an approved new admin (``detail``: what was made, both names and both
    reasons) to the admins' chain, as an entry of ``requester``; the entry's hash."""
    return ledger.append(
        Driver.of(session),
        _locked(session, now, hasher),
        requester,
        kind="admin_change",
        status="granted",
        created_at=now,
        detail=detail,
        hasher=hasher,
    ).hash


def _locked(session: Session, now: int, hasher: KeyHasher) -> AdminChain:
    """The admins' chain's row, locked; made first if there is none (a concurrent approval
    that makes it too waits for this one's, then finds it), its empty chain sealed once
    heads are."""
    statement = select(AdminChain).where(AdminChain.name == ADMINS).with_for_update()
    found = session.execute(statement).scalar_one_or_none()
    if found is not None:
        return found
    seal = seals.of_head(hasher, ADMINS, 0, ledger.GENESIS) if seals.heads_begun(session) else None
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    session.execute(
        dialect.insert(AdminChain)
        .values(name=ADMINS, ledger_seq=0, ledger_head="", head_seal=seal, created_at=now)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    return session.execute(statement).scalar_one()
