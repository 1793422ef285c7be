"""Dashboard pages. Every figure comes from the same services as the API, aggregated in SQL."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, redirect, request, url_for
from flask.blueprints import BlueprintSetupState

from accountant.accounting.windows import isoformat
from accountant.dashboard import charts
from accountant.dashboard import requests as change_requests
from accountant.dashboard.pages import figure as _figure
from accountant.dashboard.pages import limits as _limits
from accountant.dashboard.pages import name as _name
from accountant.dashboard.pages import page as _page
from accountant.dashboard.pages import when as _when
from accountant.dashboard.session import check_csrf, sign_in, sign_out, signed_in
from accountant.db import begin_snapshot
from accountant.errors import AccountantError, NotFound, field_error
from accountant.exact import COMPONENTS, Component, ComponentName
from accountant.ledger_export import parse_filter, stream_export
from accountant.models import Dataset, Population
from accountant.services import dashboard_reads, datasets, populations
from accountant.services.api_keys import Principal
from accountant.services.dashboard_reads import DAY_US
from accountant.services.verification import verify
from accountant.web import db, runtime

bp = Blueprint(
    "dashboard",
    __name__,
    url_prefix="/dashboard",
    template_folder=str(Path(__file__).parent / "templates"),
    static_folder=str(Path(__file__).parent / "static"),
)
change_requests.register(bp)  # /dashboard/requests: approvals (accountant/dashboard/requests.py)


#: The dashboard runs no script and loads nothing from another host; no page may be framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@bp.after_request
def _security_headers(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _measure(dataset: Dataset) -> str:
    """The field of the dataset's amounts that adds up and that its limits bind (epsilon,
    rho, rdp or mu2): every bar, percentage and chart of its pages is in it. On gdp that is
    mu^2, not mu: a bar at half of mu^2 means half the budget is spent, at half of mu only
    a quarter (docs/dashboard.md)."""
    return dataset.mode.measure


def _column(dataset: Dataset) -> ComponentName:
    """The stored component that holds the dataset's measure: rho holds rho, the Renyi
    divergence at the order on rdp datasets, and mu^2 on gdp ones."""
    return "rho" if dataset.mode.converts or dataset.mode.advanced else "epsilon"


def _figures(amount: dict[str, Any], limit: dict[str, Any] | None = None) -> str:
    """An amount in words: its figures that add up (those ``limit`` binds, if given) and,
    where epsilon does not add, the epsilon of that loss or limit beside them, never one to
    add or subtract."""
    names = [n for n in (limit or amount)["additive"] if n in amount]
    text = ", ".join(f"{_name(n)} {_figure(amount[n])}" for n in names)
    if "epsilon_alone" in amount:
        text += f" (ε {_figure(amount['epsilon_alone'])})"
    return text


def _state(scope: dict[str, Any]) -> str:
    """ "exhausted" exactly when the scope is at its limit (``checks.at_limit``, as the API
    reports it), "warn" from 80% of it."""
    if scope["exhausted"]:
        return "exhausted"
    return "warn" if scope["used_pct"] >= 80 else "ok"


def _pct(loss: float, limit: float) -> float:
    return round(100 * loss / limit, 1) if limit > 0 else (100.0 if loss > 0 else 0.0)


@bp.get("/sign-in")
def sign_in_page() -> Any:
    return _page("sign_in.html", None, error=None, next=request.args.get("next", ""))


@bp.post("/sign-in")
def sign_in_submit() -> Any:
    check_csrf()
    who, error = sign_in(request.form.get("api_key", ""))
    if who is None:
        status = 403 if error and "auditor" in error else 401
        return _page("sign_in.html", None, error=error, next=request.form.get("next", "")), status
    target = request.form.get("next", "")
    if not _PLAIN_DASHBOARD_PATH.fullmatch(target) or ".." in target:
        target = url_for("dashboard.overview")  # never another site, never a header break
    return redirect(target, code=303)


#: A path under /dashboard of unreserved characters, with an optional plain query.
_PLAIN_DASHBOARD_PATH = re.compile(r"/dashboard(/[A-Za-z0-9._~/-]*)?(\?[A-Za-z0-9._~=&%+-]*)?")


@bp.post("/sign-out", endpoint="sign_out")
@signed_in
def sign_out_submit(who: Principal) -> Any:
    check_csrf()
    sign_out()
    return redirect(url_for("dashboard.sign_in_page"), code=303)


def _used(loss: dict[str, Any], limit: dict[str, Any]) -> float:
    """The largest share of a limit used, in percent, over the figures it binds: those that
    add up (a share of a figure that does not add, mu or a converted epsilon, is no share of
    the budget). A limit of 0 in a figure every charge costs something in (any but delta)
    admits nothing: 100%, as ``checks.at_limit`` has it."""
    shares = [
        100.0
        if float(limit[name]) == 0 and name != "delta"
        else _pct(float(loss.get(name, 0)), float(limit[name]))
        for name in limit["additive"]
    ]
    return max(shares, default=0.0)


def _scopes(
    dataset: Dataset, report: dict[str, Any], population: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every scope that bounds or allocates the dataset's loss, with its use: the lifetime
    limit, its population's limit (``population``: the population's budget report), the
    partition limit (with the partitions at it), each window and each quota."""
    scopes = [
        {
            "scope": "lifetime",
            "kind": "privacy bound",
            "used_pct": _used(report["loss"], report["limit"]),
            "loss": report["loss"],
            "limit": report["limit"],
            "exhausted": report["at_limit"],
        }
    ]
    if population is not None:  # a charge here is granted only within it too (DESIGN.md)
        scopes.append(
            {
                "scope": f"population {population['population']}",
                "population": population["population"],
                "kind": "privacy bound, shared",
                "used_pct": _used(population["loss"], population["limit"]),
                "loss": population["loss"],
                "limit": population["limit"],
                "exhausted": population["at_limit"],
            }
        )
    if "partition_limit" in report:
        full = dashboard_reads.partitions_at_limit(db(), dataset)
        scopes.append(
            {
                "scope": "partition",
                "kind": "privacy bound",
                "used_pct": _used(report["partitions"]["max_spent"], report["partition_limit"]),
                "loss": report["partitions"]["max_spent"],
                "limit": report["partition_limit"],
                "exhausted": report["partitions"]["at_limit"],
                "at_limit": full,
            }
        )
    for window in report["windows"]:
        scopes.append(
            {
                "scope": f"window {window['period']}",
                "period": window["period"],
                "kind": "allocation",
                "used_pct": _used(window["loss"], window["limit"]),
                "loss": window["loss"],
                "limit": window["limit"],
                "exhausted": window["at_limit"],
                "resets_at": _when(window["end"]),
            }
        )
    for consumer, use in dashboard_reads.quotas(db(), dataset):
        scopes.append(
            {
                "scope": f"quota of {consumer}",
                "kind": "allocation",
                "used_pct": _used(use["loss"], use["quota"]),
                "loss": use["loss"],
                "limit": use["quota"],
                "exhausted": use["at_limit"],
            }
        )
    for scope in scopes:
        scope["state"] = _state(scope)
        scope["used"] = _figures(scope["loss"], scope["limit"])
        scope["of"] = _figures(scope["limit"])
    return scopes


