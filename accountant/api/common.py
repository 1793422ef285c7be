"""Request plumbing shared by the blueprints: the runtime, the session, JSON bodies, clocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flask import current_app, g, request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from werkzeug.exceptions import RequestEntityTooLarge

from accountant.api import schemas
from accountant.clock import Clock
from accountant.config import Settings
from accountant.driver import Driver
from accountant.errors import InvalidRequest, field_error
from accountant.jsonio import JSONInputError, RefusedValue, loads
from accountant.key_hashing import KeyHasher
from accountant.plugins import MechanismRegistry
from accountant.services.charges import ChargeContext
from accountant.services.consumers import KnownKeys


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


def _body_bytes() -> bytes:
    """The request body, refused with a 413 when it is over the limit, declared or not."""
    if request.content_length is not None:  # werkzeug refuses a declared length over it
        return request.get_data(cache=False)
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    raw: bytes = request.input_stream.read(limit + 1)  # chunked: read one byte past it
    if len(raw) > limit:
        raise RequestEntityTooLarge()
    return raw


def json_body(schema: dict[str, Any], *, empty_ok: bool = False) -> Any:
    """The request body parsed without binary floats and validated against ``schema``."""
    raw = _body_bytes()
    if not raw.strip():
        if not empty_ok:
            raise InvalidRequest(
                "the request needs a JSON body", errors=[{"field": "", "message": "empty body"}]
            )
        raw = b"{}"
    try:
        body = loads(raw)
    except RefusedValue as error:
        raise field_error(error.field, error.message) from None
    except JSONInputError as error:
        raise InvalidRequest(str(error), errors=[{"field": "", "message": str(error)}]) from None
    schemas.validate(schema, body)
    return body


def now_us() -> int:
    """Server time in microseconds since the epoch, from the runtime's one clock."""
    return runtime().clock.now_us()
