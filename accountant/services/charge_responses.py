"""What a charge's answer states: its facts, remembered for its idempotency key.

A grant's facts are its charge id, amounts, run parameters, the SHA-256 of
its output (never the output itself, regenerated on replay,
``idempotency.output_of``) and its signed receipt; a denial's are the scope,
its limit, what was spent and what was requested, and whether and when a
retry may succeed. ``api.charges.answer`` renders them, first time and on
replay alike; preview and plan state what it would (``report``, ``reason``,
``accuracy``). Amounts
are reported in the dataset's mode (``Mode.report``), labelled with the field that adds
up (``Mode.labelled``); the receipt signs the figures alone, as it always has.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accountant.accounting.charge_inputs import DatasetState, PlanShare
from accountant.accounting.checks import Denial
from accountant.accounting.modes import LABELS
from accountant.accounting.windows import isoformat
from accountant.exact import DELTA, EPSILON, SATURATION, Amount, positional
from accountant.mechanism import CONFIDENCE, Accuracy, Mechanism, Number
from accountant.services import idempotency, ledger, receipts
from accountant.services.evaluation import ChargeRequest, Evaluation

log = logging.getLogger(__name__)


def granted(
    evaluation: Evaluation,
    request: ChargeRequest,
    charge_id: str,
    created_at: int,
    output_sha256: str,
    head: ledger.ChainHead,
    signer: Ed25519PrivateKey,
) -> dict[str, Any]:
    """A grant's facts: everything its answer states but the output, with its signed
    receipt. Both carry the charge's ledger entry (its seq and hash, the dataset's chain
    head right after it), so that every receipt anchors the chain: a ledger cut back behind
    it shows."""
    priced = evaluation.priced
    body: dict[str, Any] = idempotency.decimals_as_floats(
        {
            "kind": "granted",
            "charge_id": charge_id,
            "dataset": evaluation.dataset.name,
            "mechanism": request.mechanism_to_run.name,
            "release": request.release,
            "partitions": evaluation.partitions,
            "cost": report_cost(evaluation, priced.cost),
            "multiplicity": priced.multiplicity,
            "charged": report_cost(evaluation, evaluation.charged),
            "remaining": report(evaluation, evaluation.remaining, bound=True),
            "created_at": isoformat(created_at / 1e6),
            "run_params": idempotency.encode_params(priced.run_params),
            "output_sha256": output_sha256,
            "ledger": {"seq": head.seq, "hash": head.hash},
            "accuracy": accuracy(request.mechanism_to_run, priced.run_params, request.data),
        }
    )
    if request.draw is not None:
        body["hold_id"] = request.draw
    body["receipt"] = receipts.receipt(
        signer,
        charge_id=charge_id,
        dataset=body["dataset"],
        partitions=body["partitions"],
        mechanism=body["mechanism"],
        cost=figures(body["cost"]),
        multiplicity=body["multiplicity"],
        charged=figures(body["charged"]),
        output_sha256=output_sha256,
        ledger=body["ledger"],
        issued_at=created_at // 1_000_000,
        hold_id=request.draw,
        batch=None if request.share is None else batch_detail(request.share),
    )
    return body


def held(
    evaluation: Evaluation,
    request: ChargeRequest,
    created_at: int,
    head: ledger.ChainHead,
    signer: Ed25519PrivateKey,
) -> dict[str, Any]:
    """A granted hold's facts, with its signed receipt (``kind`` ``hold``): its amount,
    charged in full at once, nothing drawn yet, and its expiry."""
    assert request.hold is not None and evaluation.expires_at is not None
    priced = evaluation.priced
    body: dict[str, Any] = idempotency.decimals_as_floats(
        {
            "kind": "hold",
            "hold_id": request.hold.hold_id,
            "dataset": evaluation.dataset.name,
            "partitions": evaluation.partitions,
            "release": request.release,
            "mechanism": None if request.mechanism is None else request.mechanism.name,
            "amount": report_cost(evaluation, priced.cost),
            "multiplicity": priced.multiplicity,
            "charged": report_cost(evaluation, evaluation.charged),
            "drawn": report_cost(evaluation, Amount()),
            "state": "open",
            "expires_at": isoformat(evaluation.expires_at / 1e6),
            "purpose": request.hold.purpose,
            "remaining": report(evaluation, evaluation.remaining, bound=True),
            "created_at": isoformat(created_at / 1e6),
            "ledger": {"seq": head.seq, "hash": head.hash},
        }
    )
    body["receipt"] = receipts.hold_receipt(
        signer,
        hold_id=body["hold_id"],
        dataset=body["dataset"],
        partitions=body["partitions"],
        release=body["release"],
        mechanism=body["mechanism"],
        amount=figures(body["amount"]),
        multiplicity=body["multiplicity"],
        charged=figures(body["charged"]),
        expires_at=body["expires_at"],
        ledger=body["ledger"],
        issued_at=created_at // 1_000_000,
    )
    return body


def denied(evaluation: Evaluation, charge_id: str, now_us: int) -> dict[str, Any]:
    """A denial's facts: the scope, its limit, what was spent and requested (per release,
    with the multiplicity the running totals count it at), and for a
    window that will reset, when, and in how many seconds a retry may succeed (unless the
    charge could never fit in it)."""
    denial = evaluation.denial
    assert denial is not None
    facts: dict[str, Any] = {
        "kind": "denied",
        "charge_id": charge_id,
        "scope": denial.scope,
        "limit": _limit_report(evaluation, denial),
        "spent": report(evaluation, denial.spent, _delta_of(evaluation, denial)),
        "requested": report_cost(evaluation, denial.requested),
        "multiplicity": evaluation.priced.multiplicity,
    }
    if denial.partition is not None and denial.scope == "partition":
        facts["partition"] = denial.partition
    if denial.population is not None:
        facts["population"] = denial.population
    if denial.hold_state is not None:  # open (over the remainder), settled or expired
        facts["hold_state"] = denial.hold_state
    text = reason(evaluation, denial)
    if denial.window is not None:
        facts["resets_at"] = isoformat(denial.window.end)
        if evaluation.never_fits:
            text += "; by itself it would exceed the window limit, so waiting will not help"
        else:
            facts["fits_again_in_s"] = denial.window.seconds_until_end(now_us / 1e6)
    facts["reason"] = text
    stored: dict[str, Any] = idempotency.decimals_as_floats(facts)
    return stored


def report(
    evaluation: Evaluation, amount: Amount, delta: int | None = None, *, bound: bool = False
) -> dict[str, Any]:
    """``amount`` as the dataset's mode states it (with epsilon at its delta for zcdp, or at
    ``delta``, a population's); ``bound``: a limit or what remains of one (``Mode.report``)."""
    mode = evaluation.mode
    at = evaluation.dataset.limit_delta if delta is None else delta
    return mode.labelled(mode.report(amount, at or 0, bound=bound), amount)