def _marks(scopes: list[dict[str, Any]]) -> list[dict[str, str]]:
    """What the overview flags: each scope at or above 80%, and partitions at their limit."""
    marks = []
    for scope in scopes:
        if scope.get("at_limit"):
            count = len(scope["at_limit"])
            marks.append(
                {
                    "state": "exhausted",
                    "text": f"{count}{'+' if count >= 20 else ''} "
                    f"partition{'s' if count > 1 else ''} at limit",
                }
            )
        elif scope["state"] != "ok":
            marks.append(
                {
                    "state": scope["state"],
                    "text": f"{scope['scope']} at "
                    f"{scope['used_pct']:g}%: "
                    + ("exhausted" if scope["state"] == "exhausted" else "above 80%"),
                }
            )
    return marks


@bp.get("")
@bp.get("/")
@signed_in
def overview(who: Principal) -> Any:
    rows = []
    now = runtime().clock.now_us() / 1e6
    groups = {p.id: p for p in populations.all_populations(db())}
    shared = {key: populations.budget_report(db(), p) for key, p in groups.items()}
    for dataset in datasets.all_datasets(db()):
        report = datasets.budget_report(db(), dataset, now)
        measure = _measure(dataset)
        population = None if dataset.population_id is None else shared[dataset.population_id]
        scopes = _scopes(dataset, report, population)
        windows = [
            {
                "period": s["period"],
                "loss": _figure(s["loss"].get(measure, Decimal(0))),
                "limit": _figure(s["limit"].get(measure, Decimal(0))),
                "used_pct": s["used_pct"],
            }
            for s in scopes
            if "period" in s
        ]
        marks = _marks(scopes)
        held = _split(report, measure)[0] if _holding(report["held"]) else None
        rows.append(
            {
                "name": dataset.name,
                "population": None if population is None else population["population"],
                "unit": dataset.privacy_unit,
                "accounting": dataset.accounting,
                "loss": _figure(report["loss"][measure]),
                "limit": _figure(report["limit"][measure]),
                "measure": _name(measure),
                # what open holds charged, part of that loss: only while one is open
                "held": None if held is None else _figure(held),
                # the epsilon of the loss and of the limit, where epsilon is not the measure
                "epsilon": None
                if "epsilon_alone" not in report["loss"]
                else (_figure(report["loss"]["epsilon"]), _figure(report["limit"]["epsilon"])),
                "used_pct": scopes[0]["used_pct"],
                "windows": windows,
                "marks": marks,
                "state": max((s["state"] for s in scopes), key=_STATES.index),
            }
        )
    return _page(
        "overview.html",
        who,
        rows=rows,
        populations=[_population_row(groups[key], shared[key]) for key in groups],
    )


