"""/v1/requests: changes waiting for a second admin's approval (DESIGN.md, "Approvals")."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, request

from accountant.api import schemas
from accountant.api.auth import principal
from accountant.api.common import int_arg, json_body
from accountant.errors import NotFound, field_error
from accountant.models import ChangeRequest
from accountant.services import approvals
from accountant.services.api_keys import Principal
from accountant.web import db, now_us, runtime, unit_of_work

bp = Blueprint("requests", __name__)

STATES = ("pending", "approved", "denied", "expired")


def on() -> bool:
    """Whether this deployment requires approvals (``ACCOUNTANT_APPROVALS=on``)."""
    return runtime().settings.approvals == "on"


def pending(
    *, kind: str, target: str, change: dict[str, Any], caller: Principal
) -> tuple[dict[str, Any], int]:
    """Keep ``change`` as a pending request instead of applying it: the 202 answer. Its
    reason is required (a 400 without)."""
    reason = approvals.required_reason(change)
    with unit_of_work() as session:
        made = approvals.ask(
            session,
            kind=kind,
            target=target,
            change=change,
            reason=reason,
            caller=caller,
            now=now_us(),
            expiry_s=runtime().settings.approval_expiry_s,
        )
        view = approvals.describe(made, now_us())
    return view, 202


@bp.post("/v1/requests")
def create() -> Any:
    """A service asks for a quota (any time: quotas are allocation limits an admin sets)."""
    caller = principal("service")
    body = json_body(schemas.REQUEST_CREATE)
    with unit_of_work() as session:
        made = approvals.ask_for_quota(
            session, body, caller, now_us(), runtime().settings.approval_expiry_s
        )
        view = approvals.describe(made, now_us())
    return view, 202


@bp.get("/v1/requests")
def list_requests() -> Any:
    caller = principal("admin", "auditor", "service")
    state = request.args.get("state")
    if state is not None and state not in STATES:
        raise field_error("state", f"must be one of {', '.join(STATES)}")
    limit = int_arg("limit", 1000, 1, 1000)
    after = _cursor(request.args.get("cursor"))
    found, last = approvals.listed(db(), state, now_us(), caller, limit=limit, after=after)
    return {"requests": found, "next_cursor": None if last is None else f"{last[0]}_{last[1]}"}


def _cursor(raw: str | None) -> tuple[int, str] | None:
    """The (created_at, id) a ``next_cursor`` names: ``<microseconds>_<request id>``."""
    if raw is None:
        return None
    created_at, _, request_id = raw.partition("_")
    stamped = created_at.isascii() and created_at.isdigit() and len(created_at) <= 18
    if not stamped or not 0 < len(request_id) <= 36:
        raise field_error("cursor", "must be a next_cursor of an earlier page, as given")
    return int(created_at), request_id


@bp.get("/v1/requests/<request_id>")
def show(request_id: str) -> Any:
    caller = principal("admin", "auditor", "service")
    found = approvals.find(db(), request_id)
    if caller.role == "service" and found.requested_by != caller.consumer_id:
        # a service sees only its own: as if there were no other
        raise NotFound(f"no request with id {request_id!r}; list yours with GET /v1/requests")
    return approvals.describe(found, now_us())


@bp.post("/v1/requests/<request_id>/approve")
def approve(request_id: str) -> Any:
    return _decide(request_id, approve=True)


@bp.post("/v1/requests/<request_id>/deny")
def deny(request_id: str) -> Any:
    return _decide(request_id, approve=False)


def _decide(request_id: str, *, approve: bool) -> Any:
    caller = principal("admin")
    body = json_body(schemas.REQUEST_DECISION)
    reason = approvals.required_reason(body)
    with unit_of_work() as session:
        found: ChangeRequest = approvals.find(session, request_id, lock=True)
        made = approvals.decide(
            session,
            found,
            approve=approve,
            reason=reason,
            caller=caller,
            now=now_us(),
            hasher=runtime().key_hasher,
        )
        view = approvals.describe(found, now_us())
    return {**view, **({"result": made} if made else {})}
