"""The requests page: changes waiting for a second admin, and an admin's decision on one
(DESIGN.md, "Approvals"; docs/dashboard.md, "Requests").

Admins and auditors read every request, as ``GET /v1/requests`` lets them; only an admin
other than the requester decides one, through ``approvals.decide`` in one write
transaction, exactly as ``POST /v1/requests/{id}/approve`` and ``/deny`` do. A decision is
a CSRF-protected form; its outcome is a one-time message on the page it redirects to.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from flask import Blueprint, flash, get_flashed_messages, redirect, request, url_for

from accountant.dashboard.pages import limits, page, when
from accountant.dashboard.session import check_csrf, signed_in
from accountant.errors import AccountantError, Forbidden, InvalidRequest, NotFound
from accountant.services import approvals, consumers, datasets, grants, populations
from accountant.services.api_keys import Principal
from accountant.web import db, now_us, runtime, unit_of_work

#: How many decided and expired requests the page shows, the latest first.
DECIDED_SHOWN = 50

#: Each kind of request, as the page names it.
KINDS = {
    "dataset_limits": "dataset limits raised",
    "population_limit": "population limit raised",
    "admin_consumer": "new admin",
    "admin_key": "new admin key",
    "quota": "quota raised",
}

#: A request id as the service makes them (a UUID): anything else names no request.
_REQUEST_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: The longest reason the requests table keeps (as ``REQUEST_DECISION`` of the API).
_REASON_MAX = 1000
#: A dataset PATCH's fields, as the page names the limits they set.
_SCOPES = {"budget": "lifetime limit", "partition_budget": "partition limit", "windows": "windows"}


def register(bp: Blueprint) -> None:
    """Serve the requests page and its decisions on the dashboard's blueprint."""
    bp.add_url_rule("/requests", "requests", requests_page, methods=["GET"])
    bp.add_url_rule("/requests/<request_id>/decide", "decide", decide, methods=["POST"])


@signed_in
def requests_page(who: Principal) -> Any:
    return _render(who)


@signed_in
def decide(who: Principal, request_id: str) -> Any:
    """Approve or deny one request (``decision`` of the form), with its ``reason``. The
    outcome is shown once on the requests page, after a redirect (POST-redirect-GET), so a
    reload decides nothing twice; except when an approval made an API key: the key is on
    the answer to this POST itself, the only time it is shown, and never in the cookie
    (signed, not encrypted) or anywhere else."""
    check_csrf()
    decision = request.form.get("decision", "")
    verb = {"approve": "approved", "deny": "denied"}.get(decision, "decided")
    try:
        reason = _reason_of(who, decision, request_id)
        with unit_of_work() as session:
            found = approvals.find(session, request_id, lock=True)
            made = approvals.decide(
                session,
                found,
                approve=decision == "approve",
                reason=reason,
                caller=who,
                now=now_us(),
                hasher=runtime().key_hasher,
            )
            decided = approvals.describe(found, now_us())
    except AccountantError as problem:
        flash(f"Not {verb}: {_sentence(problem.detail)}", "error")
        return redirect(url_for("dashboard.requests"), code=303)
    what = f"{decided['requested_by']}'s request to {_subject(decided)}"
    if decision == "deny":
        flash(f"Denied: {what}. Nothing changed.", "ok")
        return redirect(url_for("dashboard.requests"), code=303)
    message = f"Approved: {what}. The change is applied."
    if "api_key" in made:
        new_key = {**made, "requested_by": decided["requested_by"]}
        return _render(who, message=("ok", message), new_key=new_key)
    flash(message, "ok")
    return redirect(url_for("dashboard.requests"), code=303)


def _reason_of(who: Principal, decision: str, request_id: str) -> str:
    """The form's reason, once the form is one an admin may send: an auditor is refused
    (403 in the API), a decision other than approve or deny and a missing or too long
    reason are invalid (400), an id that is no request's is not found."""
    if who.role != "admin":
        raise Forbidden(
            f"only an admin approves or denies a request; you are signed in as {who.role}"
        )
    if decision not in ("approve", "deny"):
        raise InvalidRequest("choose Approve or Deny")
    reason = request.form.get("reason", "")
    if not reason.strip():
        raise InvalidRequest(
            "a reason is required: the requester reads it, and the ledger keeps an "
            "approval's reason with the change"
        )
    if len(reason) > _REASON_MAX:
        raise InvalidRequest(
            f"a reason is at most {_REASON_MAX} characters, this one {len(reason)}; shorten it"
        )
    if not _REQUEST_ID.fullmatch(request_id):
        raise NotFound("there is no such request; reload the page")
    return reason


def _sentence(detail: str) -> str:
    """A service's message as the page's sentence: it ends with a full stop."""
    return detail if detail.endswith((".", "?", "!")) else detail + "."


