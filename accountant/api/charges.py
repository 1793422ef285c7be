"""/v1/charges: the noise token. Parse the request, submit it, render what it became."""

from __future__ import annotations

import uuid
from dataclasses import replace
from decimal import Decimal
from typing import Any

from flask import Blueprint, Response, request

from accountant import problems
from accountant.accounting.windows import isoformat
from accountant.api import schemas
from accountant.api.auth import confirm, confirmed_on_failure, principal
from accountant.api.common import items_named, json_body
from accountant.errors import BudgetExhausted, InvalidRequest, WindowExhausted, field_error
from accountant.jsonio import dumps
from accountant.mechanism import Mechanism
from accountant.services import charge_records, charges, evaluation, idempotency, plans
from accountant.services.api_keys import Principal
from accountant.services.charge_responses import accuracy, reason, report, report_cost
from accountant.services.evaluation import ChargeRequest
from accountant.web import db, driver, runtime

bp = Blueprint("charges", __name__)


def _mechanism(body: dict[str, Any]) -> Mechanism:
    return mechanism_named(body["mechanism"])


def mechanism_named(name: str) -> Mechanism:
    """The mechanism a charge, preview or plan names: one the accountant runs."""
    registry = runtime().registry
    mechanism = registry.get(name)
    if mechanism is None:
        known = ", ".join(m.name for m in registry.all() if m.runs)
        raise field_error(
            "mechanism",
            f'no mechanism named "{name}"; use one of {known} (GET /v1/mechanisms)',
        )
    if not mechanism.runs:
        raise field_error(
            "mechanism",
            f"{mechanism.name!r} is accounting-only: the accountant cannot run it, so it prices "
            "holds for jobs that run elsewhere (POST /v1/holds), never a charge",
        )
    return mechanism


def charge_request(body: dict[str, Any], caller: Principal) -> ChargeRequest:
    """Everything that can be checked before the transaction: mechanism, params, input."""
    mechanism = _mechanism(body)
    params = dict(body["params"])
    unit = params.pop("sensitivity_unit", None)
    if unit not in (None, "record"):
        raise field_error(
            "params.sensitivity_unit", f'must be "record" when given; got {dumps(unit)}'
        )
    schemas.validate(mechanism.params_schema, params, "params")
    data = body.get("input")
    if data is not None:
        schemas.validate(mechanism.input_schema, data, "input")
        _check_vector_limits(data)
        if mechanism.check_input is not None:
            try:
                mechanism.check_input(data)
            except ValueError as error:
                raise field_error("input", str(error)) from None
    return ChargeRequest(
        dataset=body["dataset"],
        partitions=checked_partitions(body["partitions"]),
        release=body.get("release", "joint"),
        mechanism=mechanism,
        params=params,
        sensitivity_unit=unit,
        principal=caller,
        data=data,
        noise_secret=runtime().charging.noise.id,
        draw=body.get("hold"),
    )


def checked_partitions(partitions: list[str] | str) -> list[str] | str:
    """A request's partitions, within the configured count and each a valid key."""
    limit = runtime().settings.max_partitions_per_charge
    if isinstance(partitions, list) and len(partitions) > limit:
        raise field_error(
            "partitions",
            f"at most {limit} partition keys per charge; charge '*' or split the release",
        )
    if isinstance(partitions, list):
        schemas.check_partition_keys(partitions, "partitions")
    return partitions


def _check_vector_limits(data: dict[str, Any]) -> None:
    limit = runtime().settings.max_vector_length
    for name, value in data.items():
        if isinstance(value, list) and len(value) > limit:
            raise field_error(f"input.{name}", f"at most {limit} values per vector")
        if name == "size" and isinstance(value, int) and value > limit:
            raise field_error("input.size", f"at most {limit} values per vector")


@bp.post("/v1/charges")
def create() -> Any:
    caller = principal("admin", "service", remembered=True)  # its key is read under the lock
    with confirmed_on_failure():
        body = json_body(schemas.CHARGE)
        key = idempotency.key_of(body, request.headers.get("Idempotency-Key"))
        fingerprint = idempotency.fingerprint(body)
        try:
            asked = replace(charge_request(body, caller), key=key, fingerprint=fingerprint)
        except InvalidRequest:
            first = known_answer(caller, key, fingerprint)
            if first is None:
                raise
            return answer(first.facts, _output_again(first, body))
        done = charges.submit(driver(), asked, runtime().charging)
    return answer(done.facts, None if isinstance(done, charges.Denied) else done.output)


