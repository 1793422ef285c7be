"""Accounting modes: which components a dataset composes and how costs become amounts.

- ``pure``: epsilon only; mechanisms with delta > 0 are refused.
- ``approx``: (epsilon, delta) by basic composition, each component composed
  separately (Dwork and Roth 2014, Theorem 3.16); or, chosen when the dataset is created
  and never changed, by the advanced-composition filter of Whitehouse, Ramdas, Rogers and
  Wu (2023): a release of (epsilon_i, delta_i) costs rho_i = epsilon_i^2 / 2 and delta_i,
  both add, and a budget (epsilon, delta) with the filter's share delta' is enforced as
  rho* = (sqrt(ln(1/delta') + epsilon) - sqrt(ln(1/delta')))^2 and delta - delta'.
- ``zcdp``: rho, which adds under composition (Bun and Steinke 2016,
  Lemma 2.3). An epsilon-DP mechanism is (epsilon^2 / 2)-zCDP
  (Proposition 1.4). A budget stated as (epsilon, delta) is enforced as the
  largest rho that the Canonne, Kamath and Steinke (2020) conversion turns
  into (epsilon, delta)-DP.
- ``rdp``: the Renyi divergence at one order alpha, fixed when the dataset is
  created; it adds under composition (Mironov 2017, Proposition 1). The
  budget is enforced as B(alpha), the largest such divergence that is
  (epsilon, delta)-DP (CKS20, Proposition 12).
- ``gdp``: mu^2 of Gaussian DP, which adds under composition (Dong, Roth and
  Su 2022, Corollary 3.3); the budget is mu*^2, the largest mu whose
  Gaussian tradeoff is (epsilon, delta)-DP (their Corollary 2.13).

The enforced quantity of the last three is stored in the ``rho`` component
(10^-12 units): rho, the Renyi divergence at the dataset's order, or mu^2.
Each adds, so every loss rule of DESIGN.md applies to it unchanged.

The conversions use 60-digit arithmetic and then round outward with a guard
far above its error, so a limit is never rounded up and a reported epsilon is
never rounded down. ``docs/accounting.md`` gives why each mode is a valid
privacy filter.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

import mpmath

from accountant.accounting import advanced
from accountant.exact import (
    DELTA,
    EPSILON,
    MAX_EPSILON,
    RHO,
    SATURATION,
    Amount,
    ComponentName,
    Limit,
)

ModeName = Literal["pure", "approx", "zcdp", "rdp", "gdp"]
#: What ``Mode.labelled`` adds to an amount beside its figures.
LABELS = frozenset({"mu2", "measure", "additive", "epsilon_alone"})
_CONTEXT = decimal.Context(prec=60)
_GUARD = Decimal("1e-40")
_DIGITS = 60


class UnsupportedCost(ValueError):
    """A mechanism's cost cannot be accounted in a dataset's mode."""


@dataclass(frozen=True, kw_only=True)
class StatedCost:
    """A cost as a mechanism declares it (see ``accountant.mechanism.Cost``).

    Args:
        epsilon: the epsilon of (epsilon, delta)-DP.
        delta: its delta.
        rho: the rho of rho-zCDP, if declared.
        rdp: the Renyi divergence at the dataset's order, if declared.
        mu: the mu of mu-GDP, if declared.
    """

    epsilon: Fraction
    delta: Fraction
    rho: Fraction | None
    rdp: Fraction | None = None
    mu: Fraction | None = None


@dataclass(frozen=True)
class Mode:
    name: ModeName
    components: tuple[ComponentName, ...]
    #: rdp only: the Renyi order, fixed when the dataset is created.
    order: Decimal | None = None
    #: approx with advanced composition only: delta', the share of the dataset's delta that
    #: the filter's concentration term uses, in delta units, fixed when it is created.
    composition_delta: int | None = None

    @property
    def advanced(self) -> bool:
        """Whether releases compose by the advanced-composition filter (approx only)."""
        return self.composition_delta is not None

    @property
    def converts(self) -> bool:
        """Whether budgets are stated as (epsilon, 0 < delta < 1) and enforced in another
        measure (rho, the Renyi divergence, mu^2)."""
        return self.name in ("zcdp", "rdp", "gdp")

    @property
    def measure(self) -> str:
        """The field of an amount in which the mode's amounts add up and its limits bind, the
        figure to plan with: epsilon, rho (zcdp, and approx with advanced composition), rdp
        (the divergence at the order) or mu2 (gdp: mu^2 adds, mu does not)."""
        if self.advanced:
            return "rho"
        return {"zcdp": "rho", "rdp": "rdp", "gdp": "mu2"}.get(self.name, "epsilon")

    @property
    def lead_name(self) -> str:
        """The name of ``lead``'s figure: the measure, but mu on gdp, as limits are stated."""
        return "mu" if self.name == "gdp" else self.measure

    @property
    def additive(self) -> tuple[str, ...]:
        """The fields of an amount that add up: the measure, and on pure and approx datasets
        delta, each release's own (on zcdp, rdp and gdp an amount's delta is the dataset's,
        the delta its epsilon is stated at)."""
        return (self.measure, "delta") if self.name in ("pure", "approx") else (self.measure,)

    def labelled(self, shown: dict[str, Decimal], amount: Amount) -> dict[str, Any]:
        """``shown`` (``amount`` as ``report`` or ``report_cost`` states it, or a limit as
        stated) with what its figures are (docs/accounting.md, "Which figures add up"):
        ``mu2`` on gdp; ``measure``, the field to plan with; ``additive``, the fields of
        ``shown`` that add up (loss + remaining = limit, costs sum to what they charge);
        and where epsilon does not add, ``epsilon_alone``: the same epsilon under a name
        that says it is this amount's by itself, which no other epsilon adds to."""
        labels: dict[str, Any] = {}
        if self.name == "gdp":
            labels["mu2"] = self.in_measure(amount)
        present = shown.keys() | labels.keys()
        labels["measure"] = self.measure
        labels["additive"] = [name for name in self.additive if name in present]
        if self.measure != "epsilon" and "epsilon" in shown:
            labels["epsilon_alone"] = shown["epsilon"]
        return {**shown, **labels}

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
                epsilon=EPSILON.cost_units(cost.epsilon),
                delta=DELTA.cost_units(cost.delta),
                # the advanced filter's share: the exact epsilon^2 / 2, rounded up
                rho=RHO.cost_units(cost.epsilon**2 / 2) if self.advanced else 0,
            )
        if self.name == "rdp":
            return Amount(rho=self._renyi_units(cost))
        if self.name == "gdp":
            if cost.mu is None:
                raise UnsupportedCost(
                    "this mechanism declares no Gaussian-DP cost, so a gdp "
                    "dataset cannot account it; use a Gaussian mechanism"
                )
            return Amount(rho=RHO.cost_units(cost.mu**2))
        if cost.rho is not None:
            return Amount(rho=RHO.cost_units(cost.rho))
        if cost.delta == 0:
            return Amount(rho=RHO.cost_units(cost.epsilon**2 / 2))
        raise UnsupportedCost(
            "this mechanism has delta > 0 and no rho, so a zcdp dataset cannot account it; "
            "state its noise as sigma or rho"
        )

    def _renyi_units(self, cost: StatedCost) -> int:
        """The divergence at the order: as declared; else alpha rho (rho-zCDP is
        (alpha, alpha rho)-RDP for every alpha); else the epsilon-DP bound."""
        order = self.order
        if order is None:
            raise UnsupportedCost("this rdp dataset has no Renyi order")
        if cost.rdp is not None:
            return RHO.cost_units(cost.rdp)
        if cost.rho is not None:
            return RHO.cost_units(cost.rho * Fraction(order))
        if cost.delta == 0:
            return RHO.cost_units(renyi_of_pure(cost.epsilon, order))
        raise UnsupportedCost(
            "this mechanism has delta > 0 and no Renyi divergence, so an rdp "
            "dataset cannot account it; state its noise as sigma or rho"
        )

    def in_measure(self, amount: Amount) -> Decimal:
        """An amount's figure in the mode's measure (epsilon, rho, rdp or mu^2), exactly."""
        if self.converts or self.advanced:
            return RHO.to_decimal(amount.rho)
        return EPSILON.to_decimal(amount.epsilon)

    def lead(self, amount: Amount, *, bound: bool = False) -> Decimal:
        """An amount's figure as amounts lead with it (``lead_name``: epsilon, rho, rdp, or
        on gdp mu, the square root of the measure), without the epsilon conversion that
        ``report`` adds. ``bound``: the amount is a limit or what remains of one, so a mu
        is rounded down (a loss's is rounded up)."""
        if self.name == "gdp":
            return mu_of(amount.rho, down=bound)
        return self.in_measure(amount)

    def report(
        self, amount: Amount, dataset_delta: int, *, bound: bool = False
    ) -> dict[str, Decimal]:
        """An amount as the API shows it (API.md: zcdp amounts carry rho, epsilon, delta;
        rdp amounts rdp, order, epsilon, delta; gdp amounts mu, epsilon, delta). ``bound``
        as ``lead``."""
        delta = DELTA.to_decimal(dataset_delta)
        if self.composition_delta is not None:
            return {
                "epsilon": advanced.epsilon_of(amount.rho, self.composition_delta),
                "delta": DELTA.to_decimal(amount.delta),
                "rho": self.lead(amount),
            }
        if self.name == "zcdp":
            return {
                "rho": self.lead(amount),
                "epsilon": epsilon_of_rho(amount.rho, dataset_delta),
                "delta": delta,
            }
        if self.name == "rdp":
            assert self.order is not None
            return {
                "rdp": self.lead(amount),
                "order": self.order,
                "epsilon": epsilon_of_rdp(amount.rho, dataset_delta, self.order),
                "delta": delta,
            }
        if self.name == "gdp":
            return {
                "mu": self.lead(amount, bound=bound),
                "epsilon": epsilon_of_mu2(amount.rho, dataset_delta),
                "delta": delta,
            }
        return {"epsilon": self.lead(amount), "delta": DELTA.to_decimal(amount.delta)}

    def report_cost(self, amount: Amount, dataset_delta: int) -> dict[str, Decimal]:
        """A release's cost (or cost x multiplicity) as the API shows it: as ``report``, but
        with advanced composition the epsilon the release declared, not the filter's epsilon
        of its rho (one release's epsilon_i, not what it would cost alone)."""
        if not self.advanced:
            return self.report(amount, dataset_delta)
        return {
            "epsilon": EPSILON.to_decimal(amount.epsilon),
            "delta": DELTA.to_decimal(amount.delta),
            "rho": RHO.to_decimal(amount.rho),
        }