def _population_row(population: Population, report: dict[str, Any]) -> dict[str, Any]:
    """A population's status, as the overview lists it: its loss (the sum of its datasets'
    lifetime losses), limit and what remains in its measure, the epsilon of the loss and of
    the limit beside them where epsilon is not the measure, whether it is at its limit, and
    how many datasets it has."""
    measure = population.mode.measure
    used = _used(report["loss"], report["limit"])
    state = "exhausted" if report["at_limit"] else "warn" if used >= 80 else "ok"
    return {
        "name": population.name,
        "accounting": population.accounting,
        "loss": _figure(report["loss"][measure]),
        "limit": _figure(report["limit"][measure]),
        "remaining": _figure(report["remaining"][measure]),
        "measure": _name(measure),
        "epsilon": None
        if "epsilon_alone" not in report["loss"]
        else (_figure(report["loss"]["epsilon"]), _figure(report["limit"]["epsilon"])),
        "used_pct": used,
        "at_limit": report["at_limit"],
        "members": len(report["datasets"]),
        "state": state,
    }


_STATES = ["ok", "warn", "exhausted"]


def _holding(held: dict[str, Any]) -> bool:
    """Whether open holds charged anything: a figure of ``held`` that adds up is above 0."""
    return any(held[name] > 0 for name in held["additive"])


def _split(report: dict[str, Any], measure: str) -> tuple[Decimal, Decimal]:
    """The lifetime loss in the measure as (held, spent): what open holds add to it, and
    the loss without them (the report's ``spent``: what releases spent, an expired hold's
    amount among them, since expiry never refunds). The loss is not a sum over charges (a
    max, the k largest, a min), so held is the loss less spent, not what the holds charged:
    a hold on a partition that does not set the loss adds nothing to it
    (docs/dashboard.md)."""
    spent: Decimal = report["spent"][measure]
    return report["loss"][measure] - spent, spent


def _hold(hold: dict[str, Any]) -> dict[str, Any]:
    """A hold as a row of a dataset page: its id's first 8 characters, its partitions (the
    first 3 named), its amount per release and (times its multiplicity) what it charged,
    what charges drew from it, its state and, once settled, what its job used and what went
    back; every amount in the dataset's measure."""
    partitions = hold["partitions"]
    shown = ", ".join(partitions[:3])
    if len(partitions) > 3:
        shown += f" and {len(partitions) - 3} more"
    amount = _figure(_measured(hold["amount"]))
    if hold["multiplicity"] > 1:
        amount += f" × {hold['multiplicity']} = {_figure(_measured(hold['charged']))}"
    settled = ""
    if hold["state"] == "settled":
        settled = (
            f"on {_when(hold['settled_at'])}: used {_figure(_measured(hold['used']))}, "
            f"returned {_figure(_measured(hold['returned']))}"
        )
    return {
        "id": hold["hold_id"],
        "short": _short(hold["hold_id"]),
        "consumer": hold["consumer"] or "",
        "partitions": shown,
        "all_partitions": ", ".join(partitions),
        "amount": amount,
        "drawn": _figure(_measured(hold["drawn"])),
        "state": hold["state"],
        "settled": settled,
        "expires_at": _when(hold["expires_at"]),
        "purpose": hold["purpose"] or "",
        "mechanism": hold["mechanism"] or "",
    }


