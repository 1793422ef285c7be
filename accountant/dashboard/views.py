"""Dashboard pages. Every figure comes from the same services as the API, aggregated in SQL."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path
from typing import Any

from flask import Blueprint, redirect, render_template, request, session, url_for

from accountant.accounting.windows import isoformat
from accountant.api import ledger as ledger_api
from accountant.api.common import db, runtime
from accountant.dashboard import charts
from accountant.dashboard.session import check_csrf, csrf_token, sign_in, signed_in
from accountant.errors import AccountantError, NotFound
from accountant.exact import COMPONENTS, Component, ComponentName
from accountant.models import Dataset
from accountant.services import dashboard_reads, datasets, ledger_reads
from accountant.services import ledger as ledger_service
from accountant.services.consumers import Principal
from accountant.services.dashboard_reads import DAY_US

bp = Blueprint("dashboard", __name__, url_prefix="/dashboard",
               template_folder=str(Path(__file__).parent / "templates"),
               static_folder=str(Path(__file__).parent / "static"))


def _page(template: str, who: Principal | None, **context: Any) -> str:
    return render_template(template, who=who, csrf=csrf_token(), **context)


def _measure(dataset: Dataset) -> str:
    """The figure the dataset's budget report leads with: epsilon, rho, rdp or mu."""
    return dataset.mode.measure


def _column(dataset: Dataset) -> tuple[ComponentName, str]:
    """The stored component the dataset's limits bind, and its name: rho holds rho, the
    Renyi divergence at the order on rdp datasets, and mu^2 on gdp ones."""
    if not dataset.mode.converts:
        return "epsilon", "epsilon"
    return "rho", {"rdp": "rdp", "gdp": "mu²"}.get(dataset.accounting, "rho")


def _state(used_pct: float) -> str:
    return "exhausted" if used_pct >= 100 else "warn" if used_pct >= 80 else "ok"


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
        return _page("sign_in.html", None, error=error,
                     next=request.form.get("next", "")), status
    target = request.form.get("next", "")
    if not _PLAIN_DASHBOARD_PATH.fullmatch(target) or ".." in target:
        target = url_for("dashboard.overview")  # never another site, never a header break
    return redirect(target, code=303)


#: A path under /dashboard of unreserved characters, with an optional plain query.
_PLAIN_DASHBOARD_PATH = re.compile(r"/dashboard(/[A-Za-z0-9._~/-]*)?(\?[A-Za-z0-9._~=&%+-]*)?")


@bp.post("/sign-out")
@signed_in
def sign_out(who: Principal) -> Any:
    check_csrf()
    session.clear()
    return redirect(url_for("dashboard.sign_in_page"), code=303)


@bp.get("")
@bp.get("/")
@signed_in
def overview(who: Principal) -> Any:
    rows = []
    now = runtime().clock.now_us() / 1e6
    for dataset in datasets.all_datasets(db()):
        report = datasets.budget_report(db(), dataset, now)
        measure = _measure(dataset)
        loss, limit = float(report["loss"][measure]), float(report["limit"][measure])
        used = _pct(loss, limit)
        windows = []
        worst = used
        for window in report["windows"]:
            w_limit = float(window["limit"].get(measure, 0))
            w_loss = float(window["loss"][measure])
            w_used = _pct(w_loss, w_limit) if measure in window["limit"] else 0.0
            worst = max(worst, w_used)
            windows.append({"period": window["period"], "loss": f"{w_loss:g}",
                            "limit": f"{w_limit:g}", "used_pct": w_used})
        rows.append({"name": dataset.name, "unit": dataset.privacy_unit,
                     "accounting": dataset.accounting, "loss": f"{loss:g}",
                     "limit": f"{limit:g}", "measure": measure, "used_pct": used,
                     "windows": windows, "state": _state(worst)})
    return _page("overview.html", who, rows=rows)