MODES: dict[str, Mode] = {
    "pure": Mode("pure", ("epsilon",)),
    "approx": Mode("approx", ("epsilon", "delta")),
    "zcdp": Mode("zcdp", ("rho",)),
    "rdp": Mode("rdp", ("rho",)),  # without an order: mode_of gives a dataset's
    "gdp": Mode("gdp", ("rho",)),
}


def mode_of(
    accounting: str, rdp_order: str | None = None, composition_delta: int | None = None
) -> Mode:
    """The mode of a dataset: its accounting, for rdp its order, and for approx with
    advanced composition the filter's delta' (in delta units)."""
    if accounting == "rdp":
        return _rdp_mode(Decimal(rdp_order) if rdp_order is not None else None)
    if accounting == "approx" and composition_delta is not None:
        return _advanced_mode(composition_delta)
    return MODES[accounting]


@functools.lru_cache(maxsize=256)
def _advanced_mode(composition_delta: int) -> Mode:
    if composition_delta <= 0:
        raise ValueError("the advanced filter's delta' must be at least one delta unit")
    return Mode("approx", ("delta", "rho"), composition_delta=composition_delta)


@functools.lru_cache(maxsize=256)
def _rdp_mode(order: Decimal | None) -> Mode:
    return Mode("rdp", ("rho",), order)


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


