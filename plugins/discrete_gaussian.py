"""The discrete Gaussian mechanism on integers (Canonne, Kamath and Steinke, NeurIPS 2020).

- ``zcdp`` datasets: ``sigma`` or ``rho`` with the L2 sensitivity Δ; the
  mechanism is Δ²/(2σ²)-zCDP (CKS20, Theorem 4), so rho = Δ²/(2σ²); on
  ``rdp`` datasets alpha rho at the dataset's order. Not ``gdp``: at small
  sigma a discrete Gaussian's privacy profile exceeds the continuous one's
  (by 0.016 in delta at sigma = 1, shift 1), so mu = Δ/σ would undercount.
- ``approx`` datasets: (epsilon, delta) and Δ; sigma² = Δ²/(2 rho) with rho
  the largest value whose zCDP-to-DP conversion rho + 2 sqrt(rho ln(1/δ))
  stays within epsilon (Bun and Steinke 2016, Proposition 1.3): sound and a
  little noisier than an exact profile. The cost is exactly (epsilon, delta).

Sampling is exact at every sigma (CKS20, Algorithm 3): in int64 while sigma²,
rounded up to a multiple of 2^-k, fits (sigma up to about 2900), and with
``_exact.discrete_gaussian_large`` beyond; sigma above 2^50 is refused before
anything is charged.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction
from typing import Any

from accountant import hookimpl
from accountant.accounting.modes import rho_by_bun_steinke
from accountant.exact import RHO
from accountant.mechanism import Accuracy, Cost, Mechanism, PrivacyContext, UnusableParameters
from accountant.randomness import RandomSource
from accountant_plugins import _accuracy, _samplers
from accountant_plugins._common import INTEGER_INPUT, approx, version
from accountant_plugins.gaussian import PARAMS_SCHEMA
from accountant_plugins.gaussian import cost as gaussian_cost


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    return gaussian_cost(params, context)


def sigma_squared(params: Mapping[str, Any]) -> Fraction:
    sensitivity = Fraction(params["sensitivity"])
    if "sigma" in params:
        return Fraction(params["sigma"]) ** 2
    if "rho" in params:
        rho = Fraction(params["rho"])
    else:
        units = rho_by_bun_steinke(Decimal(params["epsilon"]), Decimal(params["delta"]))
        if units == 0:
            raise UnusableParameters(
                "params.epsilon",
                f"epsilon {params['epsilon']} and delta {params['delta']} leave no room for "
                "noise (the largest rho they allow rounds to 0); at this delta the least "
                f"epsilon is {least_epsilon(Decimal(params['delta'])):f}",
            )
        rho = Fraction(units, RHO.scale)
    return sensitivity**2 / (2 * rho)


def least_epsilon(delta: Decimal) -> Decimal:
    """The least epsilon of 3 significant digits with which ``delta`` leaves rho at least one
    unit: rho + 2 sqrt(rho ln(1/delta)) at one unit, rounded up, and checked by the rule."""
    with localcontext() as context:
        context.prec = 40
        rho = Decimal(1) / RHO.scale
        epsilon = rho + 2 * (rho * (1 / delta).ln()).sqrt()
        context.prec = 3
        context.rounding = ROUND_CEILING
        epsilon = +epsilon
        while rho_by_bun_steinke(epsilon, delta) == 0:  # the rule's guard, at most a step
            epsilon = epsilon.next_plus()
    return epsilon


#: The proposal's scale must stay below the exact sampler's 2^55.
MAX_SIGMA = 2**50


def calibrate(params: Mapping[str, Any]) -> Fraction:
    sigma2 = sigma_squared(params)
    if sigma2 >= MAX_SIGMA**2:
        raise UnusableParameters(
            "params",
            f"the noise's sigma squared is {approx(sigma2)}"
            "; sigma at most 2^50 (about 1.1e15) is supported",
        )
    return sigma2


def prepare(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> None:
    calibrate(params)


def accuracy(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> Accuracy:
    """The noise as sampled: sigma^2 as ``_samplers.sampled_sigma2`` rounds it, the exact
    half-width (``_accuracy``)."""
    return _accuracy.discrete_gaussian(_samplers.sampled_sigma2(calibrate(params)))


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    sigma2 = calibrate(params)
    if "size" in data:
        noise = _samplers.discrete_gaussian(source, sigma2, int(data["size"]))
        return {"noise": noise.tolist(), "grid": 1}
    values = _samplers.as_ints(list(data["values"]))
    noise = _samplers.discrete_gaussian(source, sigma2, values.size)
    return {"values": (values + noise).tolist()}


DISCRETE_GAUSSIAN = Mechanism(
    name="discrete_gaussian",
    description="Discrete Gaussian noise on integers, exact sampling (zCDP and approximate DP).",
    params_schema=PARAMS_SCHEMA,
    input_schema=INTEGER_INPUT,
    accounting=("approx", "zcdp", "rdp"),
    cost=cost,
    run=run,
    prepare=prepare,
    accuracy=accuracy,
    version=version(3),  # 3: raw noise states its grid (1)
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [DISCRETE_GAUSSIAN]
