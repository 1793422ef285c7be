"""Dashboard sign-in: an API key of role auditor or admin, kept as a signed HttpOnly cookie.

The cookie holds only a random session token (Flask's session, signed with a
secret derived from the receipt-signing key); the session itself is a row in
the database (``services.dashboard_sessions``). Every page reads that row and
its key, so signing out ends every copy of the cookie and a revoked key signs
its sessions out at once. Forms carry a CSRF token bound to the session.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from flask import Flask, Request, abort, current_app, redirect, request, session, url_for
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface

from accountant.driver import Driver
from accountant.services import dashboard_sessions
from accountant.services.api_keys import Principal, authenticate
from accountant.web import db, now_us, runtime, unit_of_work

F = TypeVar("F", bound=Callable[..., Any])
ROLES = ("admin", "auditor")


class CookieSessions(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, opened only for requests that carry the cookie: an
    API call has none, and building the cookie's signer for it would be wasted."""

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        if self.get_cookie_name(app) not in request.cookies:
            return self.session_class()  # what Flask's own gives a request without one
        return super().open_session(app, request)

    def get_cookie_secure(self, app: Flask) -> bool:
        """ACCOUNTANT_COOKIE_SECURE: "auto" marks the cookie Secure when the request came
        over HTTPS, directly or through a proxy that says so in X-Forwarded-Proto."""
        setting = runtime().settings.cookie_secure
        if setting != "auto":
            return setting == "true"
        return request.is_secure or request.headers.get("X-Forwarded-Proto", "") == "https"


def _lifetime_us() -> int:
    return int(current_app.permanent_session_lifetime.total_seconds() * 1_000_000)


def current() -> Principal | None:
    """The signed-in principal, or None: also when the session was signed out (from this
    copy of the cookie or another), has outlived its lifetime, or its key was revoked."""
    token = session.get("token")
    if not isinstance(token, str):
        return None
    found = dashboard_sessions.principal_of(db(), token, now=now_us(), lifetime_us=_lifetime_us())
    if found is None or found.role not in ROLES:
        session.clear()
        return None
    return found


def sign_in(key: str) -> tuple[Principal | None, str | None]:
    """(principal, None) on success, else (None, the reason to show)."""
    principal = authenticate(Driver.of(db()), runtime().key_hasher(key.strip()))
    if principal is None:
        return None, "Unknown or revoked API key."
    if principal.role not in ROLES:
        return None, "Only auditor and admin keys can sign in to the dashboard."
    with unit_of_work() as writing:
        token = dashboard_sessions.start(
            writing, principal.key_id, now=now_us(), lifetime_us=_lifetime_us()
        )
    session.clear()
    session["token"] = token
    session["csrf"] = secrets.token_urlsafe(24)
    return principal, None


def sign_out() -> None:
    """End the session in the database, then clear the cookie."""
    token = session.get("token")
    if isinstance(token, str):
        with unit_of_work() as writing:
            dashboard_sessions.end(writing, token)
    session.clear()


def csrf_token() -> str:
    token = session.get("csrf")
    if not isinstance(token, str):
        token = session["csrf"] = secrets.token_urlsafe(24)
    return token


def check_csrf() -> None:
    sent = request.form.get("csrf", "")
    expected = session.get("csrf")
    if not isinstance(expected, str) or not sent or not hmac.compare_digest(sent, expected):
        abort(400, "the form expired or did not come from this site; reload the page")


def signed_in(view: F) -> F:
    """Redirect to the sign-in page unless an auditor or admin is signed in."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        who = current()
        if who is None:
            return redirect(url_for("dashboard.sign_in_page", next=request.path), code=303)
        return view(who, *args, **kwargs)

    return cast(F, wrapper)