def rdp_order(epsilon: Decimal, delta: Decimal) -> Decimal:
    """The order an rdp dataset uses when its creator names none: argmax B(alpha)/alpha for
    its budget, where a Gaussian workload fits best, with alpha - 1 to 4 significant digits
    (any order is sound; this one is fixed before any charge, as the filter needs)."""
    if not 0 < delta < 1:
        raise ValueError("delta must be between 0 and 1")
    alpha = _best_order(lambda a: _b_float(float(epsilon), float(delta), a) / a, maximise=True)
    above = alpha - 1
    return (1 + above.quantize(Decimal(1).scaleb(above.adjusted() - 3))).normalize()


def rdp_limit(epsilon: Decimal, delta: Decimal, order: Decimal) -> int:
    """Units of B(order), the largest Renyi divergence at ``order`` that is
    (epsilon, delta)-DP (CKS20, Proposition 12), rounded down; 0 if none is."""
    if not 0 < delta < 1:
        raise ValueError("delta must be between 0 and 1")
    with decimal.localcontext(_CONTEXT):
        bound = _b_decimal(epsilon, delta, order)
        return max(0, RHO.limit_units(max(Decimal(0), bound - _GUARD)))


def renyi_of_pure(epsilon: Fraction, order: Decimal) -> Decimal:
    """An upper bound on the Renyi divergence at ``order`` of an epsilon-DP mechanism:
    (1/(alpha-1)) ln[(sinh(alpha eps) - sinh((alpha-1) eps)) / sinh(eps)] (Bun and Steinke
    2016, Proposition 3.3), the exact divergence of randomized response; at 60 digits, with
    the guard added."""
    return _renyi_of_pure(epsilon, order)


