"""/v1/holds: budget reserved, and charged at once, for jobs that run elsewhere."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from flask import Blueprint, Response, request

from accountant.accounting.charge_inputs import ChargeRequest, HoldTerms
from accountant.api import schemas
from accountant.api.auth import confirmed_on_failure, principal
from accountant.api.charges import answer as charge_answer
from accountant.api.charges import checked_partitions, known_answer
from accountant.api.common import json_body
from accountant.errors import Forbidden, InvalidRequest, field_error
from accountant.jsonio import dumps
from accountant.mechanism import Mechanism
from accountant.services import charges, evaluation, holds, idempotency, ledger_reads, settles
from accountant.services.api_keys import Principal
from accountant.web import db, driver, runtime

bp = Blueprint("holds", __name__)


@bp.post("/v1/holds")
def create() -> Any:
    caller = principal("admin", "service", remembered=True)  # its key is read under the lock
    with confirmed_on_failure():
        body = json_body(schemas.HOLD)
        key = idempotency.key_of(body, request.headers.get("Idempotency-Key"))
        fingerprint = idempotency.fingerprint(body)
        try:
            hold_request = replace(_request(body, caller), key=key, fingerprint=fingerprint)
            if hold_request.mechanism is not None and not hold_request.mechanism.runs:
                # an accounting-only mechanism may take a second to price (a privacy-loss
                # distribution): price it once before the lock, so that the charge's own
                # pricing under the lock finds it in the mechanism's cache
                evaluation.preview(driver(), hold_request, runtime().clock.now_us())
        except (InvalidRequest, Forbidden):  # a committed hold's retry gets its first answer
            first = known_answer(caller, key, fingerprint)
            if first is None:
                raise
            return answer(first.facts)
        done = charges.submit(driver(), hold_request, runtime().charging)
    return answer(done.facts)


def _request(body: dict[str, Any], caller: Principal) -> ChargeRequest:
    """A hold as a charge request that runs nothing: priced by its stated amount, or by a
    mechanism (an accounting-only one too) and its parameters."""
    mechanism, params, unit = None, {}, None
    if "mechanism" in body:
        mechanism = runtime().registry.get(body["mechanism"])
        if mechanism is None:
            known = ", ".join(m.name for m in runtime().registry.all())
            raise field_error(
                "mechanism",
                f"no mechanism named {body['mechanism']!r}; use one of {known} "
                "(GET /v1/mechanisms), or state an amount",
            )
        params = dict(body["params"])
        unit = params.pop("sensitivity_unit", None)
        if unit not in (None, "record"):
            raise field_error(
                "params.sensitivity_unit", f'must be "record" when given; got {dumps(unit)}'
            )
        schemas.validate(mechanism.params_schema, params, "params")
    return ChargeRequest(
        dataset=body["dataset"],
        partitions=checked_partitions(body["partitions"]),
        release=body.get("release", "joint"),
        mechanism=mechanism,
        params=params,
        sensitivity_unit=unit,
        principal=caller,
        hold=HoldTerms(
            hold_id=str(uuid.uuid4()),
            expires_in_s=body["expires_in"],
            purpose=body.get("purpose"),
            amount=body.get("amount"),
        ),
    )


def answer(facts: dict[str, Any]) -> Response:
    """A hold's answer from its facts, the first time and on every replay: 201 with the
    hold, or a denial as a charge's."""
    if facts["kind"] != "hold":
        return charge_answer(facts, None)
    body = {k: v for k, v in facts.items() if k != "kind"}
    return Response(dumps(body), status=201, mimetype="application/json")


@bp.post("/v1/holds/<uuid:hold_uuid>/settle")
def settle(hold_uuid: uuid.UUID) -> Any:
    return _settle(str(hold_uuid), release=False)


@bp.post("/v1/holds/<uuid:hold_uuid>/release")
def release(hold_uuid: uuid.UUID) -> Any:
    """Settle at what charges drew: the job published nothing of its own."""
    return _settle(str(hold_uuid), release=True)


def _settle(hold_id: str, *, release: bool) -> Response:
    caller = principal("admin", "service", remembered=True)  # its key is read under the lock
    with confirmed_on_failure():
        body = json_body(schemas.RELEASE if release else schemas.SETTLE, empty_ok=release)
        key = idempotency.key_of(body, request.headers.get("Idempotency-Key"))
        # the same key on another hold, or to settle and then release, is a reuse
        fingerprint = idempotency.fingerprint({**body, "hold": hold_id, "release": release})
        dataset, mechanism_name, held_params = settles.locate(driver(), hold_id)
        mechanism = None if mechanism_name is None else runtime().registry.get(mechanism_name)
        params = body.get("params")
        try:
            _check_settle_params(params, mechanism_name, mechanism, held_params)
        except InvalidRequest:  # a committed settle's retry gets its first answer
            first = known_answer(caller, key, fingerprint)
            if first is None:
                raise
            return _settled(first.facts)
        done = settles.settle(
            driver(),
            settles.SettleRequest(
                hold_id=hold_id,
                dataset=dataset,
                principal=caller,
                used=body.get("used"),
                params=params,
                mechanism=mechanism,
                key=key,
                fingerprint=fingerprint,
            ),
            runtime().charging,
        )
    return _settled(done.facts)


def _check_settle_params(
    params: dict[str, Any] | None,
    mechanism_name: str | None,
    mechanism: Mechanism | None,
    held_params: dict[str, Any],
) -> None:
    """A settle's ``params``: for the mechanism that priced the hold, which runs here."""
    if params is None:
        return
    if mechanism_name is None:
        raise field_error(
            "params",
            "this hold was not priced by a mechanism: settle it with used, the "
            "amount the job used in all",
        )
    if mechanism is None:
        raise field_error(
            "params",
            f"the hold's mechanism {mechanism_name!r} is not registered here now (disabled "
            "or not installed): settle with used, the amount the job used in all",
        )
    merged = {**held_params, **params}
    merged.pop("sensitivity_unit", None)
    schemas.validate(mechanism.params_schema, merged, "params")


def _settled(facts: dict[str, Any]) -> Response:
    body = {k: v for k, v in facts.items() if k != "kind"}
    return Response(dumps(body), status=200, mimetype="application/json")


@bp.get("/v1/holds")
def list_holds() -> Any:
    caller = principal("admin", "service", "auditor")
    state = request.args.get("state")
    if state is not None and state not in holds.STATES:
        raise field_error("state", f"must be one of {', '.join(holds.STATES)}")
    dataset_id = None
    if (name := request.args.get("dataset")) is not None:
        dataset_id, _ = ledger_reads.ids_of(db(), name, None)
        if dataset_id is not None and not caller.may_read(dataset_id):
            raise Forbidden(f"dataset {name!r} is not granted to {caller.name!r}")
    listed = holds.listing(
        db(), caller, runtime().clock.now_us(), dataset_id=dataset_id, state=state
    )
    return {"holds": listed}


@bp.get("/v1/holds/<uuid:hold_uuid>")
def show(hold_uuid: uuid.UUID) -> Any:
    caller = principal("admin", "service", "auditor")
    return holds.show(db(), str(hold_uuid), caller, runtime().clock.now_us())
