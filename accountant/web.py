"""What the views of the API and of the dashboard run on: the application's runtime, the
request's database session and connection, its clock, and its unit of work."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flask import current_app, g
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from accountant.clock import Clock
from accountant.config import Settings
from accountant.db import begin_write
from accountant.driver import Driver
from accountant.key_hashing import KeyHasher
from accountant.plugins import MechanismRegistry
from accountant.rate_limit import RateLimiter
from accountant.services.api_keys import KnownKeys
from accountant.services.charges import ChargeContext


@dataclass(frozen=True)
class Runtime:
    """What one application instance holds: settings, database, mechanisms, keys, clock."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    registry: MechanismRegistry
    head_revision: str
    signer: Ed25519PrivateKey
    clock: Clock
    charging: ChargeContext
    key_hasher: KeyHasher
    known_keys: KnownKeys  # principals the charge path need not read again (``KnownKeys``)
    rate_limiter: RateLimiter | None = None  # ACCOUNTANT_RATE_LIMIT, per key (None: no limit)


def runtime() -> Runtime:
    value: Runtime = current_app.extensions["accountant"]
    return value


def db() -> Session:
    """The request's session, opened lazily and closed at teardown."""
    if "db" not in g:
        _release_driver()  # one pooled connection per request at a time
        g.db = runtime().sessions()
    session: Session = g.db
    return session


@contextmanager
def unit_of_work() -> Iterator[Session]:
    """The request's session in a write transaction of its own, for a view that changes
    the database: what the block writes is committed as the block ends, or rolled back if
    it raises, so the view renders its answer after the commit. The request's reads before
    it end first: on SQLite a read transaction cannot safely become a write one. A block
    that finds nothing to keep rolls back itself (``session.rollback()``); the commit at
    its end then has nothing to send. The charge has its own transaction
    (``services.charges.submit``)."""
    session = db()
    session.rollback()
    begin_write(session)
    try:
        yield session
    except BaseException:
        session.rollback()
        raise
    session.commit()


def driver() -> Driver:
    """The request's own connection, for the statements of the hot path (``accountant.driver``):
    checked out lazily, once per request, and given back at teardown."""
    if "driver" not in g:
        g.driver = Driver.checkout(runtime().engine)
    found: Driver = g.driver
    return found


def _release_driver() -> None:
    found = g.pop("driver", None)
    if found is not None:
        found.close()


def close_db(_error: BaseException | None = None) -> None:
    _release_driver()
    session = g.pop("db", None)
    if session is not None:
        session.close()


def now_us() -> int:
    """Server time in microseconds since the epoch, from the runtime's one clock."""
    return runtime().clock.now_us()
