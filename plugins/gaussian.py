"""The Gaussian mechanism on a power-of-two grid, for approximate DP and zCDP.

- On ``pure``/``approx`` datasets the caller states (epsilon, delta) and the
  L2 sensitivity Δ; sigma is the smallest value meeting the exact privacy
  profile of the Gaussian mechanism (the analytic Gaussian mechanism, Balle
  and Wang, ICML 2018, Theorem 8):
      Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ) <= δ,
  found by bisection at 80 significant digits, from above. The cost is
  exactly (epsilon, delta).
- On ``zcdp`` datasets the caller states ``sigma`` or ``rho``; the cost is
  rho = Δ² / (2σ²) (Bun and Steinke 2016, Proposition 1.6). On ``rdp``
  datasets the same rho, charged as alpha rho at the dataset's order; on
  ``gdp`` datasets mu = Δ/σ (Dong, Roth and Su 2022, Theorem 2.7) times
  ``GDP_MARGIN`` for the grid.

Noise is an exact discrete Gaussian on the grid g <= σ * 2^-40 with the L2
sensitivity Δ/g + sqrt(d) in grid units for d values and σ scaled by the same
factor, so the ratio Δ/σ that fixes the privacy of the discrete Gaussian is
preserved (Canonne, Kamath and Steinke 2020, Theorem 4 for zCDP; its
approximate-DP profile at integer sensitivity is at most the continuous
one's, Theorem 7; tests/test_gaussian_privacy.py computes it exactly).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import mpmath

from accountant import hookimpl
from accountant.exact import sqrt_up
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
from accountant_plugins import _accuracy, _samplers
from accountant_plugins._common import (
    ADDITIVE_INPUT,
    DELTA,
    POSITIVE_EPSILON,
    SENSITIVITY,
    approx,
    coordinates,
    version,
)

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

_POSITIVE = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e15}
PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "epsilon": POSITIVE_EPSILON,
        "delta": DELTA,
        "sigma": _POSITIVE,
        "rho": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000},
        "sensitivity": SENSITIVITY,
    },
    "oneOf": [
        {
            "required": ["epsilon", "delta", "sensitivity"],
            "not": {"anyOf": [{"required": ["sigma"]}, {"required": ["rho"]}]},
        },
        {
            "required": ["sigma", "sensitivity"],
            "not": {
                "anyOf": [{"required": ["epsilon"]}, {"required": ["delta"]}, {"required": ["rho"]}]
            },
        },
        {
            "required": ["rho", "sensitivity"],
            "not": {
                "anyOf": [
                    {"required": ["epsilon"]},
                    {"required": ["delta"]},
                    {"required": ["sigma"]},
                ]
            },
        },
    ],
    "additionalProperties": False,
}


#: Working precision of the privacy profile, in decimal digits.
_DIGITS = 80
#: Noise beyond 2^54 grid units is out of the exact sampler's range; grids must be normal
#: doubles, and outputs finite.
MIN_SIGMA, MAX_SIGMA = Fraction(2) ** -980, Fraction(2) ** 960
MAX_GRID_SIGMA = 2**54


def gaussian_delta(ratio: mpmath.mpf, epsilon: mpmath.mpf) -> mpmath.mpf:
    """δ(ε) of the Gaussian mechanism with σ = ratio * Δ (Balle and Wang 2018, Theorem 8):
    Φ(1/(2r) - εr) - e^ε Φ(-1/(2r) - εr), at the working precision."""
    a, b = 1 / (2 * ratio), epsilon * ratio
    return mpmath.ncdf(a - b) - mpmath.exp(epsilon) * mpmath.ncdf(-a - b)


@lru_cache(maxsize=4096)
def noise_ratio(epsilon: Fraction, delta: Fraction) -> Fraction:
    """The least σ/Δ with δ(ε) <= delta, from above: bisection at 80 digits (in binary64 the
    two terms of δ(ε) cancel for small ε, and σ came out below the optimum), ending at a
    point whose δ(ε) is at most delta (1 - 10^-30), as an exact rational."""
    with mpmath.workdps(_DIGITS):
        eps, target = (
            mpmath.mpf(epsilon.numerator) / epsilon.denominator,
            mpmath.mpf(delta.numerator) / delta.denominator,
        )
        target *= 1 - mpmath.mpf(10) ** -30
        low, high = mpmath.mpf(1), mpmath.mpf(1)
        while gaussian_delta(high, eps) > target:
            high *= 2
        while gaussian_delta(low, eps) <= target:
            low /= 2
        while high - low > high * mpmath.mpf(2) ** -70:
            middle = (low + high) / 2
            if gaussian_delta(middle, eps) > target:
                low = middle
            else:
                high = middle
        mantissa, exponent = high.man_exp
    return Fraction(int(mantissa)) * Fraction(2) ** int(exponent)


def analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The analytic Gaussian's σ for (epsilon, delta) and Δ, as a double (rounded up)."""
    ratio = noise_ratio(Fraction(epsilon), Fraction(delta)) * Fraction(sensitivity)
    return math.nextafter(float(ratio), math.inf)