def _delta_of(evaluation: Evaluation, denial: Denial) -> int | None:
    """The delta a denying scope's amounts are stated at: its population's, for a
    population, else the dataset's."""
    population = evaluation.dataset.population
    if denial.scope == "population" and population is not None:
        return population.limit.delta
    return evaluation.dataset.limit_delta


def report_cost(evaluation: Evaluation, amount: Amount) -> dict[str, Any]:
    """A release's cost as the dataset's mode states it (``Mode.report_cost``)."""
    mode = evaluation.mode
    return mode.labelled(mode.report_cost(amount, evaluation.dataset.limit_delta or 0), amount)


def report_cost_of(dataset: DatasetState, amount: Amount) -> dict[str, Any]:
    """``report_cost`` for a dataset as read, without a decision (a plan's)."""
    mode = dataset.mode
    stated = mode.labelled(mode.report_cost(amount, dataset.limit_delta or 0), amount)
    return dict(idempotency.decimals_as_floats(stated))


def figures(amount: dict[str, Any]) -> dict[str, Any]:
    """An amount's figures as ``Mode.report`` states them, without the labels (what a
    receipt signs)."""
    return {k: v for k, v in amount.items() if k not in LABELS}


def reason(evaluation: Evaluation, denial: Denial) -> str:
    """One sentence: which scope, its limit, what is spent and what was asked for."""
    if denial.scope == "hold" and denial.hold_state != "open":
        return (
            f"the hold is {denial.hold_state}: nothing more can be drawn on it; make a new "
            "hold (POST /v1/holds) or charge without one"
        )
    where = {
        "hold": "the hold's remainder (its amount less what charges drew from it)",
        "dataset": "the dataset's lifetime budget",
        "population": f"the lifetime budget of population {denial.population!r}, the sum of "
        "its datasets' losses",
        "partition": f"the budget of partition {denial.partition!r}",
        "consumer": "your quota on this dataset",
        "window": f"the current {denial.window.name} window budget"
        if denial.window is not None
        else "the current window budget",
    }[denial.scope]
    text = (
        f"this charge would exceed {where}: limit "
        f"{_text(_limit_report(evaluation, denial))}, spent "
        f"{_text(report(evaluation, denial.spent, _delta_of(evaluation, denial)))}, requested "
        f"{_text(report_cost(evaluation, denial.requested), alone=True)}"
    )
    multiplicity = evaluation.priced.multiplicity
    # a partition counts a release once, and a hold's remainder a draw's cost per release
    if multiplicity > 1 and denial.scope not in ("partition", "hold"):
        text += f" per release, {multiplicity} releases counted (a parallel release)"
    if denial.window is not None:
        text += f"; the window resets at {isoformat(denial.window.end)}"
    if SATURATION in (denial.requested.epsilon, denial.requested.delta, denial.requested.rho):
        text += (
            "; the cost requested is larger still: costs are recorded up to that figure, "
            "which is beyond any limit"
        )
    return text


