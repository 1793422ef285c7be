"""The discrete Laplace (two-sided geometric) mechanism on integers: epsilon-DP.

P(noise = y) is proportional to exp(-|y| epsilon / Δ) (Ghosh, Roughgarden and
Sundararajan, STOC 2009; sampled exactly by Canonne, Kamath and Steinke 2020,
Algorithm 2). The scale Δ/epsilon is used exactly when it is a ratio of
integers below 2^50, else rounded up; scales of 2^50 and more are refused
before anything is charged. The cost is exactly epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from accountant import hookimpl
from accountant.accounting.plan_pricing import generic_pair
from accountant.mechanism import Accuracy, Cost, Mechanism, PrivacyContext, UnusableParameters
from accountant.randomness import RandomSource
from accountant_plugins import _accuracy, _exact, _samplers
from accountant_plugins._common import INTEGER_INPUT, approx, epsilon_params, version
from accountant_plugins.laplace import discrete_laplace_loss

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    return Cost(epsilon=params["epsilon"])


def calibrate(params: Mapping[str, Any]) -> tuple[int, int]:
    """(s, t): the noise's scale t/s >= Δ/epsilon, or ``UnusableParameters``."""
    scale = Fraction(params["sensitivity"]) / Fraction(params["epsilon"])
    if scale >= 2**50:
        raise UnusableParameters(
            "params.epsilon",
            f"sensitivity/epsilon is {approx(scale)}; at most 2^50 (about 1.1e15) is supported",
        )
    return _samplers.laplace_ratio(scale)


def prepare(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> None:
    calibrate(params)


def accuracy(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> Accuracy:
    """The noise as sampled: scale t/s, the exact half-width (``_accuracy``)."""
    return _accuracy.discrete_laplace(*calibrate(params))


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    s, t = calibrate(params)
    if "size" in data:
        noise = _exact.discrete_laplace(source, s, t, int(data["size"]))
        return {"noise": noise.tolist(), "grid": 1}
    values = _samplers.as_ints(list(data["values"]))
    return {"values": (values + _exact.discrete_laplace(source, s, t, values.size)).tolist()}


def privacy_loss(params: Mapping[str, Any], d: int, interval: float) -> PrivacyLossDistribution:
    """A privacy-loss distribution that dominates one release for any number d of values:
    ``laplace.discrete_laplace_loss`` with shift L = floor(Δ) (integer inputs whose L1
    distance is at most Δ are at most floor(Δ) apart) and parameter epsilon/Δ, at least the
    sampler's s/t (its scale t/s is Δ/epsilon or more). docs/accounting.md ("Batches")
    proves the domination. A sensitivity below 1 is priced by the generic pair of its
    epsilon-DP cost instead: it is what the single charge claims, and no stronger claim is
    made for a sensitivity integer data cannot have."""
    calibrate(params)  # what run could not carry out is refused here too
    epsilon, sensitivity = Fraction(params["epsilon"]), Fraction(params["sensitivity"])
    shift = math.floor(sensitivity)
    if shift >= 1:
        return discrete_laplace_loss(epsilon / sensitivity, shift, interval)
    return generic_pair(epsilon, Fraction(0), interval)


DISCRETE_LAPLACE = Mechanism(
    name="discrete_laplace",
    description="Two-sided geometric noise on integers, exact sampling (pure DP).",
    params_schema=epsilon_params(),
    input_schema=INTEGER_INPUT,
    accounting=("pure", "approx", "zcdp", "rdp"),
    cost=cost,
    run=run,
    prepare=prepare,
    accuracy=accuracy,
    version=version(3),  # 3: raw noise states its grid (1)
    privacy_loss=privacy_loss,
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [DISCRETE_LAPLACE]
