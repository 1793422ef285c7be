"""API keys: issued at random and shown once, stored as a keyed hash and looked up by it
(``authenticate``), remembered for the charge path (``KnownKeys``), and revoked; a key is
rotated by issuing its successor, then revoking it."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from accountant import seals
from accountant.accounting.decide import may_charge, may_read
from accountant.driver import Driver
from accountant.errors import Conflict, NotFound
from accountant.key_hashing import KeyHasher, ensure_registered
from accountant.models import ApiKey, Consumer, Grant
from accountant.statements import statement

KEY_PREFIX = "pba_"


@dataclass(frozen=True, kw_only=True)
class Principal:
    """The authenticated caller of one request.

    Args:
        consumer_id: its consumer's id.
        name: its consumer's name.
        role: its consumer's role (``admin``, ``service`` or ``auditor``).
        key_id: the id of the API key it authenticated with.
        granted: the ids of the datasets granted to it.
    """

    consumer_id: int
    name: str
    role: str
    key_id: str
    granted: frozenset[int] = field(default_factory=frozenset)

    def may_read(self, dataset_id: int) -> bool:
        return may_read(self.role, dataset_id in self.granted)

    def may_charge(self, dataset_id: int) -> bool:
        return may_charge(self.role, dataset_id in self.granted)


#: What a caller with an unknown or revoked key is told.
UNKNOWN_KEY = "unknown or revoked API key; ask an admin for a key"


def authenticate(driver: Driver, key_hash: str) -> Principal | None:
    """The principal of the unrevoked key whose stored hash is ``key_hash`` (the key's, by
    ``KeyHasher``), or None. The lookup is by hash, never by the key.

    One driver statement and no ORM objects: this runs on every request.
    """
    rows = driver.rows(_AUTHENTICATE, {"hash": key_hash})
    if not rows:
        return None
    first = rows[0]
    granted = frozenset(row.dataset_id for row in rows if row.dataset_id is not None)
    return Principal(
        consumer_id=first.consumer_id,
        name=first.name,
        role=first.role,
        key_id=first.key_id,
        granted=granted,
    )


class KnownKeys:
    """Principals this process has authenticated, by their key's hash, for the charge path:
    a charge reads its key, its consumer's role and its grant again under its dataset's
    lock (``charge_reads``), so a principal found here never stands for more than the
    request's own transaction checks. Grants are not kept, since a charge never uses them.
    Bounded: emptied when full."""

    def __init__(self, size: int = 4096) -> None:
        self._found: dict[str, Principal] = {}
        self._size = size

    def get(self, key_hash: str) -> Principal | None:
        return self._found.get(key_hash)

    def remember(self, key_hash: str, principal: Principal) -> None:
        if len(self._found) >= self._size:
            self._found.clear()
        self._found[key_hash] = replace(principal, granted=frozenset())

    def forget(self, key_hash: str) -> None:
        self._found.pop(key_hash, None)


_AUTHENTICATE = statement(
    select(
        ApiKey.id.label("key_id"),
        Consumer.id.label("consumer_id"),
        Consumer.name,
        Consumer.role,
        Grant.dataset_id,
    )
    .join(Consumer, Consumer.id == ApiKey.consumer_id)
    .outerjoin(Grant, Grant.consumer_id == Consumer.id)
    .where(ApiKey.key_hash == bindparam("hash"), ApiKey.revoked_at.is_(None))
)


def issue_key(
    session: Session,
    consumer: Consumer,
    now: int,
    hasher: KeyHasher,
    key: str | None = None,
    *,
    new: bool = False,
) -> tuple[ApiKey, str]:
    """A new key for ``consumer`` (``new``: created in this transaction, so not sealed
    yet); the plaintext is returned once and never stored. Refused (``Conflict``) for a
    consumer whose seal does not hold."""
    ensure_registered(session, hasher)  # before the first keyed hash this database holds
    if not new and not seals.consumer_holds(session, hasher, consumer.id):
        raise Conflict(seals.refusal(f"consumer {consumer.name!r}"))
    plaintext = key if key is not None else KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(
        id=secrets.token_hex(8),
        consumer_id=consumer.id,
        key_hash=hasher(plaintext),
        prefix=display_prefix(plaintext),
        created_at=now,
    )
    session.add(row)
    session.flush()
    seals.seal_consumer(session, hasher, consumer.id)
    return row, plaintext


def display_prefix(plaintext: str) -> str:
    """What a key listing shows of a key: the fixed marker of generated keys, never a
    character of the secret (the key's random id tells keys apart)."""
    return KEY_PREFIX if plaintext.startswith(KEY_PREFIX) else ""


def revoke_key(session: Session, key_id: str, now: int, hasher: KeyHasher) -> None:
    """Revoke a key at once. Its consumer is resealed only if its seal held: a key revoked
    from a consumer edited in the database is revoked, and the edit still shows."""
    row = session.get(ApiKey, key_id)
    if row is None or row.revoked_at is not None:
        raise NotFound(f"no active key with id {key_id!r}; list keys with GET /v1/consumers")
    holds = seals.consumer_holds(session, hasher, row.consumer_id)
    row.revoked_at = now
    session.flush()
    if holds:  # a key revoked from edited rows is revoked; their seal stays broken
        seals.seal_consumer(session, hasher, row.consumer_id)
