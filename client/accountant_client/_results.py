"""What the calls return: frozen values read from the service's JSON answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from accountant_client._errors import _amount


@dataclass(frozen=True)
class Charge:
    """A granted charge: the noisy output and what it cost."""

    charge_id: str
    dataset: str
    mechanism: str
    partitions: list[str]
    output: dict[str, Any]
    cost: dict[str, Decimal]
    charged: dict[str, Decimal]
    multiplicity: int
    remaining: dict[str, Decimal]
    receipt: str
    created_at: str
    idempotency_key: str
    claims: dict[str, Any] = field(default_factory=dict)  # the verified receipt's claims
    #: The noise's scale and 95% half-width per released value (docs/mechanisms.md,
    #: "Accuracy"); None for a mechanism that does not state it.
    accuracy: dict[str, Any] | None = None
    #: The hold a draw took its cost from (``charged`` is then 0); None for a charge.
    hold_id: str | None = None
    #: The batch a batch's item was granted in; None for a charge alone.
    batch_id: str | None = None
    #: The group of approx items the batch priced it with (its ``cost`` is its share of the
    #: group's composed cost); None for an item priced as a single charge.
    group: int | None = None


@dataclass(frozen=True)
class Preview:
    granted: bool
    cost: dict[str, Decimal]
    remaining_after: dict[str, Decimal]
    scope: str | None
    reason: str | None
    accuracy: dict[str, Any] | None = None  # as ``Charge.accuracy``


@dataclass(frozen=True)
class Plan:
    """How many more identical charges fit (``fits``, ``limited_by``), or, asked with a
    count, the least-noise parameters for it (``params``)."""

    fits: int | None
    limited_by: dict[str, Any] | None
    params: dict[str, Decimal] | None
    raw: dict[str, Any]
    accuracy: dict[str, Any] | None = None  # of the charges planned, as ``Charge.accuracy``


@dataclass(frozen=True)
class Settlement:
    """A hold settled (or released): what its job ``used`` in all, draws included, per
    release; what charges ``drew`` of it; what ``returned`` to every scope it charged (its
    ``amount`` less ``used``); and the ``receipt`` of kind ``settle`` stating the settled
    cost, which the job publishes with its output. ``raw``: the answer as sent."""

    hold_id: str
    state: str
    amount: dict[str, Decimal]
    drawn: dict[str, Decimal]
    used: dict[str, Decimal]
    returned: dict[str, Decimal]
    receipt: str
    raw: dict[str, Any]
    idempotency_key: str
    claims: dict[str, Any] = field(default_factory=dict)  # the verified receipt's claims


def _settlement_of(answer: Mapping[str, Any], key: str, claims: dict[str, Any]) -> Settlement:
    return Settlement(
        hold_id=answer["hold_id"],
        state=answer["state"],
        amount=_amount(answer["amount"]),
        drawn=_amount(answer["drawn"]),
        used=_amount(answer["used"]),
        returned=_amount(answer["returned"]),
        receipt=answer["receipt"],
        raw=dict(answer),
        idempotency_key=key,
        claims=claims,
    )


def _charge_of(answer: Mapping[str, Any], key: str, claims: dict[str, Any]) -> Charge:
    return Charge(
        charge_id=answer["charge_id"],
        dataset=answer["dataset"],
        mechanism=answer["mechanism"],
        partitions=list(answer["partitions"]),
        output=answer["output"],
        cost=_amount(answer["cost"]),
        charged=_amount(answer.get("charged")),
        multiplicity=int(answer.get("multiplicity", 1)),
        remaining=_amount(answer.get("remaining")),
        receipt=answer["receipt"],
        created_at=answer["created_at"],
        idempotency_key=key,
        claims=claims,
        accuracy=answer.get("accuracy"),
        hold_id=answer.get("hold_id"),
        batch_id=answer.get("batch_id"),
        group=answer.get("group"),
    )


def _preview_of(answer: Mapping[str, Any]) -> Preview:
    return Preview(
        bool(answer["granted"]),
        _amount(answer.get("cost")),
        _amount(answer.get("remaining_after")),
        answer.get("scope"),
        answer.get("reason"),
        answer.get("accuracy"),
    )


def _plan_of(answer: Mapping[str, Any]) -> Plan:
    return Plan(
        answer.get("fits"),
        answer.get("limited_by"),
        _amount(answer["params"]) if "params" in answer else None,
        dict(answer),
        answer.get("accuracy"),
    )


def _charge_body(
    dataset: str,
    partitions: Sequence[str] | str,
    mechanism: str,
    params: Mapping[str, Any],
    input: Mapping[str, Any] | None,
    release: str,
    count: int | None = None,
    hold: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "dataset": dataset,
        "mechanism": mechanism,
        "release": release,
        "partitions": partitions if isinstance(partitions, str) else list(partitions),
        "params": dict(params),
    }
    if input is not None:
        body["input"] = dict(input)
    if count is not None:
        body["count"] = count
    if hold is not None:
        body["hold"] = hold
    return body
