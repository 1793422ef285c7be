"""The one mapping from domain errors (``accountant.errors``) to RFC 9457 problem+json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flask import Response

from accountant import errors
from accountant.jsonio import dumps

PROBLEM_BASE = "https://accountant.invalid/problems/"

#: status, type slug and title of each domain error (API.md fixes them).
KINDS: dict[type[errors.AccountantError], tuple[int, str, str]] = {
    errors.InvalidRequest: (400, "validation", "Invalid request"),
    errors.Unauthorized: (401, "unauthorized", "Missing or unknown API key"),
    errors.Forbidden: (403, "forbidden", "Not allowed"),
    errors.NotFound: (404, "not-found", "Not found"),
    errors.Conflict: (409, "conflict", "Conflict"),
    errors.BudgetExhausted: (409, "budget-exhausted", "Privacy budget exhausted"),
    errors.WindowExhausted: (
        429,
        "window-exhausted",
        "Window budget exhausted until the window resets",
    ),
    errors.RateLimited: (429, "rate-limited", "Too many requests"),
    errors.IdempotencyKeyReused: (
        422,
        "idempotency-key-reused",
        "Idempotency key reused with another body",
    ),
    errors.ReplayUnavailable: (
        409,
        "replay-unavailable",
        "The first response cannot be given again",
    ),
    errors.MechanismFailed: (500, "mechanism-failed", "The mechanism failed; nothing was charged"),
    errors.Unavailable: (503, "unavailable", "Database unavailable"),
}


@dataclass(frozen=True)
class Problem:
    """A problem+json response: status, document and headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    errors: list[dict[str, str]] | None = None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Problem:
    body: dict[str, Any] = {
        "type": PROBLEM_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    body.update(extra or {})
    return Problem(status, body, headers or {})


def of(error: errors.AccountantError) -> Problem:
    """The problem document of a domain error."""
    kind = next(KINDS[cls] for cls in type(error).__mro__ if cls in KINDS)
    headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
    if isinstance(error, errors.Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return problem(*kind, error.detail, errors=error.errors, extra=error.extra, headers=headers)


def response(problem: Problem) -> Response:
    """The HTTP response of a problem document."""
    response = Response(
        dumps(problem.body), status=problem.status, mimetype="application/problem+json"
    )
    for name, value in problem.headers.items():
        response.headers[name] = value
    return response
