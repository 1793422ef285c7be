"""The discrete Laplace (two-sided geometric) mechanism on integers: epsilon-DP.

P(noise = y) is proportional to exp(-|y| epsilon / Δ) (Ghosh, Roughgarden and
Sundararajan, STOC 2009; sampled exactly by Canonne, Kamath and Steinke 2020,
Algorithm 2). The scale Δ/epsilon is used exactly when it is a ratio of
integers below 2^50, else rounded up; scales of 2^50 and more are refused
before anything is charged. The cost is exactly epsilon.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from accountant import hookimpl
from accountant.mechanism import Accuracy, Cost, Mechanism, PrivacyContext, UnusableParameters
from accountant.randomness import RandomSource
from accountant_plugins import _accuracy, _exact, _samplers
from accountant_plugins._common import INTEGER_INPUT, approx, epsilon_params, version


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
        return {"noise": _exact.discrete_laplace(source, s, t, int(data["size"])).tolist()}
    values = _samplers.as_ints(list(data["values"]))
    return {"values": (values + _exact.discrete_laplace(source, s, t, values.size)).tolist()}


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
    version=version(2),
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [DISCRETE_LAPLACE]