def _short(hold_id: str | None) -> str:
    """A hold's id as the pages show it: its first 8 characters (the full id in a title)."""
    return (hold_id or "")[:8]


@bp.get("/datasets/<name>")
@signed_in
def dataset(who: Principal, name: str) -> Any:
    try:
        found = datasets.find(db(), name)
    except NotFound:
        return _page("not_found.html", who, what=f"There is no dataset named “{name}”."), 404
    now_us = runtime().clock.now_us()
    report = datasets.budget_report(db(), found, now_us / 1e6)
    measure = _measure(found)
    column = _column(found)
    unit = COMPONENTS[column]
    seen = dashboard_reads.activity(db(), found, column, by_key=request.args.get("sort") == "key")
    first_day = now_us // DAY_US - 29
    daily_map = {
        bucket: float(unit.to_decimal(total)) for bucket, total in seen.charged_per_day.items()
    }
    daily = [
        (isoformat((first_day + i) * 86_400)[:10], daily_map.get(first_day + i, 0.0))
        for i in range(30)
    ]
    # the measure alone: the epsilon conversion of each point would cost a search each
    history = [
        (at / 1e6, float(found.mode.in_measure(amount)))
        for at, amount in dashboard_reads.loss_history(db(), found, now_us)
    ]
    population = dashboard_reads.population_of(db(), found)
    shared = None if population is None else populations.budget_report(db(), population)
    scopes = _scopes(found, report, shared)
    whole = sum(total for _, total in seen.consumer_totals) or 1
    used = scopes[0]["used_pct"]
    held, spent = _split(report, measure)
    holds = [_hold(hold) for hold in dashboard_reads.dataset_holds(db(), found, now_us)]
    return _page(
        "dataset.html",
        who,
        name=name,
        description=found.description,
        report=report,
        population=None
        if shared is None
        else {
            "name": shared["population"],
            "loss": _figure(shared["loss"][measure]),
            "limit": _figure(shared["limit"][measure]),
        },
        measure=_name(measure),
        loss=_figure(report["loss"][measure]),
        limit=_figure(report["limit"][measure]),
        held=_figure(held),
        spent=_figure(spent),
        holds=holds,
        holds_shown=dashboard_reads.HOLDS,
        used_pct=used,
        state=scopes[0]["state"],
        scopes=scopes,
        converts=found.mode.converts or found.mode.advanced,
        delta=report["loss"].get("delta") if found.mode.converts else None,
        loss_chart=charts.loss_over_time(
            history,
            _limit_steps(
                found.created_at,
                report["limit_history"],
                "dataset",
                measure,
                float(report["limit"][measure]),
            ),
            found.created_at / 1e6,
            now_us / 1e6,
            _name(measure),
        ),
        daily=charts.bars(daily, f"charged {_name(measure)} per day (cost × multiplicity)"),
        partitions=[
            {"key": key, "spent": _units(unit, value)} for key, value in seen.top_partitions
        ],
        consumers=[
            {"name": consumer, "total": _units(unit, total), "share": round(100 * total / whole, 1)}
            for consumer, total in seen.consumer_totals
        ],
        recent=[_row(entry) for entry in seen.recent],
        changes=[_row(entry) for entry in dashboard_reads.limit_changes(db(), found)],
    )


@bp.get("/populations/<name>", endpoint="population")
@signed_in
def population_page(who: Principal, name: str) -> Any:
    """A population's page, for auditors and admins as GET /v1/populations is (a service
    cannot sign in: a population sums datasets it may not be granted)."""
    try:
        found = populations.find(db(), name)
    except NotFound:
        return _page("not_found.html", who, what=f"There is no population named “{name}”."), 404
    now_us = runtime().clock.now_us()
    report = populations.budget_report(db(), found)
    mode = found.mode
    measure = mode.measure
    loss, limit = report["loss"], report["limit"]
    history = [
        (at / 1e6, float(mode.in_measure(amount)))
        for at, amount in dashboard_reads.population_loss_history(db(), found, now_us)
    ]
    used = _used(loss, limit)
    return _page(
        "population.html",
        who,
        name=name,
        report=report,
        identity=populations.IDENTITY[0].upper() + populations.IDENTITY[1:] + ".",
        measure=_name(measure),
        loss=_figure(loss[measure]),
        limit=_figure(limit[measure]),
        remaining=_figure(report["remaining"][measure]),
        used_pct=used,
        state="exhausted" if report["at_limit"] else "warn" if used >= 80 else "ok",
        converts=mode.converts,
        delta=loss.get("delta") if mode.converts else None,
        members=_shares(report, measure),
        loss_chart=charts.loss_over_time(
            history,
            _limit_steps(
                found.created_at,
                report["limit_history"],
                "population",
                measure,
                float(limit[measure]),
            ),
            found.created_at / 1e6,
            now_us / 1e6,
            _name(measure),
        ),
        changes=[_row(e) for e in dashboard_reads.population_limit_changes(db(), found)],
    )


