"""Health, readiness and the mechanism catalogue."""

from __future__ import annotations

import copy
import hmac
import logging
from typing import Any

from flask import Blueprint, Response, request
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from accountant.api.auth import principal
from accountant.db import schema_missing
from accountant.errors import Unauthorized, Unavailable
from accountant.metrics import DATABASE_ERRORS, process_metrics, record_metric
from accountant.services import datasets, ledger_reads
from accountant.web import db, runtime

log = logging.getLogger(__name__)
bp = Blueprint("meta", __name__)


@bp.get("/healthz")
def healthz() -> Any:
    return {"status": "ok"}


@bp.get("/readyz")
def readyz() -> Any:
    try:
        current = ledger_reads.schema_revision(db())
    except Exception as error:  # any database failure means "not ready"
        if isinstance(error, DBAPIError) and schema_missing(error):
            raise Unavailable(
                "the database has no schema, or one behind this release: "
                "run 'accountant db upgrade'"
            ) from None
        raise Unavailable(
            f"the database does not answer ({type(error).__name__}): check that it is up "
            "and reachable at ACCOUNTANT_DATABASE_URL; readiness returns once it answers"
        ) from None
    if current != runtime().head_revision:
        raise Unavailable(
            f"the schema is at {current!r}, not {runtime().head_revision!r}; "
            "run 'accountant db upgrade'"
        )
    return {"status": "ready", "schema": current}


def published_params_schema(schema: Any) -> dict[str, Any]:
    """A mechanism's parameter schema plus the core's ``sensitivity_unit``."""
    published: dict[str, Any] = copy.deepcopy(dict(schema))
    published.setdefault("properties", {})["sensitivity_unit"] = {
        "enum": ["record"],
        "description": "state a record-level sensitivity on a user dataset; the accountant "
        "scales it by the contribution bounds",
    }
    return published


@bp.get("/v1/mechanisms")
def mechanisms() -> Any:
    principal("admin", "service", "auditor")
    return {
        "mechanisms": [
            {
                "name": m.name,
                "description": m.description,
                "params_schema": published_params_schema(m.params_schema),
                "input_schema": dict(m.input_schema),
                "accounting": list(m.accounting),
                "plugin": m.plugin,
                "runs": m.runs,
            }
            for m in runtime().registry.all()
        ]
    }


def _label(value: str | None) -> str:
    return (value or "").replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@bp.get("/metrics")
def metrics() -> Any:
    """Prometheus text format. Charge counts are kept by the charges themselves in the
    database, so every worker and host reports the same monotonic totals; a scrape reads
    those counts and the scope rows, never the ledger. With ACCOUNTANT_METRICS_KEY set, only
    a request that sends that key as a bearer token is answered.

    While the database does not answer, the scrape still succeeds: it says
    ``accountant_database_up 0`` and gives this process's own metrics (its database errors
    among them), which is when they are wanted."""
    _check_metrics_key()
    try:
        lines = _database_lines()
    except (OperationalError, PoolTimeout, Unavailable) as error:  # a charge's 503
        if isinstance(error, OperationalError) and schema_missing(error):
            raise  # the 503 that names 'accountant db upgrade'
        log.warning("metrics without the database", extra={"error": str(error)[:200]})
        record_metric(DATABASE_ERRORS.inc)
        lines = _database_up(0)
    text = "\n".join(lines) + "\n" + process_metrics().decode()
    return Response(text, mimetype="text/plain; version=0.0.4")


def _database_up(up: int) -> list[str]:
    return [
        "# HELP accountant_database_up Whether this scrape could read the database.",
        "# TYPE accountant_database_up gauge",
        f"accountant_database_up {up}",
    ]


def _database_lines() -> list[str]:
    """What /metrics reads from the database: charge counts and budget utilisation."""
    rows = ledger_reads.charge_counts(db())
    lines = [
        "# HELP accountant_charges_total Charges by dataset, mechanism and outcome.",
        "# TYPE accountant_charges_total counter",
    ]
    for dataset, mechanism, outcome, count in sorted(rows, key=lambda r: tuple(map(str, r))):
        lines.append(
            f'accountant_charges_total{{dataset="{_label(dataset)}",'
            f'mechanism="{_label(mechanism)}",outcome="{_label(outcome)}"}} {count}'
        )
    lines += [
        "# HELP accountant_mechanisms Registered mechanisms.",
        "# TYPE accountant_mechanisms gauge",
        f"accountant_mechanisms {len(runtime().registry.all())}",
    ]
    return lines + _utilisation_lines() + _database_up(1)


def _check_metrics_key() -> None:
    expected = runtime().settings.metrics_key
    if expected is None:
        return
    sent = request.headers.get("Authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {expected}".encode()):
        raise Unauthorized(
            "/metrics needs the key set in ACCOUNTANT_METRICS_KEY: send "
            "'Authorization: Bearer <that key>' (Prometheus: "
            "authorization.credentials in the scrape config)"
        )


def _utilisation_lines() -> list[str]:
    """Loss over limit for each dataset's lifetime, largest partition and current windows."""
    lines = [
        "# HELP accountant_budget_utilisation Loss divided by limit (1 is exhausted).",
        "# TYPE accountant_budget_utilisation gauge",
    ]
    now = runtime().clock.now_us() / 1e6
    for dataset in datasets.all_datasets(db()):
        report = datasets.budget_report(db(), dataset, now, history=False)
        measure = dataset.mode.measure
        scopes = [("dataset", report["loss"], report["limit"])]
        if "partition_limit" in report:
            scopes.append(
                ("partition", report["partitions"]["max_spent"], report["partition_limit"])
            )
        scopes += [(f"window_{w['period']}", w["loss"], w["limit"]) for w in report["windows"]]
        for scope, loss, limit in scopes:
            if measure not in limit:
                continue
            bound = float(limit[measure])
            # a bound of 0 in the measure admits nothing: exhausted (checks.at_limit)
            ratio = float(loss[measure]) / bound if bound > 0 else 1.0
            lines.append(
                f'accountant_budget_utilisation{{dataset="{_label(dataset.name)}",'
                f'scope="{scope}"}} {ratio:.6g}'
            )
    return lines
