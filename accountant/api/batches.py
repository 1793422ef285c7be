"""/v1/charges/batch: a release plan, granted all together or not at all."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Response, request

from accountant import problems
from accountant.api import schemas
from accountant.api.auth import confirmed_on_failure, principal
from accountant.api.charges import charge_request, granted_body
from accountant.api.common import json_body
from accountant.errors import BudgetExhausted, WindowExhausted, field_error
from accountant.jsonio import dumps
from accountant.services import batches, idempotency
from accountant.services.api_keys import Principal
from accountant.web import driver, runtime

bp = Blueprint("batches", __name__)


@bp.post("/v1/charges/batch")
def create() -> Any:
    caller = principal("admin", "service", remembered=True)  # its key is read under the lock
    with confirmed_on_failure():
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