def known_answer(
    caller: Principal, key: str | None, fingerprint: str
) -> idempotency.Remembered | None:
    """For a request refused as it stands (a 400), the first answer to its key, if it has
    one: a retry of a committed request gets that answer, whatever changed since (a
    mechanism disabled, a lower vector limit), never a 400, which says nothing was charged."""
    if key is None:
        return None
    confirm()  # a key revoked since gets a 401, as under the lock of a charge
    return idempotency.first_answer(driver(), caller.consumer_id, key, fingerprint)


def running_here(name: str) -> Mechanism | None:
    """The mechanism ``name`` if it is registered here now and runs: what a replay makes its
    output again with (None: ``idempotency.output_of`` refuses, releasing nothing)."""
    mechanism = runtime().registry.get(name)
    return mechanism if mechanism is not None and mechanism.runs else None


def _output_again(first: idempotency.Remembered, body: dict[str, Any]) -> dict[str, Any] | None:
    """The first answer's output, regenerated by the mechanism the body names if it runs
    here now; else a 409 that releases nothing (``idempotency.output_of``)."""
    return idempotency.output_of(
        first, running_here(body["mechanism"]), body.get("input"), runtime().charging.noise
    )


def answer(facts: dict[str, Any], output: dict[str, Any] | None) -> Response:
    """A charge's answer from its facts (``services.charge_responses``): the first answer
    and every replay of it alike."""
    if facts["kind"] == "denied":
        return problems.response(problems.of(_denial(facts)))
    return Response(dumps(granted_body(facts, output)), status=201, mimetype="application/json")


def granted_body(facts: dict[str, Any], output: dict[str, Any] | None) -> dict[str, Any]:
    """A granted charge's 201 body from its facts (a batch's items' too)."""
    # multiplicity, charged, ledger and accuracy are remembered since they were added, so
    # a replay of an older charge gives what its first answer gave
    body: dict[str, Any] = {k: facts[k] for k in _GRANT_HEAD if k in facts}
    body.update(
        {
            "output": output,
            "remaining": facts["remaining"],
            "receipt": facts["receipt"],
            "created_at": facts["created_at"],
        }
    )
    body.update({k: facts[k] for k in ("ledger", "accuracy", "hold_id") if k in facts})
    return body


_GRANT_HEAD = (
    "charge_id",
    "dataset",
    "mechanism",
    "release",
    "partitions",
    "cost",
    "multiplicity",
    "charged",
)


def _denial(facts: dict[str, Any]) -> BudgetExhausted:
    """A denial's domain error: a 429 with Retry-After while waiting will help."""
    facts_named = (
        "scope",
        "limit",
        "spent",
        "requested",
        "multiplicity",
        "charge_id",
        "hold_id",
        "hold_state",
        "partition",
        "population",
        "resets_at",
    )
    extra = {k: facts[k] for k in facts_named if k in facts}
    wait = facts.get("fits_again_in_s")
    if wait is None:
        return BudgetExhausted(facts["reason"], extra=extra)
    return WindowExhausted(facts["reason"], extra=extra, retry_after=wait)


@bp.post("/v1/charges/preview")
def preview() -> Any:
    caller = principal("admin", "service", "auditor")
    body = json_body(schemas.PREVIEW)
    evaluated = evaluation.preview(driver(), charge_request(body, caller), runtime().clock.now_us())
    denial = evaluated.denial
    return {
        "granted": denial is None,
        "dataset": evaluated.dataset.name,
        "partitions": evaluated.partitions,
        "cost": report_cost(evaluated, evaluated.priced.cost),
        "multiplicity": evaluated.priced.multiplicity,
        "remaining_after": report(evaluated, evaluated.remaining, bound=True),
        "scope": None if denial is None else denial.scope,
        **(
            {} if denial is None or denial.population is None else {"population": denial.population}
        ),
        "reason": None if denial is None else reason(evaluated, denial),
        "accuracy": _accuracy(evaluated, body),
    }


