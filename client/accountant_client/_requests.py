"""Approvals (API.md, DESIGN.md): changes that wait for a second admin. ``ChangeRequest`` as
the service states one, the ``PendingApproval`` a change raises when it became one, and the
request bodies, shared by ``Client`` and ``AsyncClient``.

With ``ACCOUNTANT_APPROVALS=on`` a change that weakens a promise (a dataset's lifetime or
partition limit raised, a population's limit raised, a new admin consumer, a new admin key)
is not made: the service keeps it as a pending request, which an admin other than the
requester approves (the change is made then) or denies. A service asks for a larger quota
the same way, approvals on or off."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from accountant_client._holds import _plain


@dataclass(frozen=True)
class IssuedKey:
    """What an approved ``admin_consumer`` or ``admin_key`` request made: the ``consumer``,
    its new ``api_key`` (shown this once, to the approver: hand it to the requester) and the
    key's ``key_id`` (to revoke it: ``DELETE /v1/keys/{key_id}``)."""

    consumer: str
    api_key: str = field(repr=False)  # a secret: kept out of logs that print the request
    key_id: str


@dataclass(frozen=True)
class ChangeRequest:
    """A change waiting for (or given) a second admin's decision, as the service states it.

    ``kind`` is ``dataset_limits``, ``population_limit``, ``admin_consumer``, ``admin_key``
    or ``quota``; ``target`` the dataset, population or consumer it changes (for a quota,
    the dataset); ``change`` the body it will apply (a PATCH's, a new consumer's, or
    ``{"consumer", "quota"}``) without its reason. ``state`` is ``pending``, ``approved``,
    ``denied`` or ``expired`` as of when it was read; ``decided_by``, ``decision_reason`` and
    ``decided_at`` are None until it is decided. ``result`` is the new key an approval made
    (``admin_consumer``, ``admin_key``), only in ``approve``'s answer; else None. ``raw``:
    the answer as sent."""

    request_id: str
    state: str
    kind: str
    target: str
    requested_by: str
    change: dict[str, Any]
    reason: str
    created_at: str
    expires_at: str
    decided_by: str | None
    decision_reason: str | None
    decided_at: str | None
    result: IssuedKey | None
    raw: dict[str, Any] = field(repr=False)  # may hold ``result``'s key


class PendingApproval(Exception):
    """A change the service did not make: it answered 202 with a pending request
    (``ACCOUNTANT_APPROVALS=on``), which another admin approves (and the change is made
    then) or denies. ``request`` is that ``ChangeRequest``, ``request_id`` its id.

    Raised by ``update_dataset`` and ``update_population`` for a raise,
    ``create_consumer`` for an admin and ``create_key`` for an admin's key, rather than
    returned: those calls answer the dataset, population, consumer or key as the change
    left it, and nothing changed. It is not an ``AccountantError``: the service refused
    nothing, and an ``except AccountantError`` written for refusals does not swallow it."""

    def __init__(self, request: ChangeRequest) -> None:
        self.request = request
        super().__init__(
            f"the {request.kind.replace('_', ' ')} change of {request.target!r} waits for "
            f"another admin's approval (request {request.request_id}, pending until "
            f"{request.expires_at}); nothing changed yet"
        )

    @property
    def request_id(self) -> str:
        return self.request.request_id


def _request_of(answer: Mapping[str, Any]) -> ChangeRequest:
    made = answer.get("result")
    return ChangeRequest(
        request_id=answer["request_id"],
        state=answer["state"],
        kind=answer["kind"],
        target=answer["target"],
        requested_by=answer["requested_by"],
        change=dict(answer.get("change") or {}),
        reason=answer["reason"],
        created_at=answer["created_at"],
        expires_at=answer["expires_at"],
        decided_by=answer.get("decided_by"),
        decision_reason=answer.get("decision_reason"),
        decided_at=answer.get("decided_at"),
        result=None if not made else IssuedKey(made["consumer"], made["api_key"], made["key_id"]),
        raw=dict(answer),
    )


def _quota_body(dataset: str, quota: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """``POST /v1/requests``'s body: a quota (Decimal figures as JSON numbers) and why."""
    return {"kind": "quota", "dataset": dataset, "quota": _plain(quota), "reason": reason}


def _requests_query(state: str | None) -> dict[str, str]:
    return {} if state is None else {"state": state}
