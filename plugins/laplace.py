"""The Laplace mechanism on a power-of-two grid: epsilon-DP for L1 sensitivity Δ.

Scale b = Δ / epsilon (Dwork, McSherry, Nissim and Smith, TCC 2006). The
noise is the exact discrete Laplace (Canonne, Kamath and Steinke 2020,
Algorithm 2) on the grid g <= b * 2^-40, with scale t = ceil((ceil(Δ/g) + 1)
/ epsilon) grid units, which is epsilon-DP for inputs rounded to the grid
(see ``_samplers``). The cost is exactly epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from accountant import hookimpl
from accountant.mechanism import Cost, Mechanism, PrivacyContext
from accountant.randomness import RandomSource
from accountant_plugins import _exact, _samplers
from accountant_plugins._common import ADDITIVE_INPUT, epsilon_params


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    return Cost(epsilon=params["epsilon"])


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    epsilon = Fraction(params["epsilon"])
    sensitivity = float(params["sensitivity"])
    grid = _samplers.grid_for(sensitivity / float(epsilon))
    t = math.ceil(_samplers.grid_sensitivity(sensitivity, grid) / epsilon)
    if "size" in data:
        noise = _exact.discrete_laplace(source, 1, t, int(data["size"]))
        return {"noise": (noise * grid).tolist(), "grid": grid}
    values = _samplers.snap(_samplers.as_floats(list(data["values"])), grid)
    noise = _exact.discrete_laplace(source, 1, t, values.size)
    return {"values": (values + noise * grid).tolist()}


LAPLACE = Mechanism(
    name="laplace",
    description="Laplace noise of scale sensitivity/epsilon on a fine power-of-two grid (pure DP).",
    params_schema=epsilon_params(),
    input_schema=ADDITIVE_INPUT,
    accounting=("pure", "approx", "zcdp"),
    cost=cost,
    run=run,
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [LAPLACE]
