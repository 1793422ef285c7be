"""Batches (release plans): the request bodies and answers of ``batch`` and of a weighted
``plan``, shared by ``Client`` and ``AsyncClient``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from accountant_client._errors import _amount
from accountant_client._holds import _plain
from accountant_client._results import Charge, Plan, _charge_body, _charge_of, _plan_of


@dataclass(frozen=True)
class BatchResult:
    """A granted batch: every item charged and released together, in one decision.

    ``items`` are the items' charges in the order they were asked for, each with its own
    output, receipt (verified offline as a charge's) and ``batch_id``, and, for an item of a
    group of approx items priced together, its ``group`` (its ``cost`` is then its share of
    the group's composed cost). ``cost`` is what the batch charged each dataset, by name.
    ``idempotency_key`` is the batch's: sent again with the same items, it returns this
    answer again (the same charges, the same outputs)."""

    batch_id: str
    items: list[Charge]
    cost: dict[str, dict[str, Decimal]]
    idempotency_key: str


@dataclass(frozen=True)
class BatchPlan:
    """The least-noise parameters for a list of weighted items to fit together:
    ``items[i]`` are item i's parameters (its noise parameter filled in), ``cost`` what
    the list would cost each dataset, ``raw`` the answer as sent."""

    items: list[dict[str, Decimal]]
    cost: dict[str, dict[str, Decimal]]
    raw: dict[str, Any]


def _batch_items(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each item as the request states it: the fields of a charge's body (``charge``'s
    keyword arguments: dataset, partitions, mechanism, params, input, release; a plan's
    items add ``weight``), passed as given for the service to check, whose errors name
    ``items[i].field``; a sequence of partitions as a list, and Decimal parameters (as a
    ``BatchPlan`` states them) as JSON numbers."""
    listed = []
    for item in items:
        body = dict(item)
        partitions = body.get("partitions")
        if partitions is not None and not isinstance(partitions, str):
            body["partitions"] = list(partitions)
        if isinstance(body.get("params"), Mapping):
            body["params"] = _plain(body["params"])
        listed.append(body)
    return listed


def _batch_body(items: Iterable[Mapping[str, Any]], delta: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {"items": _batch_items(items)}
    if delta is not None:
        body["delta"] = delta
    return body


def _batch_of(answer: Mapping[str, Any], key: str, claims: Sequence[dict[str, Any]]) -> BatchResult:
    """A granted batch's answer; ``claims``: each item's verified receipt claims, in order
    (empty when receipts are not verified)."""
    return BatchResult(
        batch_id=answer["batch_id"],
        items=[
            _charge_of(item, key, item_claims)
            for item, item_claims in zip(answer["items"], claims, strict=True)
        ],
        cost=_costs(answer["cost"]),
        idempotency_key=key,
    )


def _plan_body(
    *,
    dataset: str | None,
    partitions: Sequence[str] | str | None,
    mechanism: str | None,
    params: Mapping[str, Any] | None,
    release: str,
    count: int | None,
    hold: str | None,
    items: Iterable[Mapping[str, Any]] | None,
    share: float | None,
    delta: float | None,
) -> dict[str, Any]:
    """A plan's request: one charge (dataset, partitions, mechanism, params; ``count``,
    ``hold``), or a list of weighted ``items`` (``share``, ``delta``); a ``TypeError`` for
    fields of both or of neither."""
    if items is None:
        if dataset is None or partitions is None or mechanism is None or params is None:
            raise TypeError("a plan takes dataset, partitions, mechanism and params, or items")
        if share is not None or delta is not None:
            raise TypeError("share and delta plan a list of items: pass items")
        return _charge_body(dataset, partitions, mechanism, params, None, release, count, hold)
    single = (dataset, partitions, mechanism, params, count, hold)
    if any(value is not None for value in single) or release != "joint":
        raise TypeError(
            "a plan of items takes each item's fields (dataset, partitions, mechanism, "
            "params, release) in the item, and no count or hold"
        )
    body = _batch_body(items, delta)
    if share is not None:
        body["share"] = share
    return body


def _planned(answer: Mapping[str, Any], weighted: bool) -> Plan | BatchPlan:
    """A plan's answer: a ``BatchPlan`` for a list of weighted items, else a ``Plan``."""
    if not weighted:
        return _plan_of(answer)
    return BatchPlan(
        items=[_amount(item.get("params")) for item in answer["items"]],
        cost=_costs(answer.get("cost")),
        raw=dict(answer),
    )


def _costs(cost: Mapping[str, Any] | None) -> dict[str, dict[str, Decimal]]:
    """Amounts by dataset name."""
    return {name: _amount(amount) for name, amount in (cost or {}).items()}
