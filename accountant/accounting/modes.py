"""Accounting modes: which components a dataset composes and how costs become amounts.

- ``pure``: epsilon only; mechanisms with delta > 0 are refused.
- ``approx``: (epsilon, delta) by basic composition, each component composed
  separately (Dwork and Roth 2014, Theorem 3.16).
- ``zcdp``: rho, which adds under composition (Bun and Steinke 2016,
  Lemma 2.3). An epsilon-DP mechanism is (epsilon^2 / 2)-zCDP
  (Proposition 1.4). A budget stated as (epsilon, delta) is enforced as
  rho_limit = (sqrt(ln(1/delta) + epsilon) - sqrt(ln(1/delta)))^2, the
  largest rho whose conversion rho + 2 sqrt(rho ln(1/delta)) (Proposition
  1.3) stays within epsilon.

The conversions use 60-digit decimal arithmetic and then round outward with a
guard far above its error, so a limit is never rounded up and a reported
epsilon is never rounded down.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Literal

from accountant.exact import DELTA, EPSILON, RHO, Amount, ComponentName, Limit

ModeName = Literal["pure", "approx", "zcdp"]
_CONTEXT = decimal.Context(prec=60)
_GUARD = Decimal("1e-40")


class UnsupportedCost(ValueError):
    """A mechanism's cost cannot be accounted in a dataset's mode."""


@dataclass(frozen=True)
class StatedCost:
    """A cost as a mechanism declares it (see ``accountant.mechanism.Cost``)."""

    epsilon: Fraction
    delta: Fraction
    rho: Fraction | None


@dataclass(frozen=True)
class Mode:
    name: ModeName
    components: tuple[ComponentName, ...]

    def amount_of(self, cost: StatedCost) -> Amount:
        """The amount one release costs in this mode, every component rounded up."""
        if self.name == "pure":
            if cost.delta != 0:
                raise UnsupportedCost(
                    "this mechanism has delta > 0, which a pure-DP dataset cannot account; "
                    "use a pure-DP mechanism (laplace) or an approx or zcdp dataset"
                )
            return Amount(epsilon=EPSILON.cost_units(cost.epsilon))
        if self.name == "approx":
            return Amount(
                epsilon=EPSILON.cost_units(cost.epsilon), delta=DELTA.cost_units(cost.delta)
            )
        if cost.rho is not None:
            return Amount(rho=RHO.cost_units(cost.rho))
        if cost.delta == 0:
            return Amount(rho=RHO.cost_units(cost.epsilon**2 / 2))
        raise UnsupportedCost(
            "this mechanism has delta > 0 and no rho, so a zcdp dataset cannot account it; "
            "state its noise as sigma or rho"
        )

    def report(self, amount: Amount, dataset_delta: int) -> dict[str, Decimal]:
        """An amount as the API shows it (API.md: zcdp amounts carry rho, epsilon, delta)."""
        if self.name == "zcdp":
            return {
                "rho": RHO.to_decimal(amount.rho),
                "epsilon": epsilon_of_rho(amount.rho, dataset_delta),
                "delta": DELTA.to_decimal(dataset_delta),
            }
        return {
            "epsilon": EPSILON.to_decimal(amount.epsilon),
            "delta": DELTA.to_decimal(amount.delta),
        }


MODES: dict[str, Mode] = {
    "pure": Mode("pure", ("epsilon",)),
    "approx": Mode("approx", ("epsilon", "delta")),
    "zcdp": Mode("zcdp", ("rho",)),
}


def rho_limit(epsilon: Decimal, delta: Decimal) -> int:
    """Units of the largest rho that is (epsilon, delta)-DP by the Canonne, Kamath and
    Steinke (2020) conversion, rounded down: rho* = max over alpha > 1 of B(alpha) / alpha,
    B(alpha) = epsilon + ln(alpha / (alpha - 1)) - (ln(1/delta) - ln alpha) / (alpha - 1).

    rho-zCDP is (alpha, alpha rho)-RDP for every alpha > 1, and (alpha, tau)-RDP is
    (tau + ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1), delta)-DP (CKS20,
    Proposition 12), so every alpha gives a sound rho: the search picks a near-optimal
    alpha in floating point, and the value at that alpha is computed at 60 digits."""
    if not 0 < delta < 1:
        raise ValueError("delta must be between 0 and 1")
    alpha = _best_order(lambda a: _b_float(float(epsilon), float(delta), a) / a, maximise=True)
    with decimal.localcontext(_CONTEXT):
        rho = _b_decimal(epsilon, delta, alpha) / alpha
        return max(0, RHO.limit_units(max(Decimal(0), rho - _GUARD)))


def rho_by_bun_steinke(epsilon: Decimal, delta: Decimal) -> int:
    """Units of the largest rho with rho + 2 sqrt(rho ln(1/delta)) <= epsilon (Bun and
    Steinke 2016, Proposition 1.3), rounded down: looser than ``rho_limit``; the discrete
    Gaussian plugin calibrates its (epsilon, delta) parameters with it."""
    with decimal.localcontext(_CONTEXT):
        log_term = (1 / delta).ln()
        rho = ((log_term + epsilon).sqrt() - log_term.sqrt()) ** 2
        return max(0, RHO.limit_units(max(Decimal(0), rho - _GUARD)))


@functools.lru_cache(maxsize=4096)
def epsilon_of_rho(rho_units: int, delta_units: int) -> Decimal:
    """The epsilon at ``delta`` of a rho-zCDP loss by the CKS20 conversion, rounded up:
    min over alpha > 1 of alpha rho + ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1)
    (any alpha gives a sound figure; see ``rho_limit``)."""
    if rho_units == 0:
        return Decimal(0)
    rho_f, delta_f = rho_units / RHO.scale, delta_units / DELTA.scale
    alpha = _best_order(lambda a: a * rho_f + _conversion_float(delta_f, a), maximise=False)
    with decimal.localcontext(_CONTEXT):
        rho = RHO.to_decimal(rho_units)
        delta = DELTA.to_decimal(delta_units)
        epsilon = alpha * rho + _conversion_decimal(delta, alpha)
        return EPSILON.to_decimal(EPSILON.cost_units(max(Decimal(0), epsilon) + _GUARD))


def _b_float(epsilon: float, delta: float, alpha: float) -> float:
    return epsilon - _conversion_float(delta, alpha)


def _conversion_float(delta: float, alpha: float) -> float:
    """ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1), in floating point."""
    return (math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1))


def _b_decimal(epsilon: Decimal, delta: Decimal, alpha: Decimal) -> Decimal:
    return epsilon - _conversion_decimal(delta, alpha)


def _conversion_decimal(delta: Decimal, alpha: Decimal) -> Decimal:
    return ((alpha - 1) / alpha).ln() - (delta.ln() + alpha.ln()) / (alpha - 1)


def _best_order(objective: Callable[[float], float], *, maximise: bool) -> Decimal:
    """A near-optimal Renyi order alpha > 1 for ``objective``: a scan of ln(alpha - 1) over
    [-12, 40] in steps of 1/2, then golden-section refinement around the best point. Returned
    as the exact Decimal of a float, so the caller evaluates its figure at exactly this
    order (any order is sound; a better one is only tighter)."""
    sign = -1.0 if maximise else 1.0

    def value(x: float) -> float:
        try:
            return sign * objective(1 + math.exp(x))
        except (OverflowError, ValueError, ZeroDivisionError):
            return math.inf

    grid = [-12 + i / 2 for i in range(105)]
    best = min(grid, key=value)
    low, high = best - 0.5, best + 0.5
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if value(a) <= value(b):
            high = b
        else:
            low = a
    x = min((best, (low + high) / 2), key=value)
    return Decimal(1 + math.exp(x))


def limit_of(
    mode: Mode,
    stated: dict[str, Decimal],
    dataset_delta: Decimal | None,
) -> Limit:
    """The enforced limit of a stated budget; components it omits are unlimited.

    In zcdp mode a budget may state ``rho`` directly or ``epsilon`` (with an
    optional ``delta``, defaulting to the dataset's) to be converted.
    """
    epsilon = stated.get("epsilon")
    delta = stated.get("delta")
    rho = stated.get("rho")
    if mode.name != "zcdp":
        return Limit(
            epsilon=None if epsilon is None else EPSILON.limit_units(epsilon),
            delta=(0 if mode.name == "pure" else None) if delta is None
            else DELTA.limit_units(delta),
        )
    if rho is None:
        at_delta = delta if delta is not None else dataset_delta
        if epsilon is None or at_delta is None:
            raise ValueError("a zcdp budget needs rho, or epsilon with the dataset's delta")
        rho_units = rho_limit(epsilon, at_delta)
    else:
        rho_units = RHO.limit_units(rho)
    return Limit(
        epsilon=None if epsilon is None else EPSILON.limit_units(epsilon),
        delta=None if delta is None else DELTA.limit_units(delta),
        rho=rho_units,
    )
