"""The Gaussian mechanism on a power-of-two grid, for approximate DP and zCDP.

- On ``pure``/``approx`` datasets the caller states (epsilon, delta) and the
  L2 sensitivity Δ; sigma is the smallest value meeting the exact privacy
  profile of the Gaussian mechanism (the analytic Gaussian mechanism, Balle
  and Wang, ICML 2018, Theorem 8):
      Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ) <= δ,
  found by bisection and then enlarged by one part in 10^9 to cover the
  floating-point error of the profile. The cost is exactly (epsilon, delta).
- On ``zcdp`` datasets the caller states ``sigma`` or ``rho``; the cost is
  rho = Δ² / (2σ²) (Bun and Steinke 2016, Proposition 1.6).

Noise is a discrete Gaussian on the grid g <= σ * 2^-40 with the sensitivity
ceil(Δ/g) + 1 in grid units and σ scaled by the same factor, so the ratio
Δ/σ that fixes the privacy of the discrete Gaussian is preserved (Canonne,
Kamath and Steinke 2020, Theorem 4 for zCDP; its approximate-DP profile is
at least as good as the continuous one's at integer sensitivity, Theorem 7
and Section 5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from accountant import hookimpl
from accountant.mechanism import Cost, Mechanism, PrivacyContext
from accountant.randomness import RandomSource
from accountant_plugins import _samplers
from accountant_plugins._common import ADDITIVE_INPUT, DELTA, POSITIVE_EPSILON, SENSITIVITY

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
        {"required": ["epsilon", "delta", "sensitivity"], "not": {"anyOf": [
            {"required": ["sigma"]}, {"required": ["rho"]}]}},
        {"required": ["sigma", "sensitivity"], "not": {"anyOf": [
            {"required": ["epsilon"]}, {"required": ["delta"]}, {"required": ["rho"]}]}},
        {"required": ["rho", "sensitivity"], "not": {"anyOf": [
            {"required": ["epsilon"]}, {"required": ["delta"]}, {"required": ["sigma"]}]}},
    ],
    "additionalProperties": False,
}


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """δ(ε) of the Gaussian mechanism with noise σ (Balle and Wang 2018, Theorem 8)."""
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    tail = _phi(-a - b)
    subtracted = 0.0 if tail == 0.0 else math.exp(epsilon + math.log(tail))
    return _phi(a - b) - subtracted


def analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest σ with δ(ε) <= delta, from above, with a 10^-9 relative margin."""
    low, high = 1e-12 * sensitivity, sensitivity
    while gaussian_delta(high, epsilon, sensitivity) > delta:
        low, high = high, high * 2
    while (high - low) > 1e-13 * high:
        middle = (low + high) / 2
        if gaussian_delta(middle, epsilon, sensitivity) > delta:
            low = middle
        else:
            high = middle
    return high * (1 + 1e-9)


def _uses_zcdp_form(params: Mapping[str, Any]) -> bool:
    return "sigma" in params or "rho" in params


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    if context.accounting == "zcdp":
        if not _uses_zcdp_form(params):
            raise ValueError("on a zcdp dataset, state the gaussian noise as sigma or rho")
        if "rho" in params:
            return Cost(epsilon=0, rho=params["rho"])
        sensitivity, sigma = Fraction(params["sensitivity"]), Fraction(params["sigma"])
        return Cost(epsilon=0, rho=sensitivity**2 / (2 * sigma**2))
    if _uses_zcdp_form(params):
        raise ValueError("on a pure or approx dataset, state the gaussian cost as "
                         "epsilon and delta")
    return Cost(epsilon=params["epsilon"], delta=params["delta"])


def sigma_of(params: Mapping[str, Any]) -> float:
    sensitivity = float(params["sensitivity"])
    if "sigma" in params:
        return float(params["sigma"])
    if "rho" in params:
        return sensitivity / math.sqrt(2 * float(params["rho"]))
    return analytic_sigma(float(params["epsilon"]), float(params["delta"]), sensitivity)


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    sensitivity = float(params["sensitivity"])
    sigma = sigma_of(params)
    grid = _samplers.grid_for(sigma)
    grid_sigma = sigma / sensitivity * _samplers.grid_sensitivity(sensitivity, grid)
    sigma2 = Fraction(grid_sigma) ** 2
    if "size" in data:
        noise = _samplers.discrete_gaussian(source, sigma2, int(data["size"]))
        return {"noise": (noise * grid).tolist(), "grid": grid}
    values = _samplers.snap(_samplers.as_floats(list(data["values"])), grid)
    noise = _samplers.discrete_gaussian(source, sigma2, values.size)
    return {"values": (values + noise * grid).tolist()}


GAUSSIAN = Mechanism(
    name="gaussian",
    description="Gaussian noise calibrated by the analytic Gaussian mechanism, on a fine grid.",
    params_schema=PARAMS_SCHEMA,
    input_schema=ADDITIVE_INPUT,
    accounting=("approx", "zcdp"),
    cost=cost,
    run=run,
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [GAUSSIAN]
