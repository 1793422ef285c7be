"""The service's errors: a small hierarchy, each rendered as RFC 9457 problem+json in one place."""

from __future__ import annotations

from typing import Any

PROBLEM_BASE = "https://accountant.invalid/problems/"


class ProblemError(Exception):
    """An error with an HTTP status, a stable ``type`` slug and a detail saying what to do."""

    status = 400
    slug = "bad-request"
    title = "Bad request"

    def __init__(self, detail: str, *, errors: list[dict[str, str]] | None = None,
                 extra: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": PROBLEM_BASE + self.slug, "title": self.title,
                                "status": self.status, "detail": self.detail}
        if self.errors is not None:
            body["errors"] = self.errors
        body.update(self.extra)
        return body


class ValidationProblem(ProblemError):
    slug, title = "validation", "Invalid request"


class Unauthorized(ProblemError):
    status, slug, title = 401, "unauthorized", "Missing or unknown API key"


class Forbidden(ProblemError):
    status, slug, title = 403, "forbidden", "Not allowed"


class NotFound(ProblemError):
    status, slug, title = 404, "not-found", "Not found"


class Conflict(ProblemError):
    status, slug, title = 409, "conflict", "Conflict"


class BudgetExhausted(ProblemError):
    status, slug, title = 409, "budget-exhausted", "Privacy budget exhausted"


class WindowExhausted(ProblemError):
    status, slug, title = 429, "window-exhausted", "Window budget exhausted until the window resets"


class IdempotencyKeyReused(ProblemError):
    status, slug, title = 422, "idempotency-key-reused", "Idempotency key reused with another body"


class ReplayUnavailable(ProblemError):
    status, slug, title = 409, "replay-unavailable", "The first response cannot be given again"


class MechanismFailed(ProblemError):
    status, slug, title = 500, "mechanism-failed", "The mechanism failed; nothing was charged"


class PayloadTooLarge(ProblemError):
    status, slug, title = 413, "payload-too-large", "Request body too large"


class Unavailable(ProblemError):
    status, slug, title = 503, "unavailable", "Database unavailable"


def field_error(field: str, message: str) -> ValidationProblem:
    """A 400 naming one field."""
    return ValidationProblem(f"{field}: {message}", errors=[{"field": field, "message": message}])
