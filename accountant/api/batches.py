"""/v1/charges/batch: a release plan, granted all together or not at all."""

from __future__ import annotations

import uuid
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from flask import Blueprint, Response, request

from accountant import problems
from accountant.api import schemas
from accountant.api.auth import confirmed_on_failure, principal
from accountant.api.charges import (
    charge_request,
    granted_body,
    mechanism_named,
    noise_parameter,
)
from accountant.api.common import items_named, json_body
from accountant.errors import BudgetExhausted, WindowExhausted, field_error
from accountant.jsonio import dumps
from accountant.services import batches, idempotency, release_plans
from accountant.services.api_keys import Principal
from accountant.services.charge_responses import report_cost_of
from accountant.web import driver, runtime

bp = Blueprint("batches", __name__)


@bp.post("/v1/charges/batch")
def create() -> Any:
    caller = principal("admin", "service", remembered=True)  # its key is read under the lock
    with confirmed_on_failure():
        with items_named():
            body = json_body(schemas.BATCH)
        key = idempotency.key_of(body, request.headers.get("Idempotency-Key"))
        batch = batches.BatchRequest(
            batch_id=str(uuid.uuid4()),
            items=tuple(_item(i, item, caller) for i, item in enumerate(body["items"])),
            delta=body.get("delta"),
            principal=caller,
            key=key,
            fingerprint=idempotency.fingerprint(body),
        )
        done = batches.submit(driver(), batch, runtime().charging)
    return answer(done)


def _item(i: int, body: dict[str, Any], caller: Principal) -> Any:
    """Item ``i`` as a charge request; its errors name it (``items[i].params.sigma``)."""
    schemas.validate(schemas.CHARGE, body, f"items[{i}]")
    if "hold" in body:
        raise field_error(
            f"items[{i}].hold",
            "a batch item may not draw on a hold; charge the hold's draws one by one",
        )
    if "idempotency_key" in body:
        raise field_error(
            f"items[{i}].idempotency_key",
            "a batch is idempotent as a whole: give the batch its key, not its items",
        )
    with batches.item_errors(i):
        return charge_request(body, caller)


def answer(done: batches.BatchDone) -> Response:
    """A batch's answer from its facts, the first time and on replay alike."""
    facts = done.facts
    if isinstance(done, batches.BatchDenied):
        extra = {"batch_id": facts["batch_id"], "denials": facts["denials"]}
        if "resets_at" in facts:  # a 429: when the last window it breaks resets
            extra["resets_at"] = facts["resets_at"]
        wait = facts.get("fits_again_in_s")
        error = (
            BudgetExhausted(facts["reason"], extra=extra)
            if wait is None
            else WindowExhausted(facts["reason"], extra=extra, retry_after=wait)
        )
        return problems.response(problems.of(error))
    body = {
        "batch_id": facts["batch_id"],
        "items": [
            granted_body(item, output) | {k: item[k] for k in ("batch_id", "group") if k in item}
            for item, output in zip(facts["items"], done.outputs, strict=True)
        ],
        "cost": facts["cost"],
    }
    return Response(dumps(body), status=201, mimetype="application/json")


def calibrated(body: dict[str, Any], caller: Principal) -> dict[str, Any]:
    """``POST /v1/charges/plan`` with weighted ``items``: the least noise for each such that
    all of them, charged as one batch now, fit ``share`` of what every scope has left."""
    with items_named():
        schemas.validate(schemas.PLAN_WEIGHTED, body)
    items = [_weighted(i, item, caller) for i, item in enumerate(body["items"])]
    delta = body.get("delta")
    found = release_plans.calibrate(
        driver(),
        items,
        share=Fraction(body.get("share", 1)),
        delta=delta,
        caller=caller,
        context=runtime().charging,
    )
    return {
        "items": [
            {"params": {item.name: value}, "dataset": item.request.dataset}
            for item, value in zip(items, found.values, strict=True)
        ],
        "cost": {
            name: report_cost_of(found.states[name], amount)
            for name, amount in found.charged.items()
        },
        "share": body.get("share", 1),
        **({"delta": delta} if delta is not None else {}),
    }


def _weighted(i: int, body: dict[str, Any], caller: Principal) -> release_plans.WeightedItem:
    """Item ``i`` of a weighted plan, its noise parameter found by the one it leaves out."""
    schemas.validate(schemas.PLAN_ITEM, body, f"items[{i}]")
    if "hold" in body:
        raise field_error(f"items[{i}].hold", "a planned item may not draw on a hold")
    with batches.item_errors(i):
        params = body["params"]
        name = noise_parameter(mechanism_named(body["mechanism"]), params, "leave out")
        plain = {k: v for k, v in body.items() if k != "weight"}
        request = charge_request({**plain, "params": {**params, name: Decimal(1)}}, caller)
    return release_plans.WeightedItem(
        request=replace(request, params={k: v for k, v in request.params.items() if k != name}),
        weight=Fraction(body["weight"]),
        name=name,
    )