def _limit_report(evaluation: Evaluation, denial: Denial) -> dict[str, Any]:
    mode = evaluation.mode
    limited = Amount(**{n: v for n in mode.components if (v := denial.limit[n]) is not None})
    stated = mode.report(limited, _delta_of(evaluation, denial) or 0, bound=True)
    if not mode.converts:
        stated = {k: v for k, v in stated.items() if denial.limit[k] is not None}  # type: ignore[index]  # k is a component name
    return mode.labelled(stated, limited)


def _text(amount: dict[str, Any], *, alone: bool = False) -> str:
    """An amount in words: the figures that add up, and where epsilon does not, the epsilon
    beside them (for a cost, the epsilon of that cost by itself)."""
    text = ", ".join(f"{name} {positional(amount[name])}" for name in amount["additive"])
    if "epsilon_alone" in amount:
        epsilon = positional(amount["epsilon_alone"])
        text += f" (epsilon {epsilon}{' by itself' if alone else ''})"
    return text


# The accuracy a grant, preview or plan states: the mechanism's ``Accuracy`` as JSON.
#
# Figures are doubles rounded toward the safe side: a half-width up (it still
# covers 95%), a probability of the truth down, a scale and a grid to nearest.
# A figure beyond the largest double is null. A mechanism that states no
# accuracy, or whose ``accuracy`` fails (logged as a bug of the plugin), is
# answered with null: accuracy not stated, never a guess.


def accuracy(
    mechanism: Mechanism, run_params: Mapping[str, Any], data: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """What ``mechanism`` states of its accuracy at the parameters it runs with (after
    ``prepare`` accepted them), for ``data``'s shape (None: no input sent)."""
    if mechanism.accuracy is None:
        return None
    try:
        accuracy = mechanism.accuracy(run_params, data)
        return None if accuracy is None else as_json(accuracy)
    except Exception:  # informative only: a plugin's failure here must not fail the answer
        log.exception(
            "mechanism %r (plugin %r) failed to state its accuracy; answered with null",
            mechanism.name,
            mechanism.plugin,
        )
        return None


def as_json(accuracy: Accuracy) -> dict[str, Any]:
    if not isinstance(accuracy, Accuracy):
        raise TypeError(f"accuracy must return an Accuracy or None, not {accuracy!r}")
    try:
        return dict(_json(accuracy))
    except TypeError:  # a field that cannot be hashed: not cached
        return _json.__wrapped__(accuracy)


@lru_cache(maxsize=4096)  # the built-ins cache their Accuracy: the same few, charge after charge
def _json(accuracy: Accuracy) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": str(accuracy.kind),
        "distribution": str(accuracy.distribution),
        "scale": _double(accuracy.scale, 0),
        "half_width_95": _double(accuracy.half_width, 1),
        "confidence": float(CONFIDENCE),
        "exact": bool(accuracy.exact),
    }
    if accuracy.grid is not None:
        body["grid"] = _double(accuracy.grid, 0)
    if accuracy.candidates is not None:
        body["candidates"] = int(accuracy.candidates)
    if accuracy.categories is not None:
        body["categories"] = int(accuracy.categories)
    if accuracy.probability_true is not None:
        body["probability_true"] = _double(accuracy.probability_true, -1)
    return body


def _double(value: Number | None, direction: int) -> float | None:
    """``value`` as the nearest double (``direction`` 0), the least double at or above it (1)
    or the largest at or below it (-1); None when there is none."""
    if value is None:
        return None
    exact = Fraction(value)
    try:
        near = float(exact)
    except OverflowError:
        return None
    if direction > 0 and Fraction(near) < exact:
        near = math.nextafter(near, math.inf)
    elif direction < 0 and Fraction(near) > exact:
        near = math.nextafter(near, -math.inf)
    return near if math.isfinite(near) else None


def batch_detail(share: PlanShare) -> dict[str, Any]:
    """What a batch item's ledger entry says of its batch: the batch's id and, priced in a
    group, the group's number, its composed cost and the delta it was composed at."""
    detail: dict[str, Any] = {"batch_id": share.batch_id}
    if share.group is not None:
        assert share.group_cost is not None
        detail["group"] = share.group
        detail["group_cost"] = {
            "epsilon": str(EPSILON.to_decimal(share.group_cost.epsilon)),
            "delta": str(DELTA.to_decimal(share.group_cost.delta)),
        }
        detail["batch_delta"] = share.delta
    return detail