@functools.lru_cache(maxsize=4096)
def _renyi_of_pure(epsilon: Fraction, order: Decimal) -> Decimal:
    with mpmath.workdps(_DIGITS):
        eps = mpmath.mpf(epsilon.numerator) / epsilon.denominator
        alpha = mpmath.mpf(str(order))
        # in log space: sinh(a e) = e^(a e) (1 - e^(-2 a e)) / 2, and large a e overflows
        log_top = alpha * eps + mpmath.log(
            -mpmath.expm1(-2 * alpha * eps)
            - mpmath.exp(-eps) * (-mpmath.expm1(-2 * (alpha - 1) * eps))
        )
        log_bottom = eps + mpmath.log(-mpmath.expm1(-2 * eps))
        value = (log_top - log_bottom) / (alpha - 1)
        bound = min(value, eps)  # (alpha, eps)-RDP holds for every epsilon-DP mechanism
        return Decimal(mpmath.nstr(bound, 50, strip_zeros=False)) + _GUARD


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


@functools.lru_cache(maxsize=4096)
def epsilon_of_rdp(rdp_units: int, delta_units: int, order: Decimal) -> Decimal:
    """The epsilon at ``delta`` of a Renyi divergence at ``order`` (CKS20, Proposition 12),
    rounded up: R + ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1)."""
    if rdp_units == 0:
        return Decimal(0)
    with decimal.localcontext(_CONTEXT):
        epsilon = RHO.to_decimal(rdp_units) + _conversion_decimal(
            DELTA.to_decimal(delta_units), order
        )
        return EPSILON.to_decimal(EPSILON.cost_units(max(Decimal(0), epsilon) + _GUARD))


