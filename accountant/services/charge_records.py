"""A charge as ``GET /v1/charges/{id}`` shows it, from its ledger entry."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from accountant.accounting.windows import isoformat
from accountant.errors import Forbidden, NotFound
from accountant.models import Consumer, Dataset, LedgerEntry
from accountant.services.consumers import Principal


def describe(session: Session, charge_id: str, caller: Principal) -> dict[str, Any]:
    """The charge ``charge_id``; a service sees only its own."""
    row = session.execute(
        select(LedgerEntry, Dataset, Consumer.name)
        .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
        .outerjoin(Consumer, Consumer.id == LedgerEntry.consumer_id)
        .where(LedgerEntry.charge_id == charge_id)
    ).first()
    if row is None:
        raise NotFound(f"no charge with id {charge_id!r}")
    entry, dataset, consumer = row
    if caller.role == "service" and entry.consumer_id != caller.consumer_id:
        raise Forbidden("a service may read only its own charges")
    return {
        "charge_id": entry.charge_id,
        "dataset": dataset.name,
        "consumer": consumer,
        "status": entry.status,
        "mechanism": entry.mechanism,
        "release": entry.release,
        "partitions": entry.partitions,
        "params": entry.params,
        "cost": dataset.mode.report(entry.cost, dataset.limit_delta or 0),
        "multiplicity": entry.multiplicity,
        "denial": {k: v for k, v in (entry.detail or {}).items() if k != "terms_sha256"}
        if entry.status == "denied"
        else None,
        "created_at": isoformat(entry.created_at / 1e6),
    }
