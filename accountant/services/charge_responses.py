"""What a charge answers, as it is remembered for its idempotency key and replayed.

A grant's body carries the receipt and the SHA-256 of its output, never the
output itself (regenerated on replay, ``services.replay``); a denial is the
problem document of a ``BudgetExhausted`` or ``WindowExhausted`` error that
states the scope, its limit, what was spent and what was requested. Amounts
are reported in the dataset's mode (``Mode.report``), labelled with the field that adds
up (``Mode.labelled``); the receipt signs the figures alone, as it always has.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accountant import problems
from accountant.accounting.checks import Denial
from accountant.accounting.modes import LABELS
from accountant.accounting.windows import isoformat
from accountant.errors import BudgetExhausted, WindowExhausted
from accountant.exact import Amount, positional
from accountant.services import accuracy, idempotency, ledger, receipts
from accountant.services.evaluation import ChargeRequest, Evaluation


def granted(
    evaluation: Evaluation,
    request: ChargeRequest,
    charge_id: str,
    created_at: int,
    output_sha256: str,
    head: ledger.ChainHead,
    signer: Ed25519PrivateKey,
) -> idempotency.Outcome:
    """A grant's 201 as remembered: everything but the output, with its signed receipt. Both
    carry the charge's ledger entry (its seq and hash, the dataset's chain head right after
    it), so that every receipt anchors the chain: a ledger cut back behind it shows."""
    priced = evaluation.priced
    body = idempotency.decimals_as_floats(
        {
            "charge_id": charge_id,
            "dataset": evaluation.dataset.name,
            "mechanism": request.mechanism.name,
            "release": request.release,
            "partitions": evaluation.partitions,
            "cost": report_cost(evaluation, priced.cost),
            "multiplicity": priced.multiplicity,
            "charged": report_cost(evaluation, evaluation.charged),
            "remaining": report(evaluation, evaluation.remaining),
            "created_at": isoformat(created_at / 1e6),
            "run_params": idempotency.encode_params(priced.run_params),
            "output_sha256": output_sha256,
            "ledger": {"seq": head.seq, "hash": head.hash},
            "accuracy": accuracy.stated(request.mechanism, priced.run_params, request.data),
        }
    )
    body["receipt"] = receipts.receipt(
        signer,
        charge_id=charge_id,
        dataset=body["dataset"],
        partitions=body["partitions"],
        mechanism=body["mechanism"],
        cost=_figures(body["cost"]),
        multiplicity=body["multiplicity"],
        charged=_figures(body["charged"]),
        output_sha256=output_sha256,
        ledger=body["ledger"],
        issued_at=created_at // 1_000_000,
    )
    return idempotency.Outcome(request.fingerprint, charge_id, 201, body, {})


def denied(
    evaluation: Evaluation, request: ChargeRequest, charge_id: str, now_us: int
) -> idempotency.Outcome:
    """A denial's problem as remembered."""
    assert evaluation.denial is not None
    problem = problems.of(denial_error(evaluation, evaluation.denial, charge_id, now_us))
    return idempotency.Outcome(
        request.fingerprint,
        charge_id,
        problem.status,
        idempotency.decimals_as_floats(problem.body),
        problem.headers,
    )


def denial_error(
    evaluation: Evaluation, denial: Denial, charge_id: str, now_us: int
) -> BudgetExhausted:
    """The domain error of a denial, with its facts; a window that will reset is a
    ``WindowExhausted`` that says when, unless the charge could never fit in it."""
    extra: dict[str, Any] = {
        "scope": denial.scope,
        "limit": _limit_report(evaluation, denial),
        "spent": report(evaluation, denial.spent),
        "requested": report_cost(evaluation, denial.requested),
        "charge_id": charge_id,
    }
    if denial.partition is not None and denial.scope == "partition":
        extra["partition"] = denial.partition
    text = reason(evaluation, denial)
    if denial.window is not None:
        extra["resets_at"] = isoformat(denial.window.end)
        if not evaluation.never_fits:
            wait = denial.window.seconds_until_end(now_us / 1e6)
            return WindowExhausted(text, extra=extra, retry_after=wait)
        text += "; its cost alone exceeds the window limit, so waiting will not help"
    return BudgetExhausted(text, extra=extra)


def report(evaluation: Evaluation, amount: Amount) -> dict[str, Any]:
    """``amount`` as the dataset's mode states it (with epsilon at its delta for zcdp)."""
    mode = evaluation.mode
    return mode.labelled(mode.report(amount, evaluation.dataset.limit_delta or 0), amount)


def report_cost(evaluation: Evaluation, amount: Amount) -> dict[str, Any]:
    """A release's cost as the dataset's mode states it (``Mode.report_cost``)."""
    mode = evaluation.mode
    return mode.labelled(mode.report_cost(amount, evaluation.dataset.limit_delta or 0), amount)


def _figures(amount: dict[str, Any]) -> dict[str, Any]:
    """An amount's figures as ``Mode.report`` states them, without the labels."""
    return {k: v for k, v in amount.items() if k not in LABELS}


def reason(evaluation: Evaluation, denial: Denial) -> str:
    """One sentence: which scope, its limit, what is spent and what was asked for."""
    where = {
        "dataset": "the dataset's lifetime budget",
        "partition": f"the budget of partition {denial.partition!r}",
        "consumer": "your quota on this dataset",
        "window": "the current window budget",
    }[denial.scope]
    text = (
        f"this charge would exceed {where}: limit "
        f"{_text(_limit_report(evaluation, denial))}, spent "
        f"{_text(report(evaluation, denial.spent))}, requested "
        f"{_text(report_cost(evaluation, denial.requested), alone=True)}"
    )
    if denial.window is not None:
        text += f"; the window resets at {isoformat(denial.window.end)}"
    return text


def _limit_report(evaluation: Evaluation, denial: Denial) -> dict[str, Any]:
    mode = evaluation.mode
    limited = Amount(**{n: v for n in mode.components if (v := denial.limit[n]) is not None})
    stated = mode.report(limited, evaluation.dataset.limit_delta or 0)
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
