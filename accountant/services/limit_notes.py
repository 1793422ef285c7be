"""What a limit change tells the admin who made it (``notes``), and how its reason reads.

A limit change is a governance event: it is ledgered with its reason, and a change made
without one is ledgered all the same and shown as "no reason given". Some changes are
accepted but worth a word, in plain English, in the answer's ``notes``:

- a limit now below what its scope has already spent: no charge that costs anything in
  that component fits again (a window's until it resets); nothing spent is refunded;
- a window or partition limit above the lifetime limit: the lifetime limit binds first,
  so the excess can never be spent;
- a change equal to the limit it replaces: nothing changed, and nothing was ledgered.

Comparisons are in the units the limits are enforced in (``exact.Limit``), component by
component over the ones the mode enforces, so they are exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accountant.accounting.modes import Mode
from accountant.exact import COMPONENTS, Amount, ComponentName, Limit, positional

NO_REASON = "no reason given"

#: The note for a change that states no reason.
UNSTATED = (
    "no reason given: the change is ledgered and shown as “no reason given”; state one in reason"
)


@dataclass(frozen=True)
class Outcome:
    """What a PATCH of limits did: whether any limit changed (and was ledgered), and the
    notes its answer carries."""

    changed: bool
    notes: tuple[str, ...]

    def view(self) -> dict[str, Any]:
        return {"changed": self.changed, "notes": list(self.notes)}


def given(reason: Any) -> bool:
    """Whether a reason was stated: a string with more than blanks."""
    return isinstance(reason, str) and bool(reason.strip())


def reason_of(detail: dict[str, Any] | None) -> str:
    """A limit change's reason as its readers see it: the one ledgered, or "no reason
    given" (the ledger keeps the stated null: nothing is invented in a hashed record)."""
    reason = (detail or {}).get("reason")
    return reason if isinstance(reason, str) and given(reason) else NO_REASON


def unchanged(what: str) -> str:
    """The note for a scope whose new limit equals its old one."""
    return f"{what} unchanged: the new limit equals the current one, so nothing was ledgered"


def nothing_changed() -> str:
    return "nothing changed: every limit given equals the current one, so nothing was ledgered"


def below_spent(
    what: str, *, limit: Limit, spent: Amount, mode: Mode, consequence: str
) -> str | None:
    """The note for a limit now below what its scope has spent, or None.

    Args:
        what: the limit, as the note names it ("the lifetime limit").
        limit: its new value.
        spent: what its scope has spent.
        mode: the dataset's mode.
        consequence: what follows for charges, as the note says it.
    """
    over = _over(limit, spent, mode)
    if not over:
        return None
    return (
        f"{what} is now below what is already spent "
        f"({_figures(mode, limit.bounds(), over, bound=True)} < spent "
        f"{_figures(mode, spent, over)}): {consequence}; nothing spent is refunded"
    )


def above_lifetime(what: str, *, limit: Limit, lifetime: Limit, mode: Mode) -> str | None:
    """The note for a window or partition limit above the lifetime limit, or None.

    Args:
        what: the limit, as the note names it ("the partition limit").
        limit: its value.
        lifetime: the dataset's lifetime limit.
        mode: the dataset's mode.
    """
    over = _over(lifetime, limit.bounds(), mode)
    if not over:
        return None
    return (
        f"{what} ({_figures(mode, limit.bounds(), over, bound=True)}) is above the lifetime "
        f"limit ({_figures(mode, lifetime.bounds(), over, bound=True)}): the lifetime limit "
        "binds first, so "
        "the excess can never be spent"
    )


def _over(limit: Limit, amount: Amount, mode: Mode) -> tuple[ComponentName, ...]:
    """The enforced components in which ``amount`` is above ``limit``."""
    return tuple(
        name
        for name in mode.components
        if (bound := limit[name]) is not None and amount[name] > bound
    )


def _figures(
    mode: Mode, amount: Amount, names: tuple[ComponentName, ...], *, bound: bool = False
) -> str:
    """``amount`` in ``names``, each as the mode names it (rho, rdp or mu for the measure);
    ``bound``: a limit (``Mode.lead``)."""
    shown = []
    for name in names:
        if name == "rho":
            shown.append(f"{mode.lead_name} {positional(mode.lead(amount, bound=bound))}")
        else:
            shown.append(f"{name} {positional(COMPONENTS[name].to_decimal(amount[name]))}")
    return ", ".join(shown)
