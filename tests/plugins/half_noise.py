"""A deliberately broken plugin: declares epsilon but draws half the Laplace noise it needs."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from accountant import hookimpl
from accountant.mechanism import Cost, Mechanism
from accountant.randomness import RandomSource
from accountant_plugins import _exact
from accountant_plugins._common import INTEGER_INPUT, epsilon_params


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    scale = Fraction(params["sensitivity"]) / Fraction(params["epsilon"]) / 2  # the bug
    noise = _exact.discrete_laplace(source, scale.denominator, scale.numerator, len(data["values"]))
    return {"values": [int(v) + int(z) for v, z in zip(data["values"], noise, strict=True)]}


HALF_NOISE = Mechanism(
    name="half_noise",
    description="broken on purpose",
    params_schema=epsilon_params(),
    input_schema=INTEGER_INPUT,
    accounting=("pure",),
    cost=lambda params, context: Cost(epsilon=params["epsilon"]),
    run=run,
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [HALF_NOISE]
