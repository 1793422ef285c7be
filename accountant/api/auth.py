"""Bearer-key authentication and role checks."""

from __future__ import annotations

from flask import g, request

from accountant.api.common import driver, runtime
from accountant.errors import Forbidden, Unauthorized
from accountant.services.consumers import Principal, authenticate


def principal(*roles: str) -> Principal:
    """The caller, who must hold one of ``roles``: 401 without a valid key, 403 otherwise."""
    found: Principal | None = g.get("principal")
    if found is None:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("send 'Authorization: Bearer <api-key>'")
        found = authenticate(driver(), key.strip(), runtime().key_hasher)
        driver().end_read()
        if found is None:
            raise Unauthorized("unknown or revoked API key; ask an admin for a key")
        g.principal = found
    if found.role not in roles:
        raise Forbidden(f"role {found.role!r} may not do this; it needs one of {list(roles)}")
    return found