def _uses_zcdp_form(params: Mapping[str, Any]) -> bool:
    return "sigma" in params or "rho" in params


#: The Gaussian-DP parameter charged on gdp datasets is Δ/σ times this: the grid sampler's
#: privacy profile is a discrete Gaussian's, which can exceed the continuous one's by a
#: relative amount of order 1/σ^2 in grid units (σ >= 2^40 there). docs/accounting.md proves
#: that this margin covers the whole profile, tails included, for any number of values.
GDP_MARGIN = 1 + Fraction(1, 2**20)


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    if context.accounting in ("zcdp", "rdp", "gdp"):
        if not _uses_zcdp_form(params):
            raise ValueError(
                f"on a {context.accounting} dataset, state the gaussian noise as sigma or rho"
            )
        if "rho" in params:
            rho = Fraction(params["rho"])
        else:
            sensitivity, sigma = Fraction(params["sensitivity"]), Fraction(params["sigma"])
            rho = sensitivity**2 / (2 * sigma**2)
        if context.accounting == "gdp":
            return Cost(epsilon=0, mu=sqrt_up(2 * rho) * GDP_MARGIN)
        return Cost(epsilon=0, rho=rho)  # rdp: alpha rho at the dataset's order
    if _uses_zcdp_form(params):
        raise ValueError(
            "on a pure or approx dataset, state the gaussian cost as epsilon and delta"
        )
    return Cost(epsilon=params["epsilon"], delta=params["delta"])


def noise_to_sensitivity(params: Mapping[str, Any]) -> Fraction:
    """(σ/Δ)^2, exactly (the analytic calibration is rounded up)."""
    sensitivity = Fraction(params["sensitivity"])
    if "sigma" in params:
        return (Fraction(params["sigma"]) / sensitivity) ** 2
    if "rho" in params:
        return 1 / (2 * Fraction(params["rho"]))
    return noise_ratio(Fraction(params["epsilon"]), Fraction(params["delta"])) ** 2


def calibrate(params: Mapping[str, Any], d: int) -> tuple[float, Fraction]:
    """(grid g, σ^2 in grid units) for d values: σ in grid units is σ/Δ times the L2
    sensitivity in grid units, Δ/g + sqrt(d) (``_samplers``), so the ratio that fixes the
    privacy of the discrete Gaussian is at least the continuous one's."""
    ratio2 = noise_to_sensitivity(params)
    sigma2 = ratio2 * Fraction(params["sensitivity"]) ** 2
    if not MIN_SIGMA**2 <= sigma2 <= MAX_SIGMA**2:
        raise UnusableParameters(
            _noise_field(params),
            f"the noise's sigma squared is "
            f"{approx(sigma2)}; sigma must lie between 2^-980 and 2^960 "
            "(about 1e-295 to 1e289)",
        )
    # the grid sensitivity is at least sqrt(d): a ratio refused below is refused here first,
    # before sigma^2 (of a tiny rho) is taken past the largest double
    if ratio2 * d >= MAX_GRID_SIGMA**2:
        raise _too_large(params, ratio2, d)
    grid = _samplers.grid_for(math.sqrt(float(sigma2)))
    grid_sigma2 = (
        ratio2 * _samplers.grid_l2_sensitivity(Fraction(params["sensitivity"]), grid, d) ** 2
    )
    if grid_sigma2 >= MAX_GRID_SIGMA**2:
        raise _too_large(params, ratio2, d)
    return grid, grid_sigma2


def _too_large(params: Mapping[str, Any], ratio2: Fraction, d: int) -> UnusableParameters:
    return UnusableParameters(
        _noise_field(params),
        f"(sigma/sensitivity)^2 {approx(ratio2)} is too large for {d} "
        f"values: keep sigma/sensitivity below {2.0**53 / math.sqrt(d):.3g}",
    )