def _render(
    who: Principal,
    *,
    message: tuple[str, str] | None = None,
    new_key: dict[str, Any] | None = None,
) -> Any:
    """The requests page: pending requests first, the soonest to expire first, then the
    latest decided or expired ones; the one-time messages of the session's last decision,
    or ``message`` and ``new_key`` when answering an approval that made a key."""
    now = now_us()
    pending = sorted(_every_pending(now, who), key=lambda r: _moment(r["expires_at"]))
    latest, _ = approvals.listed(db(), None, now, who)
    settled = sorted(
        (r for r in latest if r["state"] != "pending"),
        key=lambda r: _moment(r["decided_at"] or r["expires_at"]),
        reverse=True,
    )
    messages = get_flashed_messages(with_categories=True)
    if message is not None:
        messages = [*messages, message]
    return page(
        "requests.html",
        who,
        messages=messages,
        new_key=new_key,
        approvals_on=runtime().settings.approvals == "on",
        pending=[_row(r, who, pending=True) for r in pending],
        settled=[_row(r, who, pending=False) for r in settled[:DECIDED_SHOWN]],
        settled_count=len(settled),
        settled_shown=DECIDED_SHOWN,
    )


def _every_pending(now: int, who: Principal) -> Iterator[dict[str, Any]]:
    """Every pending request, however many newer ones were decided since."""
    after = None
    while True:
        found, after = approvals.listed(db(), "pending", now, who, after=after)
        yield from found
        if after is None:
            return


def _moment(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def _row(found: dict[str, Any], who: Principal, *, pending: bool) -> dict[str, Any]:
    """A request as the page shows it: what it changes in words (for a pending one, from
    what stands now), and whether ``who`` may decide it (an admin, not its requester)."""
    kind, target = found["kind"], found["target"]
    mine = found["requested_by"] == who.name  # consumer names are unique
    return {
        **found,
        "id": found["request_id"],
        "short": found["request_id"][:8],
        "kind_name": KINDS.get(kind, kind),
        "link": _link(kind, target),
        "for": found["change"].get("consumer", "") if kind == "quota" else "",
        "what": _what(kind, target, found["change"], against_now=pending),
        "created_at": when(found["created_at"]),
        "expires_at": when(found["expires_at"]),
        "decided_at": when(found["decided_at"]) if found["decided_at"] else "",
        "mine": mine,
        "may_decide": pending and who.role == "admin" and not mine,
    }


def _link(kind: str, target: str) -> str | None:
    if kind in ("dataset_limits", "quota"):
        return url_for("dashboard.dataset", name=target)
    if kind == "population_limit":
        return url_for("dashboard.population", name=target)
    return None


def _subject(found: dict[str, Any]) -> str:
    """What a request asks, after "request to"."""
    kind, target = found["kind"], found["target"]
    if kind == "dataset_limits":
        return f"raise the limits of dataset “{target}”"
    if kind == "population_limit":
        return f"raise the limit of population “{target}”"
    if kind == "admin_consumer":
        return f"make a new admin “{target}”"
    if kind == "admin_key":
        return f"issue a new key to the admin “{target}”"
    if kind == "quota":
        return f"raise the quota of “{found['change'].get('consumer', '')}” on “{target}”"
    return f"change {target}"


def _what(kind: str, target: str, change: dict[str, Any], *, against_now: bool) -> list[str]:
    """The change a request asks for, one line a scope: each limit as it would be, after
    the limit as it stands now when ``against_now`` (a pending request: what the approver
    weighs) and the target still exists."""
    if kind == "dataset_limits":
        now = _dataset_now(target) if against_now else None
        return [
            _line(_SCOPES.get(field, field), value, now, field) for field, value in change.items()
        ]
    if kind == "population_limit":
        now = _population_now(target) if against_now else None
        return [_line("population limit", change.get("budget"), now, "budget")]
    if kind == "quota":
        consumer = str(change.get("consumer", ""))
        now = _quota_now(consumer, target) if against_now else None
        return [_line(f"quota of {consumer}", change.get("quota"), now, "quota")]
    if kind == "admin_consumer":
        lines = [f"a new consumer “{target}” of role admin"]
        if change.get("datasets"):
            lines.append("granted " + ", ".join(change["datasets"]))
        for dataset, quota in (change.get("quotas") or {}).items():
            lines.append(f"quota on {dataset}: {limits(quota)}")
        return lines
    if kind == "admin_key":
        return [f"a new API key for the admin “{target}”"]
    return [limits(change)]


def _line(scope: str, new: Any, now: dict[str, Any] | None, field: str) -> str:
    after = "none (the limit removed)" if new is None else limits(new)
    if now is None or field not in now:
        return f"{scope}: to {after}"
    return f"{scope}: {limits(now[field])} → {after}"


def _dataset_now(name: str) -> dict[str, Any] | None:
    try:
        return datasets.describe(datasets.find(db(), name))
    except NotFound:
        return None


def _population_now(name: str) -> dict[str, Any] | None:
    try:
        found = populations.find(db(), name)
    except NotFound:
        return None
    return {"budget": datasets.describe_limit(found.limit, found.mode)}


def _quota_now(consumer: str, dataset: str) -> dict[str, Any] | None:
    try:
        owner = consumers.find_consumer(db(), consumer)
        found = datasets.find(db(), dataset)
    except NotFound:
        return None
    grant = grants.grant_of(db(), owner.id, found.id)
    if grant is None:
        return None
    quota = grant.quota
    return {"quota": None if quota is None else datasets.describe_limit(quota, found.mode)}
