"""Capacity planning: how many more identical charges every scope would grant now.

n identical charges of per-release cost c and multiplicity m on the same
partitions add n c to each charged s(p) and n c m to each running total: in
every loss rule of DESIGN.md that is one charge of cost n c. So the plan
evaluates the charge like a preview and finds the largest n whose cost n c
every scope still grants, by doubling and bisection over the same checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from accountant.accounting import checks as rules
from accountant.accounting import pricing
from accountant.accounting.decide import price_alone
from accountant.driver import Driver
from accountant.services.evaluation import ChargeRequest, Evaluation, preview


@dataclass(frozen=True)
class Plan:
    evaluation: Evaluation
    fits: int
    limited_by: rules.Denial  # the scope that refuses charge number fits + 1


def plan(driver: Driver, request: ChargeRequest, now_us: int) -> Plan:
    evaluation = preview(driver, request, now_us)
    fits, limited_by = most_that_fit(evaluation)
    return Plan(evaluation, fits, limited_by)


def most_that_fit(evaluation: Evaluation) -> tuple[int, rules.Denial]:
    """(n, the denial of the (n+1)-th): every amount saturates below 2^62 units, far above
    any limit, so the doubling ends."""
    cost, m = evaluation.priced.cost, evaluation.priced.multiplicity

    def denial(n: int) -> rules.Denial | None:
        return evaluation.refusal(cost.scaled(n), m)

    first = denial(1)
    if first is not None:
        return 0, first
    low, high = 1, 2  # denial(low) is None
    while (refused := denial(high)) is None:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        found = denial(middle)
        if found is None:
            low = middle
        else:
            high, refused = middle, found
    return low, refused


#: The noise parameters a plan may solve for, and whether a larger value costs more.
NOISE_PARAMETERS = {"sigma": False, "epsilon": True, "rho": True}


@dataclass(frozen=True)
class Solved:
    evaluation: Evaluation  # of the charge with the solved parameter
    name: str
    value: Decimal


def solve(driver: Driver, request: ChargeRequest, name: str, count: int, now_us: int) -> Solved:
    """The least-noise value of parameter ``name`` such that ``count`` identical charges fit
    now: the largest epsilon or rho, or the smallest sigma, to 9 significant digits: the
    exact fit when it has 9 digits or fewer, else rounded toward more noise. Raises
    ``NothingFits`` if no value in range fits."""
    increasing = NOISE_PARAMETERS[name]
    evaluation = preview(driver, _with(request, name, Decimal(1)), now_us)  # the scopes
    n = len(evaluation.partitions)

    def fits(value: Decimal) -> bool:
        try:
            priced = price_alone(request, evaluation.dataset, n, {**request.params, name: value})
        except pricing.PricingError:
            return False
        return evaluation.refusal(priced.cost.scaled(count), priced.multiplicity) is None

    if not fits(LOW if increasing else HIGH):
        raise NothingFits(
            f"{count} such charges do not fit even at {name} {LOW if increasing else HIGH}"
        )
    value = least_noise(fits, increasing)
    solved = _with(request, name, value)
    return Solved(preview(driver, solved, now_us), name, value)


def least_noise(fits: Callable[[Decimal], bool], increasing: bool) -> Decimal:
    """The least-noise value in [LOW, HIGH] that ``fits``, to 9 significant digits: the exact
    threshold when it has 9 digits or fewer, else rounded toward more noise. ``increasing``:
    a larger value is less noise (epsilon, rho; not sigma). The most noise must fit."""
    # bisection on the logarithm between the schema's bounds, toward more noise
    low, high = math.log(LOW), math.log(HIGH)
    for _ in range(100):
        middle = (low + high) / 2
        if fits(Decimal(repr(math.exp(middle)))) == increasing:
            low = middle
        else:
            high = middle
    near = Decimal(repr(math.exp(low if increasing else high)))  # the end that fits
    # The threshold lies between the ends, within about 10^-15 of ``near`` (relative). When it
    # is itself a 9-digit number (20 charges within epsilon 1: 0.05 exactly), ``near`` is a
    # hair on the more-noise side of it, and rounding toward less noise finds it; otherwise
    # that rounding does not fit, and the walk below takes the next 9-digit value toward
    # more noise (each step moves by at most one unit of the 9th digit).
    value = min(max(round_digits(near, down=not increasing), LOW), HIGH)
    for _ in range(100):  # the answer must be on the fitting side
        if fits(value):
            return value
        value = round_digits(
            value * (Decimal("0.999999999") if increasing else Decimal("1.000000001")),
            down=increasing,
        )
    raise NothingFits(f"no value near {value} fits; the mechanism's cost is not monotone in it")


class NothingFits(ValueError):
    """No value of the parameter lets that many charges fit."""


#: The range a noise parameter is solved in.
LOW, HIGH = Decimal("1e-9"), Decimal(10) ** 6


def _with(request: ChargeRequest, name: str, value: Decimal) -> ChargeRequest:
    return replace(request, params={**request.params, name: value})


def round_digits(value: Decimal, *, down: bool) -> Decimal:
    """``value`` to 9 significant digits, down (less epsilon) or up (more sigma)."""
    exponent = value.adjusted() - 8
    return value.quantize(
        Decimal(1).scaleb(exponent), rounding=ROUND_FLOOR if down else ROUND_CEILING
    ).normalize()
