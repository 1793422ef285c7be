"""The errors the client raises: one per problem type of API.md, with the denial's facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx


class AccountantError(Exception):
    """A problem+json answer (RFC 9457), or no answer at all (``Unavailable``)."""

    def __init__(self, problem: Mapping[str, Any], status: int = 0) -> None:
        self.problem = dict(problem)
        self.status = int(self.problem.get("status", status) or status)
        self.type = str(self.problem.get("type", ""))
        self.detail = str(self.problem.get("detail", self.problem.get("title", "")))
        super().__init__(f"{self.status} {self.detail}" if self.status else self.detail)


class InvalidRequest(AccountantError):
    """400 (or 413, 422): the request is wrong; ``errors`` lists each field at fault."""

    @property
    def errors(self) -> list[dict[str, str]]:
        return list(self.problem.get("errors", []))


class Unauthorized(AccountantError):
    """401: no API key, or an unknown or revoked one."""


class Forbidden(AccountantError):
    """403: the key's role or grants do not allow this (or, approving or denying a change
    request, the key is the requester's: another admin decides it)."""


class NotFound(AccountantError):
    """404: the dataset, consumer or charge does not exist."""


class Conflict(AccountantError):
    """409 other than a denial: a replay that cannot be given again, a settle or release
    of a hold that is already settled or has expired (a hold is settled once, while open),
    or a decision on a change request already decided or expired, or whose target changed
    since it was made."""


class Denied(AccountantError):
    """A charge refused by a budget (and ledgered as denied)."""

    @property
    def scope(self) -> str:
        return str(self.problem.get("scope", ""))

    @property
    def partition(self) -> str | None:
        return self.problem.get("partition")

    @property
    def population(self) -> str | None:
        """The population whose limit refused it (``scope`` ``population``), else None."""
        return self.problem.get("population")

    @property
    def limit(self) -> dict[str, Decimal]:
        return _amount(self.problem.get("limit"))

    @property
    def spent(self) -> dict[str, Decimal]:
        return _amount(self.problem.get("spent"))

    @property
    def requested(self) -> dict[str, Decimal]:
        return _amount(self.problem.get("requested"))


class BudgetExhausted(Denied):
    """409: the lifetime, a partition's, the consumer's or a population's budget would be
    exceeded (for a population, ``population`` names it)."""


class HoldExhausted(BudgetExhausted):
    """409 on a draw (a charge on a hold): more than the hold's remainder (``limit`` is its
    amount, ``spent`` what charges drew, ``requested`` the draw), or a hold already settled
    or expired (``detail`` says which), on which nothing more can be drawn."""


class WindowExhausted(Denied):
    """429: a window budget is spent until ``resets_at`` (``retry_after`` seconds)."""

    @property
    def resets_at(self) -> str:
        return str(self.problem.get("resets_at", ""))

    retry_after: float | None = None


@dataclass(frozen=True)
class BatchDenial:
    """One scope a refused batch would take over its limit: the first ``item`` (its index
    in the batch) that takes it over, its ``dataset``, its ``scope`` (``dataset``,
    ``partition``, ``consumer``, ``window``, ...) and, for a partition, its ``partition``;
    the scope's ``limit``, what it had ``spent`` before the batch and what the whole batch
    ``requested`` of it (every item on it, not only the first one over); ``resets_at`` for a
    window; ``population`` for a population's scope."""

    item: int
    dataset: str
    scope: str
    partition: str | None
    limit: dict[str, Decimal]
    spent: dict[str, Decimal]
    requested: dict[str, Decimal]
    resets_at: str | None = None
    population: str | None = None


