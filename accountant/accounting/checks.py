"""Checking a priced charge against every scope's limit (DESIGN.md, normative).

Pure functions over the scopes' states as the charge transaction read them
(``accountant.accounting.loss``): each scope's loss before and after the
charge, the per-partition limit, which scope denies a charge first, and
whether a charge could ever fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accountant.accounting.loss import LossRule, ScopeState, fresh, loss_after
from accountant.accounting.windows import Window
from accountant.exact import Amount, ComponentName, Limit

#: The order in which scopes deny a charge (API.md): windows last, since only they reset.
SCOPE_ORDER = ("dataset", "partition", "consumer", "window")


@dataclass(frozen=True)
class ScopeCheck:
    """One scope's limit, its loss before the charge and after it."""

    scope: str
    limit: Limit
    spent: Amount
    after: Amount
    partition: str | None = None
    window: Window | None = None


@dataclass(frozen=True)
class Denial:
    """Why a charge was refused: the first failing scope, in the order of ``SCOPE_ORDER``."""

    scope: str
    limit: Limit
    spent: Amount
    requested: Amount
    partition: str | None = None
    window: Window | None = None


def scope_check(
    scope: str,
    limit: Limit,
    rule: LossRule,
    state: ScopeState,
    cost: Amount,
    m: int,
    release: str,
    names: tuple[ComponentName, ...],
    *,
    window: Window | None = None,
) -> ScopeCheck:
    """A scope's loss now and after a charge of per-release ``cost``, multiplicity ``m`` and
    kind ``release``."""
    return ScopeCheck(
        scope,
        limit,
        loss_after(rule, state, Amount(), 0, release, names),
        loss_after(rule, state, cost, m, release, names),
        window=window,
    )


def partition_check(
    limit: Limit,
    lifetime: ScopeState,
    cost: Amount,
    names: tuple[ComponentName, ...],
    keys: list[str],
    spends: Mapping[str, Amount],
) -> ScopeCheck:
    """The per-partition limit: every charged partition's s(p) plus the cost stays within it.
    The largest old s(p) among them (``lifetime.max_touched``) decides; on a denial the
    first partition in request order that goes over is named, from ``spends`` (the charged
    partitions' s(p); a partition missing from it has spent nothing)."""
    after = Amount(**{name: lifetime.max_touched[name] + cost[name] for name in names})
    if limit.is_exceeded_by(after, names):
        for key in keys:
            spent = spends.get(key, Amount())
            if limit.is_exceeded_by(spent.plus(cost), names):
                return ScopeCheck("partition", limit, spent, spent.plus(cost), partition=key)
    return ScopeCheck("partition", limit, lifetime.max_touched, after, partition=keys[0])


def first_denial(
    checks: list[ScopeCheck], cost: Amount, names: tuple[ComponentName, ...]
) -> Denial | None:
    """The first scope, in contract order, that the charge would take above its limit.

    Window scopes come last, so a charge that breaks a window and any other
    scope is denied for the other scope (a 409: waiting would not help). A
    charge whose cost alone exceeds a window limit is also a 409.
    """
    ordered = sorted(checks, key=lambda check: SCOPE_ORDER.index(check.scope))
    for check in ordered:
        if check.limit.is_exceeded_by(check.after, names):
            return Denial(
                check.scope, check.limit, check.spent, cost, check.partition, check.window
            )
    return None


def never_fits(
    denial: Denial,
    rule: LossRule,
    cost: Amount,
    m: int,
    release: str,
    names: tuple[ComponentName, ...],
    partition_count: int,
) -> bool:
    """Whether the denied charge, on ``partition_count`` partitions, would exceed the denying
    limit even on a fresh scope (read as the charge path reads one: ``loss.fresh``)."""
    alone = loss_after(rule, fresh(rule, partition_count), cost, m, release, names)
    return denial.limit.is_exceeded_by(alone, names)


def bounds(limit: Limit, names: tuple[ComponentName, ...]) -> dict[ComponentName, int]:
    """The components of the mode (``names``) that ``limit`` binds, with their bounds. Only
    these count: a pure dataset's limits carry no delta, and the measure of zcdp, rdp and
    gdp is its one component."""
    return {name: bound for name in names if (bound := limit[name]) is not None}


def remaining(limit: Limit, loss: Amount, names: tuple[ComponentName, ...]) -> Amount:
    """What is left of ``limit`` after ``loss``, in the limited components."""
    return Amount(
        **{name: max(0, bound - loss[name]) for name, bound in bounds(limit, names).items()}
    )


def at_limit(limit: Limit, loss: Amount, names: tuple[ComponentName, ...]) -> bool:
    """Whether ``loss`` has used up a component that ``limit`` grants (a positive bound):
    ``remaining`` is 0 there, and no charge that costs anything in it fits. A bound of 0
    (an approx budget stated without delta) grants nothing to use up: it only admits
    charges free in that component, and is never "at limit" by itself. The one definition
    of "at limit" (the budget report's ``at_limit``, the dashboard's badges)."""
    return any(0 < bound <= loss[name] for name, bound in bounds(limit, names).items())
