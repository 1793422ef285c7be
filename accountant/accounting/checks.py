"""Checking a priced charge against every scope's limit (DESIGN.md, normative).

Pure functions over the scopes' states as the charge transaction read them
(``accountant.accounting.loss``): each scope's loss before and after the
charge, the per-partition limit, which scope denies a charge first, and
whether a charge could ever fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from accountant.accounting.loss import LossRule, ScopeState, fresh, loss_after
from accountant.accounting.windows import Window
from accountant.exact import Amount, ComponentName, Limit

#: The order in which scopes deny a charge (API.md): windows last, since only they reset.
SCOPE_ORDER = ("dataset", "population", "partition", "consumer", "window")


@dataclass(frozen=True, kw_only=True)
class ScopeCheck:
    """One scope's limit, its loss before the charge and after it.

    Args:
        scope: the scope's kind, one of ``SCOPE_ORDER``.
        limit: its limit.
        spent: its loss before the charge.
        after: its loss after the charge.
        partition: the partition a per-partition check names.
        window: the window of a window scope.
        population: the population of a population scope.
    """

    scope: str
    limit: Limit
    spent: Amount
    after: Amount
    partition: str | None = None
    window: Window | None = None
    population: str | None = None


@dataclass(frozen=True, kw_only=True)
class Denial:
    """Why a charge was refused: the first failing scope, in the order of ``SCOPE_ORDER``.

    Args:
        scope: the denying scope's kind.
        limit: its limit.
        spent: its loss before the charge.
        requested: the charge's per-release cost.
        partition: the partition a per-partition denial names.
        window: the window of a window denial.
        hold_state: the state of the hold a draw was refused on (scope ``hold``).
        population: the population of a population denial.
    """

    scope: str
    limit: Limit
    spent: Amount
    requested: Amount
    partition: str | None = None
    window: Window | None = None
    hold_state: str | None = None
    population: str | None = None


def scope_check(
    *,
    scope: str,
    limit: Limit,
    rule: LossRule,
    state: ScopeState,
    cost: Amount,
    m: int,
    release: str,
    names: tuple[ComponentName, ...],
    window: Window | None = None,
) -> ScopeCheck:
    """A scope's loss now and after a charge of per-release ``cost``, multiplicity ``m`` and
    kind ``release``.

    Args:
        scope: the scope's kind, one of ``SCOPE_ORDER``.
        limit: its limit.
        rule: the dataset's loss rule.
        state: the scope as read before the charge.
        cost: the per-release cost c.
        m: the multiplicity.
        release: ``joint`` or ``parallel``.
        names: the components of the dataset's mode.
        window: the window of a window scope.
    """
    return ScopeCheck(
        scope=scope,
        limit=limit,
        spent=loss_after(rule, state, Amount(), 0, release, names),
        after=loss_after(rule, state, cost, m, release, names),
        window=window,
    )


def partition_check(
    *,
    limit: Limit,
    lifetime: ScopeState,
    cost: Amount,
    names: tuple[ComponentName, ...],
    keys: list[str],
    spends: Mapping[str, Amount],
) -> ScopeCheck:
    """The per-partition limit: every charged partition's s(p) plus the cost stays within it.
    The largest old s(p) among them (``lifetime.max_touched``) decides; on a denial the
    first partition in request order that goes over is named.

    Args:
        limit: the per-partition limit.
        lifetime: the lifetime scope as read before the charge.
        cost: the per-release cost c.
        names: the components of the dataset's mode.
        keys: the charged partitions, in request order.
        spends: the charged partitions' s(p) (a partition missing from it has spent
            nothing).
    """
    after = Amount(**{name: lifetime.max_touched[name] + cost[name] for name in names})
    if limit.is_exceeded_by(after, names):
        for key in keys:
            spent = spends.get(key, Amount())
            if limit.is_exceeded_by(spent.plus(cost), names):
                return ScopeCheck(
                    scope="partition",
                    limit=limit,
                    spent=spent,
                    after=spent.plus(cost),
                    partition=key,
                )
    return ScopeCheck(
        scope="partition",
        limit=limit,
        spent=lifetime.max_touched,
        after=after,
        partition=keys[0],
    )


def population_check(*, name: str, limit: Limit, loss: Amount, lifetime: ScopeCheck) -> ScopeCheck:
    """A population's loss before and after a charge on one of its datasets: the sum of its
    datasets' lifetime losses (``loss``) moves by what the charge adds to its own dataset's
    (``lifetime``, the dataset's check), whatever the other datasets spent (DESIGN.md,
    "Populations").

    Args:
        name: the population's name.
        limit: its limit.
        loss: its loss before the charge.
        lifetime: the charged dataset's lifetime check.
    """
    return ScopeCheck(
        scope="population",
        limit=limit,
        spent=loss,
        after=loss.plus(lifetime.after.minus(lifetime.spent)),
        population=name,
    )


def first_denial(
    checks: list[ScopeCheck],
    cost: Amount,
    names: tuple[ComponentName, ...],
    hopeless: Callable[[Denial], bool] | None = None,
) -> Denial | None:
    """The first scope, in contract order, that the charge would take above its limit.

    Window scopes come last, so a charge that breaks a window and any other
    scope is denied for the other scope (a 409: waiting would not help). A
    charge whose cost alone exceeds a window limit is also a 409. Of several
    windows it breaks, the one it could never fit (``hopeless``) is named
    first, then the one that resets last: a retry before that reset is
    refused again, so its end is the earliest a retry may be granted
    (``resets_at``, ``Retry-After``).
    """
    denials = [
        Denial(
            scope=check.scope,
            limit=check.limit,
            spent=check.spent,
            requested=cost,
            partition=check.partition,
            window=check.window,
            population=check.population,
        )
        for check in checks
        if check.limit.is_exceeded_by(check.after, names)
    ]

    def order(denial: Denial) -> tuple[int, bool, int]:
        rank = SCOPE_ORDER.index(denial.scope)
        if denial.window is None:
            return rank, False, 0
        waiting_fails = hopeless is not None and hopeless(denial)
        return rank, not waiting_fails, -denial.window.end

    return min(denials, key=order, default=None)


def never_fits(
    *,
    denial: Denial,
    rule: LossRule,
    cost: Amount,
    m: int,
    release: str,
    names: tuple[ComponentName, ...],
    partition_count: int,
) -> bool:
    """Whether the denied charge, on ``partition_count`` partitions, would exceed the denying
    limit even on a fresh scope (read as the charge path reads one: ``loss.fresh``).

    Args:
        denial: the charge's denial.
        rule: the dataset's loss rule.
        cost: the per-release cost c.
        m: the multiplicity.
        release: ``joint`` or ``parallel``.
        names: the components of the dataset's mode.
        partition_count: |P|, the number of charged partitions.
    """
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
    """Whether nothing more fits ``limit`` after ``loss``: ``remaining`` is 0 in a bound
    component that every charge costs something in. That is any bound component but delta,
    since a charge's epsilon, rho, Renyi divergence or mu^2 is never recorded as 0: a
    positive bound that ``loss`` reached, or a bound of 0 (a lifetime budget whose enforced
    limit rounds to 0, such as an rdp order that does not suit the budget). A delta bound of
    0 (an approx budget stated without delta) only admits charges free in delta, and is
    never "at limit" by itself. The one definition of "at limit" (the budget report's
    ``at_limit``, the dashboard's badges, the utilisation metric)."""
    return any(
        0 < bound <= loss[name] or (bound == 0 and name != "delta")
        for name, bound in bounds(limit, names).items()
    )


def shared_limit(limit: Limit, before: Amount, share: Fraction) -> Limit:
    """The limit a plan must fit to use at most ``share`` of what ``limit`` leaves after
    ``before``: that share, rounded down, on top of ``before``.

    Args:
        limit: the scope's limit.
        before: the scope's loss before the plan.
        share: the fraction of what is left the plan may use, 0 < share <= 1.
    """
    return Limit(
        **{
            name: None
            if (bound := limit[name]) is None
            else before[name] + math.floor(share * max(0, bound - before[name]))
            for name in ("epsilon", "delta", "rho")
        }
    )
