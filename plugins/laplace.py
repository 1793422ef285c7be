"""The Laplace mechanism on a power-of-two grid: epsilon-DP for L1 sensitivity Δ.

Scale b = Δ / epsilon (Dwork, McSherry, Nissim and Smith, TCC 2006). The
noise is the exact discrete Laplace (Canonne, Kamath and Steinke 2020,
Algorithm 2) on a grid g <= b * 2^-40, with scale t = ceil((ceil(Δ/g) + d) /
epsilon) grid units for d values: rounding d values to the grid moves their
L1 distance by at most d grid units (see ``_samplers``), and a discrete
Laplace of scale t is (L/t)-DP for integer shifts of L1 norm L. So the
release is epsilon-DP and the cost is exactly epsilon. For long vectors the
grid is made finer (g <= Δ 2^-20 / d) so that rounding adds at most a
fraction 2^-20 to the noise, as long as t stays below 2^54.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from accountant import hookimpl
from accountant.mechanism import (
    MAX_PRIVACY_LOSS_BUCKETS,
    Accuracy,
    Cost,
    Mechanism,
    PrivacyContext,
    PrivacyLossTooWide,
    UnusableParameters,
)
from accountant.randomness import RandomSource
from accountant_plugins import _accuracy, _exact, _samplers
from accountant_plugins._common import (
    ADDITIVE_INPUT,
    approx,
    coordinates,
    epsilon_params,
    version,
)

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

#: Scales whose grid is a normal double and whose outputs stay finite (|noise| < 2^63 g).
MIN_SCALE, MAX_SCALE = Fraction(2) ** -980, Fraction(2) ** 960
MAX_T = 2**54


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    return Cost(epsilon=params["epsilon"])


def calibrate(params: Mapping[str, Any], d: int) -> tuple[float, int]:
    """(grid g, discrete Laplace scale t in grid units) for d values, or ``UnusableParameters``."""
    return _calibrate(params["epsilon"], params["sensitivity"], d)


@lru_cache(maxsize=4096)  # called twice per charge (prepare, run) with few distinct values
def _calibrate(epsilon_value: Any, sensitivity_value: Any, d: int) -> tuple[float, int]:
    epsilon, sensitivity = Fraction(epsilon_value), Fraction(sensitivity_value)
    scale = sensitivity / epsilon
    if not MIN_SCALE <= scale <= MAX_SCALE:
        raise UnusableParameters(
            "params.epsilon",
            f"sensitivity/epsilon is {approx(scale)}; "
            "it must lie between 2^-980 and 2^960 (about 1e-295 to 1e289)",
        )
    coarsest = _samplers.grid_for(float(scale))
    finer = sensitivity * 2**20 / d
    grid = coarsest if finer < MIN_SCALE else min(coarsest, _samplers.grid_for(float(finer)))
    while True:
        t = math.ceil(_samplers.grid_sensitivity(sensitivity, grid, d) / epsilon)
        if t < MAX_T:
            return grid, t
        if grid >= coarsest:
            raise UnusableParameters(
                "params.epsilon",
                f"epsilon {approx(epsilon)} is too small for {d} values: "
                f"the noise would exceed the exact sampler's range; use epsilon >= "
                f"{d * 2.0**-53:.3g} or fewer values",
            )
        grid *= 2


def prepare(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> None:
    calibrate(params, coordinates(data))


def accuracy(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> Accuracy:
    """The noise as sampled: g times a discrete Laplace of scale t grid units, so b = t g
    (at least sensitivity/epsilon) and the exact half-width w g (``_accuracy``)."""
    grid, t = calibrate(params, coordinates(data))
    return _accuracy.discrete_laplace(1, t, grid)


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    grid, t = calibrate(params, coordinates(data))
    if "size" in data:
        noise = _exact.discrete_laplace(source, 1, t, int(data["size"]))
        return {"noise": _samplers.on_grid(noise, grid), "grid": grid}
    units = _samplers.grid_units(data["values"], grid)
    noise = _exact.discrete_laplace(source, 1, t, len(units))
    return {"values": _samplers.release(units, noise, grid)}


def privacy_loss(params: Mapping[str, Any], d: int, interval: float) -> PrivacyLossDistribution:
    """A privacy-loss distribution that dominates one release of the grid sampler for d
    values: ``discrete_laplace_loss`` with shift L, the L1 sensitivity in grid units
    (``_samplers.grid_sensitivity``), and parameter epsilon/L. The sampler adds noise of
    parameter 1/t with t = ceil(L/epsilon), so 1/t <= epsilon/L, and two neighbours' grid
    points differ by an integer vector of L1 norm at most L; docs/accounting.md ("Batches")
    proves that this pair dominates every such release. Its largest loss is exactly
    epsilon, the single cost."""
    grid, _ = calibrate(params, d)
    shift = _samplers.grid_sensitivity(Fraction(params["sensitivity"]), grid, d)
    return discrete_laplace_loss(Fraction(params["epsilon"]) / shift, shift, interval)


def discrete_laplace_loss(
    parameter: Fraction, shift: int, interval: float
) -> PrivacyLossDistribution:
    """The pessimistic connect-the-dots privacy-loss distribution (Doroshenko, Ghazi, Kamath,
    Kumar and Manurangsi 2022, "Connect the Dots", Algorithm 1) of the pair (P, P + L) with
    P(k) proportional to exp(-a |k|) on the integers, a = ``parameter`` and L = ``shift`` >= 1:
    dp_accounting's ``DiscreteLaplacePrivacyLoss``, which enumerates the L points of its loss
    and cannot take L near 2^40, computed from the closed form instead. The pair is
    symmetric (k -> L - k swaps P and P + L), so one distribution covers both directions.

    The loss at k is a(|k - L| - |k|): aL for k <= 0, a(L - 2k) for 0 < k < L, -aL for k >= L.
    For -aL <= epsilon < aL the hockey-stick divergence is P(S) - e^epsilon P(S - L) over
    S = {k <= J}, J the number of 0 < k < L with loss above epsilon; with r = e^-a,
    P(k <= J) = 1 - r^(J+1)/(1+r) and P(k <= J - L) = r^(L-J)/(1+r), so

        delta(epsilon) = (1 - e^(epsilon - a(L - J)) + r (1 - r^J)) / (1 + r),

    two terms that are never negative (no cancellation). It is 0 from epsilon = aL and
    1 - e^epsilon up to -aL. J is found in integer arithmetic and each delta at a grid point
    k * interval from aL/interval rounded both ways, in binary64 from correctly rounded
    arguments (rounding errors near 10^-16 of each value, as in dp_accounting's own closed
    forms, are not covered by any pessimistic flag). Connect the dots interpolates delta
    linearly in e^epsilon between grid points, above the true delta, which is convex there.
    """
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution

    top = parameter * shift  # the largest loss, aL, exactly
    step = Fraction(interval)
    lowest, highest = math.floor(-top / step), math.ceil(top / step)
    if highest - lowest + 1 > MAX_PRIVACY_LOSS_BUCKETS:
        raise PrivacyLossTooWide(
            f"a discrete laplace of largest loss {approx(top)} has too wide a privacy loss to "
            f"compose at interval {interval:g}"
        )
    below = math.ceil(-top / step)  # k * interval < -aL exactly when k < below
    a, b = parameter.numerator, parameter.denominator
    r = math.exp(-a / b)
    # epsilon / parameter at grid point k is k * w for the rational w = step / parameter
    w_num, w_den = step.numerator * b, step.denominator * a
    deltas = []
    for k in range(lowest, highest):
        epsilon = k * step.numerator / step.denominator
        if k < below:
            deltas.append(-math.expm1(epsilon))
            continue
        # J = ceil((L - k w) / 2) - 1, within [0, L - 1]
        j = min(shift - 1, max(0, -((k * w_num - shift * w_den) // (2 * w_den)) - 1))
        deltas.append(
            (-math.expm1(epsilon - a * (shift - j) / b) - r * math.expm1(-a * j / b)) / (1 + r)
        )
    deltas.append(0.0)  # highest * interval >= aL
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(interval, lowest, highest, deltas)
    return privacy_loss_distribution.PrivacyLossDistribution(pmf)


LAPLACE = Mechanism(
    name="laplace",
    description="Laplace noise of scale sensitivity/epsilon on a fine power-of-two grid (pure DP).",
    params_schema=epsilon_params(),
    input_schema=ADDITIVE_INPUT,
    accounting=("pure", "approx", "zcdp", "rdp"),
    cost=cost,
    run=run,
    prepare=prepare,
    accuracy=accuracy,
    version=version(3),
    privacy_loss=privacy_loss,
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [LAPLACE]
