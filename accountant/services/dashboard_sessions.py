"""Dashboard sessions kept in the database, so that signing out ends them everywhere.

The session cookie holds a random token; the table holds its SHA-256 with the key that
signed in and when. A page is served only for a token whose row exists, whose key is
unrevoked and whose age is under the session's lifetime. Signing out deletes the row, so a
copy of the cookie (in a proxy's log, on a shared machine) is signed out with it.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from accountant.models import ApiKey, Consumer, DashboardSession
from accountant.services.api_keys import Principal


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def start(session: Session, key_id: str, *, now: int, lifetime_us: int) -> str:
    """A new session of ``key_id``: its token, for the cookie. Sessions past their
    lifetime are deleted on the way, so the table holds only live ones.

    Args:
        session: the caller's write transaction.
        key_id: the id of the key that signed in.
        now: the time (microseconds).
        lifetime_us: a session's lifetime (microseconds).
    """
    session.execute(
        delete(DashboardSession).where(DashboardSession.created_at <= now - lifetime_us)
    )
    token = secrets.token_urlsafe(32)
    session.execute(
        insert(DashboardSession).values(token_hash=_digest(token), key_id=key_id, created_at=now)
    )
    return token


def principal_of(session: Session, token: str, *, now: int, lifetime_us: int) -> Principal | None:
    """The principal of a live session: its row exists, is younger than ``lifetime_us`` and
    its key is unrevoked; else None. Grants are not loaded: the dashboard's roles read
    every dataset.

    Args:
        session: the caller's session.
        token: the session's token, from the cookie.
        now: the time (microseconds).
        lifetime_us: a session's lifetime (microseconds).
    """
    row = session.execute(
        select(ApiKey.id, Consumer.id, Consumer.name, Consumer.role)
        .select_from(DashboardSession)
        .join(ApiKey, ApiKey.id == DashboardSession.key_id)
        .join(Consumer, Consumer.id == ApiKey.consumer_id)
        .where(
            DashboardSession.token_hash == _digest(token),
            DashboardSession.created_at > now - lifetime_us,
            ApiKey.revoked_at.is_(None),
        )
    ).first()
    if row is None:
        return None
    key_id, consumer_id, name, role = row
    return Principal(consumer_id=consumer_id, name=name, role=role, key_id=key_id)


def end(session: Session, token: str) -> None:
    """Delete the session: every copy of its cookie is signed out."""
    session.execute(delete(DashboardSession).where(DashboardSession.token_hash == _digest(token)))
