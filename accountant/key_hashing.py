"""API keys are stored as a keyed hash, so that a leaked table is not enough to test guesses.

A key's stored hash is HMAC-SHA256, under the key-hash secret, of the key's SHA-256. Without
the secret, a copy of the ``api_keys`` table cannot be used to check a guessed key (a
human-chosen ``ACCOUNTANT_ADMIN_KEY`` above all). The secret is its own file,
``ACCOUNTANT_KEY_HASH_SECRET_FILE`` (32 random bytes in hex, created once with mode 0600,
by default next to the signing key), never derived from the noise secret or the signing
key, which have lifecycles of their own.

The database remembers the id of the secret its keys are hashed under (a keyed hash of the
secret, which reveals nothing of it), and a process with another secret refuses to start:
every key would be unknown to it. The first process to register a secret rehashes the keys
stored before keyed hashing (plain SHA-256) in the same transaction; since the stored value
was the key's SHA-256, no key needs to be known to do so.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from accountant.db import WRITE
from accountant.keyfiles import create_secret, load_secret, require_registered, secret_id
from accountant.models import ApiKey, KeyHashSecret


class KeyHashSecretMismatch(RuntimeError):
    """This host's key-hash secret is not the one the database's keys are hashed under."""


@dataclass(frozen=True)
class KeyHasher:
    """Stored hashes of API keys: HMAC-SHA256(secret, SHA-256(key)), in hex."""

    secret: bytes = field(repr=False)
    id: str
    #: HMAC-SHA256 keyed for seals (``seal``), made once and copied for each seal: every
    #: charge seals its chain head, and a copy costs half a fresh HMAC.
    _sealer: hmac.HMAC = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = hmac.new(self.secret, b"accountant seal key v1", hashlib.sha256).digest()
        object.__setattr__(self, "_sealer", hmac.new(key, digestmod=hashlib.sha256))

    def __call__(self, key: str) -> str:
        return self.of_digest(hashlib.sha256(key.encode()).digest())

    def of_digest(self, digest: bytes) -> str:
        return hmac.new(self.secret, digest, hashlib.sha256).hexdigest()

    def seal(self, content: bytes) -> str:
        """HMAC-SHA256 of ``content`` under a key derived from the secret for seals
        (``accountant.seals``), apart from the keys' hashes."""
        sealer = self._sealer.copy()  # the keyed state, never updated itself
        sealer.update(content)
        return sealer.hexdigest()


def load_or_create(path: Path, registered: str | None = None) -> KeyHasher:
    """The secret in ``path`` (hex), created once when missing, unless the database's keys
    are hashed under a secret already (``registered``, its id): then ``MissingKeyFile``."""
    require_registered(path, "key-hash secret", "ACCOUNTANT_KEY_HASH_SECRET_FILE", registered)
    create_secret(path, "key-hash secret")
    return load(path)


def registered_id(connection: Connection | Session) -> str | None:
    """The id of the secret the database's keys are hashed under, if any."""
    return connection.execute(select(KeyHashSecret.id)).scalar()


def load(path: Path) -> KeyHasher:
    """The secret in ``path`` (hex), which must exist."""
    secret = load_secret(path, "key-hash secret")
    return KeyHasher(secret, secret_id(secret, b"accountant key-hash secret id v1"))


def register(connection: Connection, hasher: KeyHasher) -> None:
    """At start: ``ensure_registered`` in a transaction of its own on ``connection``; if
    another process registers at the same moment, its secret decides."""
    connection.execution_options(**{WRITE: True})  # SQLite: BEGIN IMMEDIATE, one at a time
    try:
        with connection.begin():
            ensure_registered(connection, hasher)
    except IntegrityError:
        with connection.begin():
            _check(connection.execute(select(KeyHashSecret.id)).scalar(), hasher)


def ensure_registered(connection: Connection | Session, hasher: KeyHasher) -> None:
    """In the caller's transaction, before any key is hashed: make ``hasher``'s secret the
    database's if it has none, rehashing every key stored as plain SHA-256 (before keyed
    hashing); raise ``KeyHashSecretMismatch`` if the database has another.

    It never seals a row that exists (``accountant.seals``): on a database that holds no
    dataset and no key yet it records that seals begin now, so that each row is sealed as
    it is written, and on one that holds no dataset, that chain heads are sealed from now
    on; any other database without those records is sealed only by ``accountant seals
    init``."""
    from accountant import seals  # seals hash with this module's KeyHasher

    known, sealed_at, heads_sealed_at = connection.execute(
        select(KeyHashSecret.id, KeyHashSecret.sealed_at, KeyHashSecret.heads_sealed_at)
    ).one_or_none() or (None, None, None)
    now = time.time_ns() // 1000
    if known is None:
        connection.execute(
            insert(KeyHashSecret).values(
                {KeyHashSecret.slot: 1, KeyHashSecret.id: hasher.id, KeyHashSecret.created_at: now}
            )
        )
        for key_id, stored in connection.execute(select(ApiKey.id, ApiKey.key_hash)).all():
            connection.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id)
                .values(key_hash=hasher.of_digest(bytes.fromhex(stored)))
            )
    else:
        _check(known, hasher)
    if sealed_at is None and seals.holds_nothing(connection):
        connection.execute(update(KeyHashSecret).values(sealed_at=now))
    if heads_sealed_at is None and seals.holds_no_chain(connection):
        connection.execute(update(KeyHashSecret).values(heads_sealed_at=now))


def foreign(connection: Connection | Session, hasher: KeyHasher) -> str | None:
    """Why ``hasher``'s secret is not the database's, or None if it is (or the database
    has none yet)."""
    known = registered_id(connection)
    return None if known in (None, hasher.id) else _mismatch(known, hasher)


def _check(known: str | None, hasher: KeyHasher) -> None:
    if known != hasher.id:
        raise KeyHashSecretMismatch(_mismatch(known, hasher))


def _mismatch(known: str | None, hasher: KeyHasher) -> str:
    return (
        f"this host's key-hash secret (id {hasher.id}) is not the one this database's API "
        f"keys are hashed under (id {known}); set ACCOUNTANT_KEY_HASH_SECRET_FILE to the file "
        "that holds it, or copy that file from a host that serves this database"
    )