@bp.get("/datasets/<name>")
@signed_in
def dataset(who: Principal, name: str) -> Any:
    try:
        found = datasets.find(db(), name)
    except NotFound:
        return _page("overview.html", who, rows=[]), 404
    report = datasets.budget_report(db(), found, runtime().clock.now_us() / 1e6)
    measure = _measure(found)
    column, stored = _column(found)
    unit = COMPONENTS[column]
    seen = dashboard_reads.activity(db(), found, column,
                                    by_key=request.args.get("sort") == "key")
    first_day = runtime().clock.now_us() // DAY_US - 29
    daily_map = {bucket: float(unit.to_decimal(total))
                 for bucket, total in seen.charged_per_day.items()}
    running = sum(v for bucket, v in daily_map.items() if bucket < first_day)
    daily, cumulative = [], [(isoformat((first_day - 1) * 86_400)[:10], running)]
    for i in range(30):
        label, value = isoformat((first_day + i) * 86_400)[:10], daily_map.get(first_day + i, 0.0)
        running += value
        daily.append((label, value))
        cumulative.append((label, running))
    loss, limit = float(report["loss"][measure]), float(report["limit"][measure])
    stored_limit = float(unit.to_decimal(found.limit[column] or 0))
    whole = sum(total for _, total in seen.consumer_totals) or 1
    recent = [_row(entry) for entry in seen.recent]
    used = _pct(loss, limit)
    return _page(
        "dataset.html", who, name=name, report=report, measure=measure, stored=stored,
        loss=f"{loss:g}",
        limit=f"{limit:g}", used_pct=used, state=_state(used),
        cumulative=charts.line(cumulative, stored_limit, f"cumulative charged {stored}"),
        daily=charts.bars(daily, f"{stored} charged per day"),
        partitions=[{"key": key, "spent": _units(unit, value)}
                    for key, value in seen.top_partitions],
        consumers=[{"name": consumer, "total": _units(unit, total),
                    "share": round(100 * total / whole, 1)}
                   for consumer, total in seen.consumer_totals],
        recent=recent)


def _units(unit: Component, value: int) -> str:
    return _figure(unit.to_decimal(value))


def _figure(value: Decimal) -> str:
    return f"{float(value):g}"


def _row(entry: dict[str, Any]) -> dict[str, Any]:
    """A ledger entry as a table row: a charge's cost in the dataset's measure (rho, rdp or
    mu where it has one, else epsilon) and its outcome; a limit change's old and new limits
    and who changed them, never a grant of cost 0."""
    if entry["kind"] == "limit_change":
        detail = entry["detail"] or {}
        scope = detail.get("scope", "")
        if scope == "consumer":
            scope = f"quota of {detail.get('consumer', '')}"
        return {**entry, "cost": f"{scope}: {_limits(detail.get('old'))} → "
                                 f"{_limits(detail.get('new'))}",
                "outcome": "limit change", "badge": "change"}
    cost = next(entry["cost"][name] for name in ("rho", "rdp", "mu", "epsilon")
                if name in entry["cost"])
    return {**entry, "cost": _figure(cost), "outcome": entry["status"],
            "badge": "denied" if entry["status"] == "denied" else "ok"}


def _limits(stated: Any) -> str:
    """Limits as a limit change records them: a mapping of amounts, a list of windows, or
    none."""
    if stated is None:
        return "none"
    if isinstance(stated, list):
        return "; ".join(_limits(item) for item in stated) or "none"
    if isinstance(stated, dict):
        return ", ".join(f"{k} {v}" for k, v in stated.items())
    return str(stated)


def _filters() -> dict[str, str]:
    return {k: v for k in ("dataset", "consumer", "status", "since", "until")
            if (v := request.args.get(k, ""))}


@bp.get("/ledger", endpoint="ledger")
@signed_in
def ledger_page(who: Principal) -> Any:
    filters = _filters()
    error, entries, next_cursor = None, [], None
    try:
        parsed = ledger_api.parse_filter({**filters, **_paging()}, default_limit=50)
        page, next_cursor = ledger_reads.page(db(), parsed)
        entries = [_row(entry) for entry in page]
    except AccountantError as problem:
        error = problem.detail
    # Verifying reads every entry, so it runs when asked, not on every page view.
    verification = {"ok": None, "entries": 0, "reason": ""}
    if request.args.get("verify"):
        result = ledger_service.verify(db())
        verification = {"ok": result.ok, "entries": result.entries,
                        "reason": result.reason or ""}
    return _page("ledger.html", who, entries=entries, args=request.args, filters=filters,
                 next_cursor=next_cursor, error=error, verification=verification)


def _paging() -> dict[str, str]:
    return {k: v for k in ("cursor",) if (v := request.args.get(k, ""))}


@bp.get("/ledger/export")
@signed_in
def export(who: Principal) -> Any:
    return ledger_api.stream_export({**_filters(), "format": request.args.get("format", "csv")})


@bp.get("/mechanisms")
@signed_in
def mechanisms(who: Principal) -> Any:
    registry = runtime().registry
    return _page("mechanisms.html", who, mechanisms=registry.all(), refusals=registry.refusals)
