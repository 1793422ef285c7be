"""/v1/charges: the noise token. Validate, charge, run the mechanism, commit, respond."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, request
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from accountant.accounting.modes import MODES
from accountant.accounting.pricing import Denial
from accountant.accounting.windows import isoformat
from accountant.alerts import crossings
from accountant.api import schemas
from accountant.api.auth import principal
from accountant.api.common import db, driver, json_body, now_us, runtime
from accountant.driver import Driver
from accountant.errors import (
    BudgetExhausted,
    Forbidden,
    IdempotencyKeyReused,
    MechanismFailed,
    NotFound,
    ProblemError,
    ReplayUnavailable,
    WindowExhausted,
    field_error,
)
from accountant.exact import Amount
from accountant.jsonio import dumps
from accountant.mechanism import Mechanism
from accountant.models import Consumer, Dataset, LedgerEntry
from accountant.services import charges, idempotency, receipts
from accountant.services.charges import ChargeRequest, ChargeResult, Evaluation
from accountant.services.consumers import Principal

bp = Blueprint("charges", __name__)
log = logging.getLogger(__name__)


def _mechanism(body: dict[str, Any]) -> Mechanism:
    mechanism = runtime().registry.get(body["mechanism"])
    if mechanism is None:
        known = [m.name for m in runtime().registry.all()]
        raise field_error("mechanism", f"unknown mechanism {body['mechanism']!r}; "
                                       f"registered: {known} (GET /v1/mechanisms)")
    return mechanism


def _request(body: dict[str, Any], caller: Principal) -> ChargeRequest:
    """Everything that can be checked before the transaction: mechanism, params, input."""
    mechanism = _mechanism(body)
    params = dict(body["params"])
    unit = params.pop("sensitivity_unit", None)
    if unit not in (None, "record"):
        raise field_error("params.sensitivity_unit", "must be 'record' when given")
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
    partitions = body["partitions"]
    limit = runtime().settings.max_partitions_per_charge
    if isinstance(partitions, list) and len(partitions) > limit:
        raise field_error("partitions", f"at most {limit} partition keys per charge; "
                                        "charge '*' or split the release")
    return ChargeRequest(body["dataset"], partitions, body.get("release", "joint"), mechanism,
                         params, unit, caller, data, runtime().noise.id)


def _check_vector_limits(data: dict[str, Any]) -> None:
    limit = runtime().settings.max_vector_length
    for name, value in data.items():
        if isinstance(value, list) and len(value) > limit:
            raise field_error(f"input.{name}", f"at most {limit} values per vector")
        if name == "size" and isinstance(value, int) and value > limit:
            raise field_error("input.size", f"at most {limit} values per vector")


@dataclass(frozen=True)
class _Fresh:
    """A charge made by this request, with its output when granted (computed before commit)."""

    result: ChargeResult
    output: dict[str, Any] | None
    output_sha256: str | None
    outcome: idempotency.Outcome | None  # the remembered response, for a request with a key


@bp.post("/v1/charges")
def create() -> Any:
    caller = principal("admin", "service")
    body = json_body(schemas.CHARGE)
    key = idempotency.key_of(body, request.headers.get("Idempotency-Key"))
    charge_request = _request(body, caller)
    fingerprint = idempotency.fingerprint(body)
    connection = driver()
    for attempt in (1, 2):
        connection.begin_write()
        try:
            with connection.pipeline():
                done = _charge_once(connection, charge_request, key, fingerprint)
                connection.commit()
            break
        except IntegrityError:
            # PostgreSQL only: a duplicate with the same key on another dataset committed
            # between our read and our insert; everything rolled back, so read it again.
            connection.rollback()
            if key is None or attempt == 2:
                raise
        except Exception:
            connection.rollback()
            raise
    if isinstance(done, idempotency.Outcome):
        return _replay(done, charge_request)  # a replay: no new alerts
    evaluation = done.result.evaluation
    if evaluation.granted:  # after the commit, never failing the charge
        runtime().signer_published[0] = True  # committed with the charge
        runtime().alerts.fire(crossings(
            evaluation.checks, evaluation.mode.components, runtime().settings.alert_thresholds,
            dataset=evaluation.dataset.name, consumer=charge_request.principal.name,
            charge_id=done.result.charge_id, at=done.result.created_at / 1e6))
    outcome = done.outcome or _outcome(done, charge_request, fingerprint)
    return _render(outcome, done.output)


def _charge_once(connection: Driver, charge_request: ChargeRequest, key: str | None,
                 fingerprint: str) -> idempotency.Outcome | _Fresh:
    """Lock the dataset, then replay a known key, or charge, run the mechanism and remember
    the response of a request with a key; the caller commits. Without a key, the receipt is
    signed after the commit."""
    consumer_id = charge_request.principal.consumer_id
    reads = charges.send_reads(connection, charge_request, time.time(), lock=True)
    # Sent after the lock: a duplicate that waited for it sees the first one's row.
    remembered = None if key is None else idempotency.find(connection, consumer_id, key)
    reads.dataset.result()  # no such dataset: a 404 before anything else
    if remembered is not None:
        stored = remembered.result()
        if stored is not None:
            if stored.request_hash != fingerprint:
                raise IdempotencyKeyReused(
                    f"idempotency key {key!r} was first used with a different request; "
                    "use a new key for a new request")
            return stored
    result = charges.charge(connection, reads, charge_request, now_us())
    output = digest = None
    if result.evaluation.granted:
        output, digest = _run(charge_request, result)
        if not runtime().signer_published[0]:
            receipts.publish(connection, runtime().signer, now_us())
    fresh = _Fresh(result, output, digest, None)
    if key is None:
        return fresh
    outcome = _outcome(fresh, charge_request, fingerprint)
    idempotency.remember(connection, consumer_id, key, outcome, now_us())
    return _Fresh(result, output, digest, outcome)


def _run(charge_request: ChargeRequest, result: ChargeResult) -> tuple[dict[str, Any], str]:
    """Run the mechanism inside the charge's transaction: if it fails, nothing is charged."""
    mechanism = charge_request.mechanism
    try:
        output = mechanism.run(result.evaluation.priced.run_params, charge_request.data or {},
                               runtime().noise.source_for(result.charge_id))
        return output, receipts.output_sha256(output)
    except Exception as error:  # a plugin's run may raise anything
        log.error("mechanism failed after its preparation passed; the charge is rolled back",
                  extra={"mechanism": mechanism.name, "implementation": mechanism.implementation,
                         "error": repr(error)[:500]}, exc_info=True)
        raise MechanismFailed(
            f"mechanism {mechanism.name!r} failed to run ({type(error).__name__}); nothing was "
            "charged. This is a bug of its plugin, and it has been logged; report it to the "
            f"plugin's authors ({mechanism.implementation})") from None


