"""What a ledger entry states beside what its hash covers, as a function of what it covers.

An entry's readable fields (``cost`` and ``charged`` in its chain's mode, ``created_at``,
``reason``, ``batch_id`` and ``group``) are not hashed; each follows from hashed fields
(``cost_units``, ``multiplicity``, ``kind``, ``status``, ``hold_id``, ``created_at_us``,
``detail``) and the chain's mode. ``readable`` states them for the API, the exports and the
dashboard; ``first_difference`` recomputes them for ``ledger verify --file``, which has no
database, in the terms (mode and delta) the export's signature states for each chain
(``terms_of``), so that an export whose readable figures were edited does not verify.
``loss_after`` needs the chain before the entry and its dataset's rules: only ``verify``
against the database recomputes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from accountant.accounting.modes import Mode, mode_of
from accountant.accounting.windows import isoformat
from accountant.exact import Amount
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


def terms_of(mode: Mode, delta: int) -> dict[str, Any]:
    """What the readable figures of a chain's entries depend on, as an export's signature
    states it for the chain: its mode (accounting, rdp order, delta' of advanced
    composition) and its owner's delta in units."""
    return {
        "accounting": mode.name,
        "rdp_order": None if mode.order is None else str(mode.order),
        "composition_delta": mode.composition_delta,
        "delta": delta,
    }


def signed_terms(claims: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The signed ``contents`` of an export if they state every chain's terms, else None
    (an export made before they did)."""
    contents = claims.get("contents")
    if not isinstance(contents, dict) or not all(
        isinstance(held, dict) and isinstance(held.get("terms"), dict) for held in contents.values()
    ):
        return None
    return contents


def first_difference(lines: Iterable[str], contents: Mapping[str, Any]) -> str | None:
    """The first line of an export (whose hashes, links and signed contents hold) with a
    readable field that is not what its hashed fields make it in the terms the signature
    states for its chain (``contents[name]["terms"]``), named; or None."""
    modes: dict[str, tuple[Mode, int]] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        line = json.loads(text)
        name = line["dataset"]
        if name not in modes:
            terms = contents[name]["terms"]
            try:
                mode = mode_of(terms["accounting"], terms["rdp_order"], terms["composition_delta"])
            except (ArithmeticError, LookupError, TypeError, ValueError):
                return f"the signature's terms of {name!r} are no mode this release knows"
            modes[name] = (mode, terms["delta"])
        wrong = difference(line, *modes[name])
        if wrong is not None:
            return f"line {number} (dataset {name!r}, seq {line['seq']}): {wrong}"
    return None


def difference(line: dict[str, Any], mode: Mode, delta: int) -> str | None:
    """The first readable field of an exported ``line`` (parsed JSON, its hash already
    checked) that is not what its hashed fields make it in ``mode`` at the owner's
    ``delta``, or None."""
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
        return f"its figures do not fit its chain's terms ({error}) (edited)"
    expected = decimals_as_floats(stated)
    for name in READABLE:
        if line.get(name) != expected[name]:
            return (
                f"its {name} is {line.get(name)!r}, and what the hash covers makes it "
                f"{expected[name]!r} (edited)"
            )
    return None
