"""What a ledger entry states beside what its hash covers, as a function of what it covers.

An entry's readable fields (``cost`` and ``charged`` in its chain's mode, ``created_at``,
``reason``, ``batch_id`` and ``group``) are not hashed; each follows from hashed fields
(``cost_units``, ``multiplicity``, ``kind``, ``status``, ``hold_id``, ``created_at_us``,
``detail``) and the chain's mode. ``readable`` states them for the API, the exports and the
dashboard; ``difference`` recomputes them for ``ledger verify --file``, which has no
database and reads the mode from the labels of the entry's own ``cost``, so that an export
whose readable figures were edited does not verify. ``loss_after`` needs the chain before
the entry and its dataset's rules: only ``verify`` against the database recomputes it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from accountant.accounting.modes import MODES, Mode, mode_of
from accountant.accounting.windows import isoformat
from accountant.exact import DELTA, Amount
from accountant.services import ledger, limit_notes
from accountant.services.idempotency import decimals_as_floats

#: The readable fields ``readable`` states.
READABLE = ("cost", "charged", "created_at", "reason", "batch_id", "group")


def readable(
    *,
    kind: str,
    status: str,
    hold_id: str | None,
    cost: Amount,
    multiplicity: int,
    detail: dict[str, Any] | None,
    created_at_us: int,
    mode: Mode,
    delta: int,
) -> dict[str, Any]:
    """The readable fields of an entry of a chain in ``mode`` (``delta``: its owner's delta
    in units, at which converted epsilons are stated)."""
    charged = None  # what the running total grew by: cost x multiplicity, when granted
    if kind in ("charge", "hold", "settle"):
        added = ledger.adds_to_totals(kind, status, hold_id)
        back = ledger.gives_back(kind, status)
        grew = cost.scaled(multiplicity) if added or back else Amount()
        charged = mode.labelled(mode.report_cost(grew, delta), grew)
        if back:  # a settle's charged is what it returned, negative
            charged = {
                k: -v if k in charged["additive"] or k == "mu2" else v for k, v in charged.items()
            }
    return {
        "cost": mode.labelled(mode.report_cost(cost, delta), cost),
        "charged": charged,
        "created_at": isoformat(created_at_us / 1e6),
        # a limit change's reason as stated, or "no reason given" (not hashed: the detail is)
        "reason": limit_notes.reason_of(detail)
        if kind in ("limit_change", "admin_change")
        else None,
        # a batch's items, and its refusal: the batch, and the group it was priced with
        "batch_id": (detail or {}).get("batch_id"),
        "group": (detail or {}).get("group"),
    }


def difference(line: dict[str, Any]) -> str | None:
    """The first readable field of an exported ``line`` (parsed JSON, its hash already
    checked) that is not what its hashed fields make it, or None."""
    found = _mode_of(line.get("cost"))
    if found is None:
        return "its cost states no mode this release knows (edited, or a newer release's)"
    mode, delta = found
    try:
        stated = readable(
            kind=line["kind"],
            status=line["status"],
            hold_id=line.get("hold_id"),
            cost=Amount(*line["cost_units"]),
            multiplicity=line["multiplicity"],
            detail=line["detail"],
            created_at_us=line["created_at_us"],
            mode=mode,
            delta=delta,
        )
    except (ArithmeticError, LookupError, TypeError, ValueError) as error:
        return f"its cost is stated in a mode its figures do not fit ({error}) (edited)"
    expected = decimals_as_floats(stated)
    for name in READABLE:
        if line.get(name) != expected[name]:
            return (
                f"its {name} is {line.get(name)!r}, and what the hash covers makes it "
                f"{expected[name]!r} (edited)"
            )
    return None


def _mode_of(cost: Any) -> tuple[Mode, int] | None:
    """The mode, and the owner's delta in units, that a readable cost is stated in, from its
    labels (``Mode.labelled``): every chain's entries state their cost so."""
    if not isinstance(cost, dict):
        return None
    measure, additive = cost.get("measure"), cost.get("additive")
    try:
        delta = DELTA.cost_units(Decimal(repr(float(cost.get("delta", 0)))))
        if measure == "epsilon":
            return MODES["approx"], 0  # pure states its costs as approx does
        if measure == "rho" and additive == ["rho", "delta"]:
            return mode_of("approx", None, 1), 0  # advanced: delta' shows in no cost
        if measure == "rho":
            return MODES["zcdp"], delta
        if measure == "mu2":
            return MODES["gdp"], delta
        if measure == "rdp":
            return mode_of("rdp", repr(float(cost["order"]))), delta
    except (TypeError, ValueError, KeyError, ArithmeticError):
        return None
    return None