class BatchDenied(Denied):
    """A batch refused as a whole: nothing in it was charged or run. ``denials`` lists
    **every** scope it would take over its limit, on every dataset it names, so that the
    plan can be fixed in one go; ``batch_id`` names the refusal in the ledger. ``scope``,
    ``partition``, ``population``, ``limit``, ``spent`` and ``requested`` are the first
    denial's. Raised as ``BatchRefused`` (409) or ``BatchWindowRefused`` (429); catch this
    class for both."""

    @property
    def batch_id(self) -> str:
        return str(self.problem.get("batch_id", ""))

    @property
    def denials(self) -> list[BatchDenial]:
        return [_denial_of(denial) for denial in self.problem.get("denials", [])]

    @property
    def scope(self) -> str:
        first = self._first
        return first.scope if first else super().scope

    @property
    def partition(self) -> str | None:
        first = self._first
        return first.partition if first else super().partition

    @property
    def population(self) -> str | None:
        first = self._first
        return first.population if first else super().population

    @property
    def limit(self) -> dict[str, Decimal]:
        first = self._first
        return first.limit if first else super().limit

    @property
    def spent(self) -> dict[str, Decimal]:
        first = self._first
        return first.spent if first else super().spent

    @property
    def requested(self) -> dict[str, Decimal]:
        first = self._first
        return first.requested if first else super().requested

    @property
    def _first(self) -> BatchDenial | None:
        denials = self.denials
        return denials[0] if denials else None


class BatchRefused(BatchDenied, BudgetExhausted):
    """409: a batch refused because it would take a lifetime, partition, quota or
    population budget over its limit (or a window by more than its whole limit, which no
    wait would help); an ``except BudgetExhausted`` catches it too."""


class BatchWindowRefused(BatchDenied, WindowExhausted):
    """429: a batch refused only because windows are spent; it fits again after
    ``retry_after`` seconds (the latest of its windows' ``resets_at``). An ``except
    WindowExhausted`` catches it too."""

    @property
    def resets_at(self) -> str:
        ends = [d.resets_at for d in self.denials if d.resets_at]
        return max(ends) if ends else super().resets_at  # ISO 8601 in UTC: sorts as text


class Unavailable(AccountantError):
    """The service did not answer within the deadline (connection errors, 503s)."""


class ReceiptInvalid(AccountantError):
    """A receipt whose signature, key or output hash does not check out."""


def _amount(value: Any) -> dict[str, Decimal]:
    return {
        k: Decimal(str(v)) for k, v in (value or {}).items() if isinstance(v, int | float | Decimal)
    }


def _denial_of(denial: Mapping[str, Any]) -> BatchDenial:
    return BatchDenial(
        item=int(denial["item"]),
        dataset=str(denial["dataset"]),
        scope=str(denial["scope"]),
        partition=denial.get("partition"),
        limit=_amount(denial.get("limit")),
        spent=_amount(denial.get("spent")),
        requested=_amount(denial.get("requested")),
        resets_at=denial.get("resets_at"),
        population=denial.get("population"),
    )


_BY_STATUS: dict[int, type[AccountantError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    422: InvalidRequest,
    503: Unavailable,
}


def _error(response: httpx.Response) -> AccountantError:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    problem.setdefault("status", response.status_code)
    problem.setdefault("detail", response.reason_phrase)
    kind: type[AccountantError] = _BY_STATUS.get(response.status_code, AccountantError)
    slug = str(problem.get("type", "")).rsplit("/", 1)[-1]
    if slug == "budget-exhausted":
        kind = HoldExhausted if problem.get("scope") == "hold" else BudgetExhausted
    elif slug == "window-exhausted" or problem.get("scope") == "window":
        kind = WindowExhausted
    if "denials" in problem and kind in (BudgetExhausted, WindowExhausted):  # a batch's
        kind = BatchRefused if kind is BudgetExhausted else BatchWindowRefused
    error = kind(problem, response.status_code)
    if isinstance(error, WindowExhausted):
        error.retry_after = _retry_after(response)
    return error


def _retryable(problem: AccountantError) -> bool:
    if isinstance(problem, Unavailable):
        return True
    if problem.status == 429:
        return not isinstance(problem, WindowExhausted)  # a rate limit, not a denial
    return problem.status == 409 and problem.type.endswith("/idempotency-in-progress")


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After", "")
    return float(raw) if raw.isascii() and raw.isdigit() else None
