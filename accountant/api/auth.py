"""Bearer-key authentication and role checks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from flask import g, request
from sqlalchemy.exc import OperationalError

from accountant.errors import Forbidden, RateLimited, Unauthorized, Unavailable
from accountant.services.api_keys import UNKNOWN_KEY, Principal, authenticate
from accountant.web import driver, runtime


def principal(*roles: str, remembered: bool = False) -> Principal:
    """The caller, who must hold one of ``roles``: 401 without a valid key, 403 otherwise.

    ``remembered``: a principal this process authenticated before stands in for the read
    of the key (``KnownKeys``). Only for a view whose transaction reads the key again under
    its lock, and whose work runs in ``confirmed_on_failure``, so that a key revoked since
    gets a 401 whatever else went wrong."""
    found: Principal | None = g.get("principal")
    if found is None:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("send 'Authorization: Bearer <api-key>'")
        key_hash = runtime().key_hasher(key.strip())
        known = runtime().known_keys
        found = known.get(key_hash) if remembered else None
        g.unconfirmed = None  # the hash of a remembered key, until it is read again
        if found is not None and found.role in roles:
            g.unconfirmed = key_hash
        else:
            found = _authenticated(key_hash)
            if remembered:
                known.remember(key_hash, found)
        _within_rate(found)
        g.principal = found
    if found.role not in roles:
        raise Forbidden(f"role {found.role!r} may not do this; it needs one of {list(roles)}")
    return found


@contextmanager
def confirmed_on_failure() -> Iterator[None]:
    """Around the work of a view that took a remembered principal (see ``principal``): when
    it fails, read the key again, and answer 401 instead if it is revoked. Not when the
    database failed: that is a 503 whatever the key, and another read would wait too."""
    try:
        yield
    except (OperationalError, Unavailable):
        raise
    except Exception:
        key_hash, g.unconfirmed = g.unconfirmed, None
        if key_hash is not None:
            known = runtime().known_keys
            known.forget(key_hash)
            known.remember(key_hash, _authenticated(key_hash))
        raise


def confirm() -> None:
    """Read the key of a remembered principal (``principal``) again now: a 401 if it was
    revoked since. For a view that answers without the transaction that would read it."""
    key_hash, g.unconfirmed = g.get("unconfirmed"), None
    if key_hash is not None:
        known = runtime().known_keys
        known.forget(key_hash)
        known.remember(key_hash, _authenticated(key_hash))


def _within_rate(found: Principal) -> None:
    """A 429 with scope ``rate`` when the caller's key is past the configured rate."""
    limiter = runtime().rate_limiter
    if limiter is None or (seconds := limiter.wait(found.key_id)) is None:
        return
    raise RateLimited(
        f"this key sent more than {limiter.per_second} requests a second to this worker; "
        f"retry in {seconds} s, or spread the requests out",
        extra={"scope": "rate", "limit": limiter.per_second},
        retry_after=seconds,
    )


def _authenticated(key_hash: str) -> Principal:
    found = authenticate(driver(), key_hash)
    driver().end_read()
    if found is None:
        raise Unauthorized(UNKNOWN_KEY)
    return found