def _shares(report: dict[str, Any], measure: str) -> list[dict[str, Any]]:
    """Each member dataset's lifetime loss in the measure (and its epsilon beside it, where
    epsilon is not the measure), as a share of the population's loss (the sum of them all)
    and of its limit, by name."""
    whole, limit = report["loss"][measure], report["limit"][measure]
    return [
        {
            "name": member,
            "loss": _figure(loss[measure]),
            "epsilon": _figure(loss["epsilon"]) if "epsilon_alone" in loss else None,
            "of_loss": _pct(float(loss[measure]), float(whole)) if whole > 0 else 0.0,
            "of_limit": _pct(float(loss[measure]), float(limit)),
        }
        for member, loss in sorted(report["datasets"].items())
    ]


def _limit_steps(
    created_us: int, history: list[dict[str, Any]], scope: str, measure: str, limit: float
) -> list[tuple[float, float]]:
    """A lifetime limit's history (``limit_history`` of a budget report, its changes of
    ``scope``: a dataset's or a population's) as (seconds, limit) steps, from the creation
    at ``created_us``: the first change's old limit (or today's, if it never changed), then
    each new one. A population's creation is ledgered as a change with no old limit: it is
    not a step. A change records a gdp limit as mu: its square is the measure."""
    stated, power = ("mu", 2) if measure == "mu2" else (measure, 1)
    changes = [
        c
        for c in history
        if c["scope"] == scope
        and isinstance(c["old"], dict)
        and stated in c["old"]
        and isinstance(c["new"], dict)
        and stated in c["new"]
    ]
    first = float(changes[0]["old"][stated]) ** power if changes else limit
    steps = [(created_us / 1e6, first)]
    steps += [(_seconds(c["at"]), float(c["new"][stated]) ** power) for c in changes]
    return steps


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _units(unit: Component, value: int) -> str:
    return _figure(unit.to_decimal(value))


def _shown(value: Any) -> Any:
    """What ``{{ ... }}`` prints: every decimal or float in ``_figure``'s format."""
    if isinstance(value, Decimal | float):
        return _figure(value)
    return value


@bp.record_once
def _print_numbers_alike(state: BlueprintSetupState) -> None:
    state.app.jinja_env.finalize = _shown


def _row(entry: dict[str, Any]) -> dict[str, Any]:
    """A ledger entry as a table row: a charge's cost, what it added to the running total and
    the lifetime loss after it, each in the dataset's measure (``measure``: epsilon, rho, rdp
    or mu²), its outcome and, for a denial, the scope that denied it; a limit change's old
    and new limits and who changed them, never a grant of cost 0."""
    detail = entry["detail"] or {}
    loss_after = "" if entry["loss_after"] is None else _figure(_measured(entry["loss_after"]))
    if entry["kind"] in ("limit_change", "admin_change"):
        scope = detail.get("scope", "")
        if scope == "consumer":
            scope = f"quota of {detail.get('consumer', '')}"
        change = f"{scope}: {_limits(detail.get('old'))} → {_limits(detail.get('new'))}"
        if scope == "population" and detail.get("old") is None:  # its chain's first entry
            change = f"population created with the limit {_limits(detail.get('new'))}"
        if scope == "seals":  # accountant seals init: what it vouched for as it stood
            what = " and ".join(detail.get("sealed", ["terms"]))
            change = f"{what} sealed as they stood, by {detail.get('sealed_by', '')}"
        if entry["kind"] == "admin_change":  # the admins' chain: an approved new admin
            made = "admin" if scope == "admin_consumer" else "key of admin"
            change = f"new {made} {detail.get('consumer', '')} (key {detail.get('key_id', '')})"
        what = entry["kind"].replace("_", " ")
        return {
            **entry,
            "created_at": _when(entry["created_at"]),
            "cost": change,
            "measure": "",
            "charged": "",
            "multiplicity": "",
            "loss_after": loss_after,
            "denied_by": "",
            "outcome": what,
            "badge": "change",
            "reason": entry["reason"],
            # a change that waited for a second admin (DESIGN.md, "Approvals") names both
            "approval": f"approved by {detail['approved_by']}: {detail.get('approval_reason')}"
            if detail.get("approved_by")
            else "",
            "what": what,
            "hold": "",
            "note": "",
        }
    denied_by = ""
    if entry["status"] == "denied":
        denied_by = str(detail.get("scope", ""))
        if detail.get("partition") is not None:
            denied_by += (
                f" {detail['partition']}"
                if denied_by == "partition"
                else f" (partition {detail['partition']})"
            )
        if detail.get("period"):
            denied_by += f" ({detail['period']})"
    return {
        **entry,
        "created_at": _when(entry["created_at"]),
        "cost": _figure(_measured(entry["cost"])),
        "measure": _name(entry["cost"]["measure"]),
        "charged": _figure(_measured(entry["charged"])) if entry["charged"] else "",
        "loss_after": loss_after,
        "denied_by": denied_by,
        "outcome": entry["status"],
        "badge": "denied" if entry["status"] == "denied" else "ok",
        **_hold_kind(entry),
    }