def gdp_delta(epsilon: mpmath.mpf, mu: mpmath.mpf) -> mpmath.mpf:
    """delta(epsilon) of mu-Gaussian DP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
    (Dong, Roth and Su 2022, Corollary 2.13), at the working precision."""
    return mpmath.ncdf(-epsilon / mu + mu / 2) - mpmath.exp(epsilon) * mpmath.ncdf(
        -epsilon / mu - mu / 2
    )


def mu_limit(epsilon: Decimal, delta: Decimal) -> int:
    """Units of mu*^2, where mu* is the largest mu whose delta(epsilon) is at most
    ``delta``, rounded down (delta(epsilon) grows with mu: bisection, keeping the low end)."""
    if not 0 < delta < 1:
        raise ValueError("delta must be between 0 and 1")
    return _mu_limit(epsilon, delta)


@functools.lru_cache(maxsize=1024)
def _mu_limit(epsilon: Decimal, delta: Decimal) -> int:
    with mpmath.workdps(_DIGITS):
        eps, target = mpmath.mpf(str(epsilon)), mpmath.mpf(str(delta))
        low, high = mpmath.mpf(0), mpmath.mpf(1)
        while gdp_delta(eps, high) <= target:
            low, high = high, high * 2
        for _ in range(200):
            middle = (low + high) / 2
            if gdp_delta(eps, middle) <= target:
                low = middle
            else:
                high = middle
        units = mpmath.floor(low**2 * RHO.scale)
    return max(0, min(int(units) - 1, SATURATION))


@functools.lru_cache(maxsize=4096)
def epsilon_of_mu2(mu2_units: int, delta_units: int) -> Decimal:
    """The least epsilon on the 10^-9 grid of epsilon units whose delta(epsilon) under
    mu-GDP is at most ``delta`` (delta(epsilon) falls as epsilon grows).

    Floating point only proposes a grid point; every comparison that decides the answer is
    made at 60 digits, at the point less a guard. The proposal is stepped until delta is
    within the target there and above it one unit lower, so a poor proposal costs only
    time: if it is more than a few units off, a bisection on the grid takes over."""
    if mu2_units == 0:
        return Decimal(0)
    with mpmath.workdps(_DIGITS):
        mu = mpmath.sqrt(mpmath.mpf(mu2_units) / RHO.scale)
        target = mpmath.mpf(delta_units) / DELTA.scale
        guard = mpmath.mpf(str(_GUARD))

        def within(units: int) -> bool:
            epsilon = mpmath.mpf(units) / EPSILON.scale - guard
            return bool(gdp_delta(max(epsilon, mpmath.mpf(0)), mu) <= target)

        if within(0):
            return Decimal(0)
        guess = _epsilon_of_mu_float(float(mu), delta_units / DELTA.scale)
        units = least_units(within, guess)
    return EPSILON.to_decimal(units)


def _epsilon_of_mu_float(mu: float, delta: float) -> int | None:
    """A floating-point estimate of epsilon_of_mu2's answer in epsilon units, or None."""

    def excess(epsilon: float) -> float:
        upper = 0.5 * math.erfc((epsilon / mu - mu / 2) / math.sqrt(2))
        lower = math.exp(epsilon) * 0.5 * math.erfc((epsilon / mu + mu / 2) / math.sqrt(2))
        return upper - lower - delta

    try:
        low, high = 0.0, 1.0
        while excess(high) > 0:
            low, high = high, high * 2
            if high > float(MAX_EPSILON):
                return None
        for _ in range(80):
            middle = (low + high) / 2
            low, high = (middle, high) if excess(middle) > 0 else (low, middle)
        return math.ceil(high * EPSILON.scale)
    except (OverflowError, ValueError):
        return None


