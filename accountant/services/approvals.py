"""Approvals: a change that weakens a promise waits for a second admin (DESIGN.md).

With approvals on, a PATCH that raises a lifetime, partition or population limit (any
component higher, as stated or as enforced, or a limit removed), a new admin consumer and a
new admin key become a pending ``ChangeRequest`` instead of a change; so does a service's
request for more quota, approvals on or off. Another admin approves (the change is applied
then, in the approval's transaction, and ledgered with both names and both reasons) or
denies it. A request whose target changed since it was made cannot be approved; one not
decided in time expires.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from accountant.accounting.modes import Mode
from accountant.accounting.windows import isoformat
from accountant.errors import Conflict, Forbidden, NotFound, field_error
from accountant.exact import Limit
from accountant.key_hashing import KeyHasher
from accountant.models import ChangeRequest, Consumer, Dataset, Grant
from accountant.services import (
    admin_ledger,
    api_keys,
    consumers,
    datasets,
    grants,
    ledger,
    populations,
)
from accountant.services.api_keys import Principal

#: The kinds of request, and what each changes.
KINDS = {
    "dataset_limits": "a PATCH of a dataset that raises its lifetime or partition limit",
    "population_limit": "a PATCH of a population that raises its limit",
    "admin_consumer": "a new admin consumer",
    "admin_key": "a new key of an admin consumer",
    "quota": "a service's quota on a dataset raised",
}


def raises(old: Limit | None, new: Limit | None, mode: Mode, default_delta: int | None) -> bool:
    """Whether a limit that was ``old`` is raised as ``new`` (None: no limit): a limit
    removed, or any component higher. The components ``mode`` enforces count as enforced
    (higher, or no longer bound); where it enforces another measure than the budget states
    (zcdp, rdp, gdp, advanced composition), the stated epsilon and delta count too, so that
    a change that either reading calls a raise waits (DESIGN.md: "any component
    increases"; API.md: "some enforced limit higher"): a stated epsilon that is higher, and
    a delta that is higher, an omitted one being ``default_delta`` (the dataset's)."""
    if old is None:
        return False
    if new is None:
        return True
    for name in mode.components:
        before, after = old[name], new[name]
        if before is not None and (after is None or after > before):
            return True
    if not (mode.converts or mode.advanced):
        return False
    if old.epsilon is not None and new.epsilon is not None and new.epsilon > old.epsilon:
        return True
    before = default_delta if old.delta is None else old.delta
    after = default_delta if new.delta is None else new.delta
    return before is not None and after is not None and after > before


def required_reason(body: dict[str, Any]) -> str:
    """The reason a change that needs approval states: a 400 without one."""
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise field_error(
            "reason",
            "this change needs another admin's approval: state why in reason, which the "
            "approver reads and the ledger keeps",
        )
    return reason


def ask(
    session: Session,
    *,
    kind: str,
    target: str,
    change: dict[str, Any],
    reason: str,
    caller: Principal,
    now: int,
    expiry_s: int,
) -> ChangeRequest:
    """A new pending request for ``change`` of ``target``, by ``caller``."""
    request = ChangeRequest(
        id=str(uuid.uuid4()),
        kind=kind,
        target=target,
        # exact, as text: JSON has no decimals (``change_of`` reads them back)
        change=datasets.as_text({k: v for k, v in change.items() if k != "reason"}),
        target_sha256=_digest(session, kind, target, caller.name),
        reason=reason,
        requested_by=caller.consumer_id,
        requested_by_name=caller.name,
        state="pending",
        created_at=now,
        expires_at=now + expiry_s * 1_000_000,
    )
    session.add(request)
    session.flush()
    return request


def ask_for_quota(
    session: Session, body: dict[str, Any], caller: Principal, now: int, expiry_s: int
) -> ChangeRequest:
    """A service's request for a (larger) quota on a dataset granted to it."""
    dataset = datasets.find(session, body["dataset"])
    if caller.role != "service" or grants.grant_of(session, caller.consumer_id, dataset.id) is None:
        raise Forbidden(
            f"only a service granted dataset {dataset.name!r} may ask for a quota on it; ask "
            "an admin for a grant"
        )
    return ask(
        session,
        kind="quota",
        target=dataset.name,
        change={"consumer": caller.name, "quota": body["quota"]},
        reason=required_reason(body),
        caller=caller,
        now=now,
        expiry_s=expiry_s,
    )


def change_of(request: ChangeRequest) -> dict[str, Any]:
    """The change a request asks for, its amounts exact decimals again."""
    change: dict[str, Any] = datasets.as_numbers(request.change)
    return change


def find(session: Session, request_id: str, *, lock: bool = False) -> ChangeRequest:
    statement = select(ChangeRequest).where(ChangeRequest.id == request_id)
    if lock:
        statement = statement.with_for_update()
    found = session.execute(statement).scalar_one_or_none()
    if found is None:
        raise NotFound(f"no request with id {request_id!r}; list them with GET /v1/requests")
    return found


def listed(
    session: Session,
    state: str | None,
    now: int,
    caller: Principal,
    *,
    limit: int = 1000,
    after: tuple[int, str] | None = None,
) -> tuple[list[dict[str, Any]], tuple[int, str] | None]:
    """One page of requests, newest first: every one for an admin or an auditor, its own for
    a service; only those in ``state`` if given (chosen in the statement, so that a page is
    full whenever more are left). ``after`` is the (created_at, id) of the last request of
    the page before; the second value returned is that of this page's last, None on the
    last page."""
    statement = select(ChangeRequest).order_by(
        ChangeRequest.created_at.desc(), ChangeRequest.id.desc()
    )
    if caller.role == "service":
        statement = statement.where(ChangeRequest.requested_by == caller.consumer_id)
    if state in ("pending", "expired"):  # a pending request past its expiry reads expired
        statement = statement.where(
            ChangeRequest.state == "pending",
            ChangeRequest.expires_at > now
            if state == "pending"
            else ChangeRequest.expires_at <= now,
        )
    elif state is not None:
        statement = statement.where(ChangeRequest.state == state)
    if after is not None:
        statement = statement.where(
            tuple_(ChangeRequest.created_at, ChangeRequest.id) < tuple_(*after)
        )
    found = list(session.execute(statement.limit(limit + 1)).scalars())
    last = found[limit - 1] if len(found) > limit else None
    page = [describe(r, now) for r in found[:limit]]
    return page, None if last is None else (last.created_at, last.id)


def describe(request: ChangeRequest, now: int) -> dict[str, Any]:
    """A request as the API states it."""
    return {
        "request_id": request.id,
        "state": request.state_at(now),
        "kind": request.kind,
        "target": request.target,
        "requested_by": request.requested_by_name,
        "change": change_of(request),
        "reason": request.reason,
        "created_at": isoformat(request.created_at / 1e6),
        "expires_at": isoformat(request.expires_at / 1e6),
        "decided_by": request.decided_by_name,
        "decision_reason": request.decision_reason,
        "decided_at": None if request.decided_at is None else isoformat(request.decided_at / 1e6),
    }


def decide(
    session: Session,
    request: ChangeRequest,
    *,
    approve: bool,
    reason: str,
    caller: Principal,
    now: int,
    hasher: KeyHasher,
) -> dict[str, Any]:
    """Approve (apply the change, ledgered with both names and both reasons) or deny the
    locked ``request``, by ``caller``, another admin than its requester: 403 for the
    requester, 409 for a request decided or expired, or whose target changed since it was
    made. What the change made that is shown once (a new key), for an approval."""
    if request.requested_by == caller.consumer_id:
        raise Forbidden(
            "you made this request: another admin must approve or deny it (that is the point)"
        )
    state = request.state_at(now)
    if state != "pending":
        raise Conflict(f"request {request.id!r} is {state}: only a pending request is decided")
    made: dict[str, Any] = {}
    if approve:
        now_digest = _digest(session, request.kind, request.target, request.requested_by_name)
        if now_digest != request.target_sha256:
            raise Conflict(
                f"the {request.kind.replace('_', ' ')} of {request.target!r} changed since "
                "this request was made; deny it and ask again on what stands now"
            )
        approval = {
            "request_id": request.id,
            "requested_by": request.requested_by_name,
            "approved_by": caller.name,
            "approval_reason": reason,
        }
        made = _APPLY[request.kind](session, request, approval, now, hasher)
    request.state = "approved" if approve else "denied"
    request.decided_by, request.decided_by_name = caller.consumer_id, caller.name
    request.decision_reason, request.decided_at = reason, now
    return made


def _apply_limits(
    session: Session, request: ChangeRequest, approval: dict[str, Any], now: int, hasher: KeyHasher
) -> dict[str, Any]:
    """A raised dataset or population limit: the PATCH applied as its requester asked it."""
    body = {**change_of(request), "reason": request.reason}
    requester = ledger.Actor(request.requested_by or 0, request.requested_by_name)
    if request.kind == "dataset_limits":
        dataset = datasets.find(session, request.target, lock=True)
        datasets.update_limits(session, dataset, body, requester, now, hasher, approval=approval)
    else:
        population = populations.find(session, request.target, lock=True)
        populations.update_limit(
            session, population, body, requester, now, hasher, approval=approval
        )
    return {}


def _apply_admin_consumer(
    session: Session, request: ChangeRequest, approval: dict[str, Any], now: int, hasher: KeyHasher
) -> dict[str, Any]:
    consumer, key = consumers.create_consumer(session, change_of(request), now, hasher)
    made = {"consumer": consumer.name, "key_id": consumer.keys[0].id}
    _ledger_admin(session, request, approval, made, now, hasher)
    return {**made, "api_key": key}


def _apply_admin_key(
    session: Session, request: ChangeRequest, approval: dict[str, Any], now: int, hasher: KeyHasher
) -> dict[str, Any]:
    consumer = consumers.find_consumer(session, request.target)
    row, key = api_keys.issue_key(session, consumer, now, hasher)
    made = {"consumer": consumer.name, "key_id": row.id}
    _ledger_admin(session, request, approval, made, now, hasher)
    return {**made, "api_key": key}


def _ledger_admin(
    session: Session,
    request: ChangeRequest,
    approval: dict[str, Any],
    made: dict[str, Any],
    now: int,
    hasher: KeyHasher,
) -> None:
    """An approved new admin consumer or admin key, in the admins' chain: what was made
    (never the key itself), the requester's name and reason, the approver's."""
    request.ledger_hash = admin_ledger.record(
        session,
        ledger.Actor(request.requested_by or 0, request.requested_by_name),
        {"scope": request.kind, "role": "admin", **made, "reason": request.reason, **approval},
        now=now,
        hasher=hasher,
    )


def _apply_quota(
    session: Session, request: ChangeRequest, approval: dict[str, Any], now: int, hasher: KeyHasher
) -> dict[str, Any]:
    change = change_of(request)
    requester = Principal(
        consumer_id=request.requested_by or 0,
        name=request.requested_by_name,
        role="service",
        key_id="",
    )
    grants.update_consumer(
        session,
        change["consumer"],
        {"quotas": {request.target: change["quota"]}, "reason": request.reason},
        requester,
        now,
        hasher,
        approval=approval,
    )
    return {}


_APPLY: dict[
    str, Callable[[Session, ChangeRequest, dict[str, Any], int, KeyHasher], dict[str, Any]]
] = {
    "dataset_limits": _apply_limits,
    "population_limit": _apply_limits,
    "admin_consumer": _apply_admin_consumer,
    "admin_key": _apply_admin_key,
    "quota": _apply_quota,
}


def _digest(session: Session, kind: str, target: str, requester: str) -> str:
    """What the request's target is now, digested: a request is approved only on the
    target it was made on."""
    state: Any
    if kind == "dataset_limits":
        state = datasets.find(session, target).terms_sha256
    elif kind == "population_limit":
        population = populations.find(session, target)
        state = [population.limit_epsilon, population.limit_delta, population.limit_rho]
    elif kind == "admin_consumer":  # the name still free
        state = session.execute(select(Consumer.id).where(Consumer.name == target)).scalar()
    elif kind == "admin_key":  # the same consumer, still an admin
        found = session.execute(
            select(Consumer.id, Consumer.role).where(Consumer.name == target)
        ).first()
        state = None if found is None else list(found)
    else:  # a quota: the grant's quota as it stands
        grant = session.execute(
            select(Grant.has_quota, Grant.quota_epsilon, Grant.quota_delta, Grant.quota_rho)
            .join(Consumer, Consumer.id == Grant.consumer_id)
            .join(Dataset, Dataset.id == Grant.dataset_id)
            .where(Consumer.name == requester, Dataset.name == target)
        ).first()
        state = None if grant is None else list(grant)
    text = json.dumps([kind, target, state], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