@bp.post("/v1/charges/plan")
def plan() -> Any:
    """How many more identical charges every scope would grant now."""
    caller = principal("admin", "service", "auditor")
    with items_named():  # a refused number in a weighted list names its item
        body = json_body(schemas.ANY_OBJECT)  # one form or the other, each checked in full
    if "items" in body:  # a weighted list: the least noise for each (api.batches)
        from accountant.api.batches import calibrated

        return calibrated(body, caller)
    schemas.validate(schemas.PLAN, body)
    if "count" in body:
        return _solve(body, caller)
    found = plans.plan(driver(), charge_request(body, caller), runtime().clock.now_us())
    evaluated, limited_by = found.evaluation, found.limited_by
    return {
        "fits": found.fits,
        "limited_by": {
            "scope": limited_by.scope,
            "partition": limited_by.partition if limited_by.scope == "partition" else None,
        }
        | ({} if limited_by.population is None else {"population": limited_by.population})
        | ({} if limited_by.window is None else {"resets_at": isoformat(limited_by.window.end)}),
        "dataset": evaluated.dataset.name,
        "partitions": evaluated.partitions,
        "cost": report_cost(evaluated, evaluated.priced.cost),
        "multiplicity": evaluated.priced.multiplicity,
        "accuracy": _accuracy(evaluated, body),
    }


def _accuracy(evaluated: evaluation.Evaluation, body: dict[str, Any]) -> dict[str, Any] | None:
    """The accuracy of the charge as evaluated, at the parameters it would run with."""
    return accuracy(_mechanism(body), evaluated.priced.run_params, body.get("input"))


def _solve(body: dict[str, Any], caller: Principal) -> dict[str, Any]:
    """The least-noise value of the parameter the body leaves out such that ``count``
    identical charges fit."""
    params = body["params"]
    name = noise_parameter(_mechanism(body), params, "with count, leave out")
    asked = charge_request({**body, "params": {**params, name: Decimal(1)}}, caller)
    try:
        solved = plans.solve(
            driver(),
            replace(asked, params={k: v for k, v in asked.params.items() if k != name}),
            name,
            body["count"],
            runtime().clock.now_us(),
        )
    except plans.NothingFits as error:
        raise field_error("count", f"{error}; ask for fewer charges") from None
    except InvalidRequest as error:
        takes_delta = "delta" in _mechanism(body).params_schema.get("properties", {})
        if name == "epsilon" or not takes_delta or "delta" in params:
            raise
        # a gaussian left without sigma or epsilon is solved for sigma, which pure and
        # approx datasets do not price: say how to have epsilon solved for instead
        hint = "; on a pure or approx dataset state delta, and the plan solves for epsilon"
        error.errors = [{**e, "message": e["message"] + hint} for e in error.errors or []]
        error.detail += hint
        error.args = (error.detail,)
        raise
    evaluated = solved.evaluation
    return {
        "params": {name: solved.value},
        "count": body["count"],
        "dataset": evaluated.dataset.name,
        "partitions": evaluated.partitions,
        "cost": report_cost(evaluated, evaluated.priced.cost),
        "multiplicity": evaluated.priced.multiplicity,
        "accuracy": _accuracy(evaluated, body),
    }


def noise_parameter(mechanism: Mechanism, params: dict[str, Any], ask: str) -> str:
    """The noise parameter ``params`` leave out for a plan to solve for: the one that makes
    them valid (a 400 beginning with ``ask`` if there is none). ``sensitivity_unit`` is the
    core's parameter, not the mechanism's, and is left out of that check."""
    own = {k: v for k, v in params.items() if k != "sensitivity_unit"}
    for name in plans.NOISE_PARAMETERS:
        if name not in own and schemas.is_valid(mechanism.params_schema, {**own, name: Decimal(1)}):
            return name
    raise field_error(
        "params",
        f"{ask} the noise parameter to solve for (one of {sorted(plans.NOISE_PARAMETERS)})",
    )


@bp.get("/v1/charges/<uuid:charge_uuid>")
def show(charge_uuid: uuid.UUID) -> Any:
    caller = principal("admin", "service", "auditor")
    record = charge_records.describe(db(), str(charge_uuid), caller)
    mechanism = runtime().registry.get(record["mechanism"] or "")
    if mechanism is not None:
        record["params"] = charge_records.with_numbers(record["params"], mechanism.params_schema)
    return record