def least_units(within: Callable[[int], bool], guess: int | None) -> int:
    """The least units u >= 1 with within(u), where within is monotone and within(0) fails:
    from ``guess`` by single steps when it is close, else by doubling and bisection."""
    if guess is not None:
        units = max(1, guess)
        for _ in range(4):
            if not within(units):
                units += 1
            elif units > 1 and within(units - 1):
                units -= 1
            else:
                return units
    low, high = 0, 1  # within(low) fails; find a high where it holds
    while not within(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if within(middle) else (middle, high)
    return high


def mu_of(mu2_units: int, *, down: bool = False) -> Decimal:
    """mu = sqrt(mu^2) to 12 decimals, for display: rounded up (a loss), or down (a limit)."""
    rounding = decimal.ROUND_FLOOR if down else decimal.ROUND_CEILING
    with decimal.localcontext(_CONTEXT) as context:
        context.rounding = rounding
        root = RHO.to_decimal(mu2_units).sqrt()
        return root.quantize(Decimal("1e-12"), rounding=rounding).normalize()


def rho_by_bun_steinke(epsilon: Decimal, delta: Decimal) -> int:
    """Units of the largest rho with rho + 2 sqrt(rho ln(1/delta)) <= epsilon (Bun and
    Steinke 2016, Proposition 1.3), rounded down: looser than ``rho_limit``; the discrete
    Gaussian plugin calibrates its (epsilon, delta) parameters with it, and it is the
    advanced-composition filter's bound (``accounting.advanced``)."""
    return advanced.rho_limit(epsilon, delta)


def _b_float(epsilon: float, delta: float, alpha: float) -> float:
    return epsilon - _conversion_float(delta, alpha)


def _conversion_float(delta: float, alpha: float) -> float:
    """ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1), in floating point."""
    return math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)


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

    In zcdp, rdp and gdp modes a budget states ``epsilon`` (with an optional
    ``delta``, defaulting to the dataset's) to be converted; a zcdp budget may
    instead state ``rho`` directly; ``rho`` in any other mode is a ``ValueError``. With
    advanced composition, (epsilon, delta) becomes rho* at the dataset's delta' and
    delta - delta' (``accounting.advanced.limit``).
    """
    epsilon = stated.get("epsilon")
    delta = stated.get("delta")
    rho = stated.get("rho")
    if rho is not None and (mode.name != "zcdp" or mode.composition_delta is not None):
        # dropped, it would leave the limit without the bound it was meant to state
        raise ValueError(
            f"rho is not a limit in {mode.name} accounting: state the limit as epsilon"
            + ("" if mode.name == "pure" else " and delta")
        )
    if mode.composition_delta is not None:
        return advanced.limit(epsilon, delta, mode.composition_delta)
    if not mode.converts:
        return Limit(
            epsilon=None if epsilon is None else EPSILON.limit_units(epsilon),
            delta=(0 if mode.name == "pure" else None)
            if delta is None
            else DELTA.limit_units(delta),
        )
    if rho is not None and mode.name == "zcdp":
        measure = RHO.limit_units(rho)
    else:
        at_delta = delta if delta is not None else dataset_delta
        if epsilon is None or at_delta is None:
            raise ValueError(
                f"a {mode.name} budget needs epsilon with the dataset's delta"
                + (", or rho" if mode.name == "zcdp" else "")
            )
        measure = converted_limit(mode, epsilon, at_delta)
    return Limit(
        epsilon=None if epsilon is None else EPSILON.limit_units(epsilon),
        delta=None if delta is None else DELTA.limit_units(delta),
        rho=measure,
    )


def converted_limit(mode: Mode, epsilon: Decimal, delta: Decimal) -> int:
    """Units of the enforced limit of a budget of (epsilon, delta) in a converting mode."""
    if mode.name == "zcdp":
        return rho_limit(epsilon, delta)
    if mode.name == "gdp":
        return mu_limit(epsilon, delta)
    assert mode.order is not None
    return rdp_limit(epsilon, delta, mode.order)
