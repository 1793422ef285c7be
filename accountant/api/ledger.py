"""/v1/ledger: the append-only record of charges and limit changes (auditors, admins)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from flask import Blueprint, Response, request, stream_with_context
from sqlalchemy import select

from accountant.accounting.modes import MODES
from accountant.accounting.windows import isoformat
from accountant.api.auth import principal
from accountant.api.common import db
from accountant.errors import NotFound, field_error
from accountant.exact import Amount
from accountant.models import Consumer, Dataset, LedgerEntry
from accountant.services import ledger

bp = Blueprint("ledger", __name__)


def describe_entry(entry: LedgerEntry, dataset: Dataset, consumer: str | None) -> dict[str, Any]:
    mode = MODES[dataset.accounting]
    charged = None  # what the running total grew by: cost x multiplicity, when granted
    if entry.kind == "charge":
        grew = Amount(entry.cost_epsilon or 0, entry.cost_delta or 0, entry.cost_rho or 0)
        charged = mode.report(grew.scaled(entry.multiplicity) if entry.status == "granted"
                              else Amount(), dataset.limit_delta or 0)
    return {
        "id": entry.id, "seq": entry.seq, "kind": entry.kind, "charge_id": entry.charge_id,
        "dataset": dataset.name, "consumer": consumer, "status": entry.status,
        "mechanism": entry.mechanism, "release": entry.release, "partitions": entry.partitions,
        "cost": mode.report(entry.cost, dataset.limit_delta or 0),
        "multiplicity": entry.multiplicity, "charged": charged,
        "loss_after": None if (after := entry.loss_after) is None
        else mode.report(after, dataset.limit_delta or 0),
        "detail": entry.detail or None,
        "created_at": isoformat(entry.created_at / 1e6),
        "noise_secret": entry.noise_secret, "implementation": entry.implementation,
        "prev_hash": entry.prev_hash, "hash": entry.hash,
        # what the hash covers, in the form it covers it (docs/ledger.md)
        "params": entry.params,
        "cost_units": [entry.cost_epsilon, entry.cost_delta, entry.cost_rho],
        "created_at_us": entry.created_at,
    }


_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _moment(args: Mapping[str, str], name: str) -> int | None:
    """An RFC 3339 time parameter in microseconds, None when absent; anything else is a 400."""
    raw = args.get(name)
    if raw is None:
        return None
    text = raw.upper()
    try:
        if not _RFC3339.match(text):
            raise ValueError(text)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise field_error(name, "must be an RFC 3339 time, e.g. 2026-11-21T00:00:00Z") from None
    return int(moment.timestamp() * 1_000_000)


def parse_filter(args: Mapping[str, str], default_limit: int = 100,
                 max_limit: int = 1000) -> ledger.LedgerFilter:
    session = db()
    dataset_id = consumer_id = None
    if (name := args.get("dataset")) is not None:
        dataset_id = session.execute(select(Dataset.id).where(Dataset.name == name)).scalar()
        if dataset_id is None:
            raise NotFound(f"no dataset named {name!r}")
    if (name := args.get("consumer")) is not None:
        consumer_id = session.execute(select(Consumer.id).where(Consumer.name == name)).scalar()
        if consumer_id is None:
            raise NotFound(f"no consumer named {name!r}")
    status = args.get("status")
    if status not in (None, "granted", "denied"):
        raise field_error("status", "must be granted or denied")
    limit_raw = args.get("limit", str(default_limit))
    cursor_raw = args.get("cursor", "0")
    # ASCII digits only: "²" and "٣" pass str.isdigit but not int(); 19 digits bound int().
    if not _digits(limit_raw) or not 1 <= int(limit_raw) <= max_limit:
        raise field_error("limit", f"must be an integer from 1 to {max_limit}")
    if not _digits(cursor_raw) or len(cursor_raw) > 18:
        raise field_error("cursor", "must be a next_cursor from an earlier page")
    return ledger.LedgerFilter(dataset_id, consumer_id, status, _moment(args, "since"),
                               _moment(args, "until"), int(cursor_raw), int(limit_raw))


def _digits(raw: str) -> bool:
    return raw.isascii() and raw.isdigit() and len(raw) <= 19


@bp.get("/v1/ledger")
def list_entries() -> Any:
    principal("admin", "auditor")
    filters = parse_filter(request.args)
    datasets = {d.id: d for d in db().execute(select(Dataset)).scalars()}
    page = db().execute(ledger.query(filters)).all()
    entries = [describe_entry(entry, datasets[entry.dataset_id], consumer)
               for entry, _name, consumer in page]
    next_cursor = str(page[-1][0].id) if len(page) == filters.limit else None
    return {"entries": entries, "next_cursor": next_cursor}


@bp.get("/v1/ledger/verify")
def verify() -> Any:
    principal("admin", "auditor")
    result = ledger.verify(db())
    if result.ok:
        return {"ok": True, "entries": result.entries, "heads": result.heads}
    bad = None
    if result.first_bad is not None:
        names = {d.id: d for d in db().execute(select(Dataset)).scalars()}
        consumer = db().execute(select(Consumer.name).where(
            Consumer.id == result.first_bad.consumer_id)).scalar()
        bad = describe_entry(result.first_bad, names[result.first_bad.dataset_id], consumer)
    return {"ok": False, "entries": result.entries, "dataset": result.dataset,
            "reason": result.reason, "first_bad_entry": bad}


EXPORT_FIELDS = ["id", "seq", "kind", "charge_id", "dataset", "consumer", "status", "mechanism",
                 "release", "partitions", "cost", "detail", "created_at", "noise_secret",
                 "implementation", "prev_hash", "hash", "params", "multiplicity", "cost_units",
                 "created_at_us", "charged", "loss_after"]


#: What a spreadsheet reads as the start of a formula (OWASP, "CSV Injection").
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet shows as text: a leading formula character is escaped
    with a quote (a partition key or a reason may start with "=")."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


@bp.get("/v1/ledger/export")
def export() -> Any:
    """The filtered entries as CSV or JSON Lines, streamed page by page (constant memory)."""
    principal("admin", "auditor")
    return stream_export(request.args)


def stream_export(args: Mapping[str, str]) -> Response:
    kind = args.get("format", "jsonl")
    if kind not in ("csv", "jsonl"):
        raise field_error("format", "must be csv or jsonl")
    filters = parse_filter(args, default_limit=2**62, max_limit=2**62)
    session = db()
    datasets = {d.id: d for d in session.execute(select(Dataset)).scalars()}

    def rows() -> Iterator[dict[str, Any]]:
        after, left = filters.after_id, filters.limit
        while left > 0:
            page_filter = ledger.LedgerFilter(
                filters.dataset_id, filters.consumer_id, filters.status, filters.since,
                filters.until, after, min(1000, left))
            page = session.execute(ledger.query(page_filter)).all()
            described = [describe_entry(entry, datasets[entry.dataset_id], consumer)
                         for entry, _name, consumer in page]
            last_id = page[-1][0].id if page else after
            # End each page's read transaction (never hold a snapshot for a whole download),
            # and forget its objects so memory stays flat.
            session.rollback()
            session.expunge_all()
            yield from described
            if len(described) < page_filter.limit:
                return
            after, left = last_id, left - len(described)

    def lines() -> Iterator[str]:
        if kind == "jsonl":
            for row in rows():
                yield json.dumps(row, default=float, separators=(",", ":")) + "\n"
            return
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=EXPORT_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows():
            writer.writerow({k: _cell(json.dumps(v, default=float) if isinstance(v, dict | list)
                                      else v) for k, v in row.items()})
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
        yield buffer.getvalue()

    mimetype = "text/csv" if kind == "csv" else "application/x-ndjson"
    response = Response(stream_with_context(lines()), mimetype=mimetype)
    response.headers["Content-Disposition"] = f"attachment; filename=ledger.{kind}"
    return response