def _hold_kind(entry: dict[str, Any]) -> dict[str, str]:
    """How an entry stands to a hold, in words (``what``), with the hold's short id
    (``hold``) and what its charged amount means (``note``): a hold is charged in full when
    granted; a draw took its cost from its hold and charged nothing; a settle gave back what
    its hold's job did not use, negative in ``charged``."""
    kind, short, granted = entry["kind"], _short(entry["hold_id"]), entry["status"] == "granted"
    if kind == "hold":
        return {"what": "hold", "hold": short, "note": ""}
    if kind == "settle":
        return {"what": "settle of hold", "hold": short, "note": "given back: unused by its job"}
    if kind == "charge" and entry["hold_id"]:
        note = f"drew on hold {short}, charged nothing" if granted else ""
        return {"what": "draw on hold", "hold": short, "note": note}
    return {"what": kind, "hold": "", "note": ""}


def _measured(amount: dict[str, Any]) -> Decimal:
    """An amount's figure in its measure."""
    value: Decimal = amount[amount["measure"]]
    return value


def _filters() -> dict[str, str]:
    return {
        k: v
        for k in ("dataset", "consumer", "status", "since", "until")
        if (v := request.args.get(k, ""))
    }


@bp.get("/ledger", endpoint="ledger")
@signed_in
def ledger_page(who: Principal) -> Any:
    filters = _filters()
    error, view = None, dashboard_reads.LedgerView(entries=[], count=0, newer=False, older=False)
    try:
        parsed = parse_filter(filters, default_limit=50)
        view = dashboard_reads.ledger_view(
            db(),
            parsed,
            before=_position("before"),
            after=_position("after"),
            oldest=request.args.get("oldest") == "1",
        )
    except AccountantError as problem:
        error = problem.detail
    # Verifying reads every entry, so it runs when asked, not on every page view.
    verification = {"ok": None, "entries": 0, "reason": ""}
    if request.args.get("verify"):
        begin_snapshot(db())
        result = verify(db(), hasher=runtime().key_hasher)
        where = "" if result.dataset is None else f"dataset {result.dataset!r}: "
        verification = {
            "ok": result.ok,
            "entries": result.entries,
            "reason": where + (result.reason or ""),
        }
    dataset_names, consumer_names = dashboard_reads.names(db())
    return _page(
        "ledger.html",
        who,
        entries=[_row(entry) for entry in view.entries],
        view=view,
        args=request.args,
        filters=filters,
        error=error,
        verification=verification,
        dataset_names=dataset_names,
        consumer_names=consumer_names,
    )


def _position(name: str) -> int | None:
    raw = request.args.get(name, "")
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise field_error(name, "must be an entry id from a link of this page")
    return int(raw)


@bp.get("/ledger/export")
@signed_in
def export(who: Principal) -> Any:
    return stream_export({**_filters(), "format": request.args.get("format", "csv")})


@bp.get("/mechanisms")
@signed_in
def mechanisms(who: Principal) -> Any:
    registry = runtime().registry
    return _page("mechanisms.html", who, mechanisms=registry.all(), refusals=registry.refusals)