def _noise_field(params: Mapping[str, Any]) -> str:
    """The parameter that sets the noise, to name in a refusal."""
    return next(f"params.{name}" for name in ("sigma", "rho", "epsilon") if name in params)


def prepare(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> None:
    calibrate(params, coordinates(data))


def accuracy(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> Accuracy:
    """The noise as sampled: g times a discrete Gaussian of variance parameter
    ``sampled_sigma2`` in grid units, so sigma = g sqrt(that) (at least the stated or
    calibrated sigma) and the exact half-width w g (``_accuracy``)."""
    return _grid_accuracy(*calibrate(params, coordinates(data)))


@lru_cache(maxsize=4096)
def _grid_accuracy(grid: float, sigma2: Fraction) -> Accuracy:
    return _accuracy.discrete_gaussian(_samplers.sampled_sigma2(sigma2), grid)


#: The privacy loss of the Gaussian pair (N(0, s^2), N(m, s^2)) spans about 2 z m / s, where
#: dp_accounting cuts the noise at a mass of e^-50 (z about 10.1): a bound on its buckets.
_LOSS_SPAN = 21


def privacy_loss(params: Mapping[str, Any], d: int, interval: float) -> PrivacyLossDistribution:
    """A privacy-loss distribution that dominates one release of the grid sampler, for any
    number d of values: dp_accounting's Gaussian of standard deviation σ/Δ (σ from
    ``sigma``, or the analytic calibration of (epsilon, delta), as ``calibrate`` uses) and
    sensitivity ``GDP_MARGIN``. docs/accounting.md's ``gdp`` proof shows the sampler's
    tradeoff function is at least G_μ with μ = (Δ/σ) ``GDP_MARGIN``, and G_μ is the tradeoff
    function of that pair (Dong, Roth and Su 2022, Definition 2.6). The float inputs are
    rounded against privacy: σ/Δ down, the margin up (a larger shift over a smaller standard
    deviation is a larger μ, and G_μ decreases in μ)."""
    calibrate(params, d)  # what run could not carry out is refused here too
    deviation = _double_at_most_root(noise_to_sensitivity(params))
    shift = _double_at_least(GDP_MARGIN)
    if deviation == 0 or _LOSS_SPAN * shift / deviation / interval > MAX_PRIVACY_LOSS_BUCKETS:
        raise PrivacyLossTooWide(
            f"a gaussian of sigma/sensitivity {deviation:.3g} has too wide a privacy loss to "
            f"compose at interval {interval:g}"
        )
    from dp_accounting.pld import privacy_loss_distribution

    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=deviation,
        sensitivity=shift,
        pessimistic_estimate=True,
        value_discretization_interval=interval,
    )


def _double_at_least(value: Fraction) -> float:
    """The least double at least ``value``."""
    result = float(value)
    return math.nextafter(result, math.inf) if Fraction(result) < value else result


#: Noise ratios beyond this give a privacy loss far below any interval; the ratio is capped
#: there (rounding it down only adds loss) so that it stays a finite double.
_LARGEST_RATIO = 2.0**500


def _double_at_most_root(square: Fraction) -> float:
    """The greatest double whose square is at most ``square`` (a positive rational), or
    ``_LARGEST_RATIO`` when that is smaller."""
    if square >= Fraction(_LARGEST_RATIO) ** 2:
        return _LARGEST_RATIO
    root = math.sqrt(float(square))
    while root > 0 and Fraction(root) ** 2 > square:
        root = math.nextafter(root, 0.0)
    return root


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    grid, sigma2 = calibrate(params, coordinates(data))
    if "size" in data:
        noise = _samplers.discrete_gaussian(source, sigma2, int(data["size"]))
        return {"noise": _samplers.on_grid(noise, grid), "grid": grid}
    units = _samplers.grid_units(data["values"], grid)
    noise = _samplers.discrete_gaussian(source, sigma2, len(units))
    return {"values": _samplers.release(units, noise, grid)}


GAUSSIAN = Mechanism(
    name="gaussian",
    description="Gaussian noise calibrated by the analytic Gaussian mechanism, on a fine grid.",
    params_schema=PARAMS_SCHEMA,
    input_schema=ADDITIVE_INPUT,
    accounting=("approx", "zcdp", "rdp", "gdp"),
    cost=cost,
    run=run,
    prepare=prepare,
    accuracy=accuracy,
    version=version(3),
    privacy_loss=privacy_loss,
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [GAUSSIAN]
