"""The service's domain errors: what went wrong, with the facts, and what to do next.

They know nothing of HTTP. ``accountant.problems`` is the one place that maps
each to a status and an RFC 9457 problem+json document.
"""

from __future__ import annotations

from typing import Any


class AccountantError(Exception):
    """An error the caller can act on: ``detail`` says what to do next."""

    def __init__(
        self,
        detail: str,
        *,
        errors: list[dict[str, str]] | None = None,
        extra: dict[str, Any] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors  # field errors, for an invalid request
        self.extra = extra or {}  # facts stated in the problem document
        self.retry_after = retry_after  # seconds after which a retry may succeed


class InvalidRequest(AccountantError):
    """The request is malformed or names values the service refuses."""


class Unauthorized(AccountantError):
    """No API key, or an unknown one."""


class Forbidden(AccountantError):
    """The caller's role or grants do not allow this."""


class NotFound(AccountantError):
    """What the request names does not exist."""


class Conflict(AccountantError):
    """The request conflicts with the current state."""


class BudgetExhausted(AccountantError):
    """A charge would take a scope over its limit. The facts are in ``extra``: ``scope``,
    ``limit``, ``spent``, ``requested``, ``charge_id`` and, for a partition, ``partition``."""


class WindowExhausted(BudgetExhausted):
    """A charge would take the current window over its limit; it fits again at
    ``extra["resets_at"]``, ``retry_after`` seconds from now."""


class RateLimited(AccountantError):
    """The caller's key sent more requests than the configured rate; ``retry_after``
    seconds from now it may send again."""


class IdempotencyKeyReused(AccountantError):
    """An idempotency key came back with another request body."""


class ReplayUnavailable(AccountantError):
    """The first response to a request cannot be given again exactly."""


class MechanismFailed(AccountantError):
    """A mechanism failed to run; nothing was charged."""


class Unavailable(AccountantError):
    """The database does not answer in time."""


def field_error(field: str, message: str) -> InvalidRequest:
    """An invalid request naming one field."""
    return InvalidRequest(f"{field}: {message}", errors=[{"field": field, "message": message}])
