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
    return body
