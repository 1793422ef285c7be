"""A charge as ``GET /v1/charges/{id}`` shows it, from its ledger entry."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from accountant.errors import Forbidden, NotFound
from accountant.models import Consumer, Dataset, LedgerEntry
from accountant.services.api_keys import Principal
from accountant.services.ledger_reads import describe_entry


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
    described = describe_entry(entry, dataset, consumer)
    record = {name: described[name] for name in _FIELDS}
    detail = entry.detail or {}
    if "batch_id" in detail:  # an item of a batch, or its refusal
        record["batch_id"] = detail["batch_id"]
    if "group" in detail:  # its cost is its share of what its group cost together
        record["group"] = detail["group"]
        record["group_cost"] = {k: float(v) for k, v in detail["group_cost"].items()}
        record["batch_delta"] = float(detail["batch_delta"])
    record["denial"] = (
        {k: v for k, v in detail.items() if k != "terms_sha256"}
        if entry.status == "denied"
        else None
    )
    return record


#: What API.md's charge record takes from the entry as the ledger describes it.
_FIELDS = (
    "charge_id",
    "dataset",
    "consumer",
    "status",
    "mechanism",
    "release",
    "partitions",
    "params",
    "cost",
    "multiplicity",
    "charged",  # what its scopes' running totals grew by: none for a draw on a hold
    "hold_id",  # the hold a draw took its cost from
    "created_at",
)


def with_numbers(params: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as a charge record shows them: a number that the ledger keeps as its exact
    text (``ledger.plain_params``, which its hash covers) is a JSON number again wherever
    ``schema`` (its mechanism's parameters) says it is one."""
    properties = schema.get("properties", {})
    shown = dict(params)
    for name, value in params.items():
        if isinstance(value, str) and properties.get(name, {}).get("type") == "number":
            with suppress(InvalidOperation):  # not a number's text: as recorded
                shown[name] = Decimal(value)
    return shown