def _outcome(fresh: _Fresh, charge_request: ChargeRequest,
             fingerprint: str) -> idempotency.Outcome:
    """The response of a charge as remembered: a denial's problem, or the grant without its
    output (regenerated from the charge's random source on replay, and checked against
    ``output_sha256``) but with its receipt."""
    result = fresh.result
    evaluation = result.evaluation
    if evaluation.denial is not None:
        problem = _denial_problem(evaluation, evaluation.denial, result.charge_id)
        return idempotency.outcome(fingerprint, result.charge_id, problem.status,
                                   problem.body(), problem.headers)
    assert fresh.output is not None and fresh.output_sha256 is not None
    body = idempotency.plain({
        "charge_id": result.charge_id,
        "dataset": evaluation.dataset.name,
        "mechanism": charge_request.mechanism.name,
        "release": charge_request.release,
        "partitions": evaluation.partitions,
        "cost": _report(evaluation, evaluation.priced.cost),
        "multiplicity": evaluation.priced.multiplicity,
        "charged": _report(evaluation, evaluation.priced.cost.scaled(
            evaluation.priced.multiplicity)),
        "remaining": _report(evaluation, evaluation.remaining),
        "created_at": isoformat(result.created_at / 1e6),
        "run_params": idempotency.encode_params(evaluation.priced.run_params),
        "output_sha256": fresh.output_sha256,
    })
    body["receipt"] = receipts.receipt(
        runtime().signer, charge_id=result.charge_id, dataset=body["dataset"],
        partitions=body["partitions"], mechanism=body["mechanism"], cost=body["cost"],
        multiplicity=body["multiplicity"], charged=body["charged"],
        output_sha256=fresh.output_sha256, issued_at=result.created_at // 1_000_000)
    return idempotency.outcome(fingerprint, result.charge_id, 201, body, {})


def _render(outcome: idempotency.Outcome, output: dict[str, Any] | None) -> Response:
    """The response of a charge, first time or replay alike, from what is remembered."""
    stored = outcome.body
    if outcome.status != 201:
        response = Response(dumps(stored), status=outcome.status,
                            mimetype="application/problem+json")
    else:
        # multiplicity and charged are remembered since they were added, so a replay of an
        # older charge stays identical
        shown = ("charge_id", "dataset", "mechanism", "release", "partitions", "cost",
                 "multiplicity", "charged")
        body: dict[str, Any] = {k: stored[k] for k in shown if k in stored}
        body.update({"output": output, "remaining": stored["remaining"],
                     "receipt": stored["receipt"], "created_at": stored["created_at"]})
        response = Response(dumps(body), status=201, mimetype="application/json")
    for name, value in outcome.headers.items():
        response.headers[name] = value
    return response


def _replay(outcome: idempotency.Outcome, charge_request: ChargeRequest) -> Response:
    """The first response again, its output regenerated from the charge's random source. An
    output that cannot be regenerated exactly is refused, never drawn afresh."""
    if outcome.status != 201:
        return _render(outcome, None)
    stored = outcome.body
    mechanism = charge_request.mechanism
    why = None
    if "output_sha256" not in stored:
        why = "it was recorded before this service kept what a replay needs"
    elif outcome.noise_secret != runtime().noise.id:
        why = (f"its noise was drawn with noise secret {outcome.noise_secret}, and this host "
               f"has {runtime().noise.id}")
    elif outcome.implementation != mechanism.implementation:
        why = (f"it was produced by {outcome.implementation}, and this service runs "
               f"{mechanism.implementation}")
    output = None
    if why is None:
        try:
            output = mechanism.run(idempotency.decode_params(stored["run_params"]),
                                   charge_request.data or {},
                                   runtime().noise.source_for(outcome.charge_id))
        except Exception as error:  # a plugin's run may raise anything
            log.error("a replay's mechanism failed", extra={
                "mechanism": mechanism.name, "error": repr(error)[:500]})
            why = f"its mechanism failed when run again ({type(error).__name__})"
        if output is not None and receipts.output_sha256(output) != stored["output_sha256"]:
            log.error("a replay's output differs from the first; its implementation changed "
                      "without a new version", extra={"implementation": mechanism.implementation,
                                                      "charge_id": outcome.charge_id})
            why = "regenerated, its output differs from the first one"
    if why is not None:
        raise ReplayUnavailable(
            f"the first response to this request (charge {outcome.charge_id}) cannot be "
            f"given again exactly: {why}. Nothing is released: a retry never draws new noise. "
            "The charge stands (GET /v1/charges/{id}); send a new request with a new "
            "idempotency key for a new release, which is charged again",
            extra={"charge_id": outcome.charge_id})
    return _render(outcome, output)


@bp.post("/v1/charges/preview")
def preview() -> Any:
    caller = principal("admin", "service", "auditor")
    body = json_body(schemas.PREVIEW)
    charge_request = _request(body, caller)
    connection = driver()
    connection.begin_read()
    try:
        with connection.pipeline():
            now = time.time()
            reads = charges.send_reads(connection, charge_request, now)
            evaluation = charges.evaluate(connection, reads, charge_request, now)
    finally:
        connection.rollback()
    dataset = evaluation.dataset
    denial = evaluation.denial
    return {
        "granted": denial is None,
        "dataset": dataset.name,
        "partitions": evaluation.partitions,
        "cost": _report(evaluation, evaluation.priced.cost),
        "multiplicity": evaluation.priced.multiplicity,
        "remaining_after": _report(evaluation, evaluation.remaining),
        "scope": None if denial is None else denial.scope,
        "reason": None if denial is None else _reason(evaluation, denial),
    }


def _report(evaluation: Evaluation, amount: Amount) -> dict[str, Any]:
    return evaluation.mode.report(amount, evaluation.dataset.limit_delta or 0)


def _limit_report(evaluation: Evaluation, denial: Denial) -> dict[str, Any]:
    names = evaluation.mode.components
    limited = Amount(**{n: v for n in names if (v := denial.limit[n]) is not None})
    report = _report(evaluation, limited)
    if evaluation.mode.name == "zcdp":
        return report
    return {k: v for k, v in report.items() if denial.limit[k] is not None}  # type: ignore[index]


def _reason(evaluation: Evaluation, denial: Denial) -> str:
    where = {"dataset": "the dataset's lifetime budget",
             "partition": f"the budget of partition {denial.partition!r}",
             "consumer": "your quota on this dataset",
             "window": "the current window budget"}[denial.scope]
    text = (f"this charge would exceed {where}: limit {_plain(_limit_report(evaluation, denial))}"
            f", spent {_plain(_report(evaluation, denial.spent))}, requested "
            f"{_plain(_report(evaluation, denial.requested))}")
    if denial.window is not None:
        text += f"; the window resets at {isoformat(denial.window.end)}"
    return text


def _plain(amount: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in amount.items())


def _denial_problem(evaluation: Evaluation, denial: Denial, charge_id: str) -> ProblemError:
    extra: dict[str, Any] = {
        "scope": denial.scope,
        "limit": _limit_report(evaluation, denial),
        "spent": _report(evaluation, denial.spent),
        "requested": _report(evaluation, denial.requested),
        "charge_id": charge_id,
    }
    if denial.partition is not None and denial.scope == "partition":
        extra["partition"] = denial.partition
    reason = _reason(evaluation, denial)
    if denial.window is not None:
        extra["resets_at"] = isoformat(denial.window.end)
        if not evaluation.never_fits:
            wait = denial.window.seconds_until_end(time.time())
            return WindowExhausted(reason, extra=extra, headers={"Retry-After": str(wait)})
        reason += "; its cost alone exceeds the window limit, so waiting will not help"
    return BudgetExhausted(reason, extra=extra)


@bp.get("/v1/charges/<uuid:charge_uuid>")
def show(charge_uuid: uuid.UUID) -> Any:
    charge_id = str(charge_uuid)
    caller = principal("admin", "service", "auditor")
    row = db().execute(
        select(LedgerEntry, Dataset, Consumer.name)
        .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
        .outerjoin(Consumer, Consumer.id == LedgerEntry.consumer_id)
        .where(LedgerEntry.charge_id == charge_id)).first()
    if row is None:
        raise NotFound(f"no charge with id {charge_id!r}")
    entry, dataset, consumer = row
    if caller.role == "service" and entry.consumer_id != caller.consumer_id:
        raise Forbidden("a service may read only its own charges")
    return describe_charge(entry, dataset, consumer)


def describe_charge(entry: LedgerEntry, dataset: Dataset, consumer: str | None) -> dict[str, Any]:
    return {
        "charge_id": entry.charge_id,
        "dataset": dataset.name,
        "consumer": consumer,
        "status": entry.status,
        "mechanism": entry.mechanism,
        "release": entry.release,
        "partitions": entry.partitions,
        "params": entry.params,
        "cost": MODES[dataset.accounting].report(entry.cost, dataset.limit_delta or 0),
        "multiplicity": entry.multiplicity,
        "denial": entry.detail or None,
        "created_at": isoformat(entry.created_at / 1e6),
    }
