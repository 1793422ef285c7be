"""The noise secret: what makes a charge's noise unpredictable, and a replay's noise identical.

Every charge draws its random words from SHAKE-256 keyed by this secret and
the charge id (``randomness.KeyedRandomSource``), so a retried request
regenerates exactly the noise of the first answer and the database never
holds noise. That only holds while the secret stays the same, so:

- it is its own secret, in ``ACCOUNTANT_NOISE_SECRET_FILE`` (32 random bytes,
  created once with mode 0600), never derived from the receipt-signing key,
  which operators rotate;
- its public id (a keyed hash of the secret, which reveals nothing of it) is
  recorded with every granted charge, and a replay whose charge was made
  under another secret is refused rather than answered with new noise;
- the database remembers the id of the secret it is served with, and a host
  with another secret refuses to start: two hosts with different secrets
  would each answer replays of the other's charges with a refusal.

Losing the file loses reproducibility, not privacy: ``accountant noise-secret
adopt`` makes a new secret the database's own, and replays of older charges
are then refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from accountant.keyfiles import create_secret, load_secret, require_registered, secret_id
from accountant.models import Base
from accountant.randomness import KeyedRandomSource, RandomSource

_TABLE = Base.metadata.tables["noise_secrets"]


class NoiseSecretMismatch(RuntimeError):
    """This host's noise secret is not the one the database is served with."""


@dataclass(frozen=True)
class NoiseSecret:
    """The secret and its public id."""

    secret: bytes = field(repr=False)
    id: str

    def source_for(self, charge_id: str) -> RandomSource:
        """The random words of one charge: the same for every replay of it."""
        return KeyedRandomSource(self.secret, charge_id)


def from_bytes(secret: bytes) -> NoiseSecret:
    if len(secret) < 32:
        raise ValueError("a noise secret needs at least 32 bytes")
    return NoiseSecret(secret, secret_id(secret, b"accountant noise secret id v1"))


def load_or_create(path: Path, registered: str | None = None) -> NoiseSecret:
    """The secret in ``path`` (hex), created once when missing, unless the database is
    served with a secret already (``registered``, its id): then ``MissingKeyFile``."""
    require_registered(path, "noise secret", "ACCOUNTANT_NOISE_SECRET_FILE", registered)
    create_secret(path, "noise secret")
    return load(path)


def registered_id(connection: Connection) -> str | None:
    """The id of the secret the database is served with, if any."""
    return connection.execute(select(_TABLE.c.id).where(_TABLE.c.current)).scalar()


def load(path: Path) -> NoiseSecret:
    """The secret in ``path`` (hex), which must exist."""
    return from_bytes(load_secret(path, "noise secret"))


def register(connection: Connection, noise: NoiseSecret) -> None:
    """Make ``noise`` the database's secret if it has none; raise ``NoiseSecretMismatch`` if it
    has another. Commits its own work on ``connection``."""
    try:
        with connection.begin():
            connection.execute(
                _TABLE.insert().values(id=noise.id, current=True, created_at=time.time_ns() // 1000)
            )
    except IntegrityError:
        pass  # a secret is registered already (this one, or another host's)
    with connection.begin():
        known = registered_id(connection)
    if known != noise.id:
        raise NoiseSecretMismatch(
            f"this host's noise secret (id {noise.id}) is not the one this database is served "
            f"with (id {known}); set ACCOUNTANT_NOISE_SECRET_FILE to the file that holds it, or "
            "copy that file from a host that serves this database (docs/operations.md, "
            "'The three secrets')"
        )


def adopt(connection: Connection, noise: NoiseSecret) -> str | None:
    """Retire the database's current secret and make ``noise`` current; the retired id."""
    now = time.time_ns() // 1000
    with connection.begin():
        old = connection.execute(select(_TABLE.c.id).where(_TABLE.c.current)).scalar()
        if old == noise.id:
            return None
        connection.execute(
            update(_TABLE).where(_TABLE.c.current).values(current=None, retired_at=now)
        )
        known = connection.execute(select(_TABLE.c.id).where(_TABLE.c.id == noise.id)).scalar()
        if known is None:
            connection.execute(_TABLE.insert().values(id=noise.id, current=True, created_at=now))
        else:
            connection.execute(
                update(_TABLE).where(_TABLE.c.id == noise.id).values(current=True, retired_at=None)
            )
    return old
