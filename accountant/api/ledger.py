"""/v1/ledger: the append-only record of charges and limit changes (auditors, admins), the
datasets' chains and the populations' (``"population": true``)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, request

from accountant.api.auth import principal
from accountant.ledger_export import parse_filter, stream_export
from accountant.services import ledger_reads
from accountant.web import db, runtime

bp = Blueprint("ledger", __name__)


@bp.get("/v1/ledger")
def list_entries() -> Any:
    principal("admin", "auditor")
    entries, next_cursor = ledger_reads.page(db(), parse_filter(request.args))
    return {"entries": entries, "next_cursor": next_cursor}


@bp.get("/v1/ledger/verify")
def verify() -> Any:
    principal("admin", "auditor")
    return ledger_reads.verification(db(), runtime().key_hasher)


@bp.get("/v1/ledger/export")
def export() -> Any:
    """The filtered entries as CSV or JSON Lines, streamed page by page (constant memory)."""
    principal("admin", "auditor")
    return stream_export(request.args)
