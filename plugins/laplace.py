"""The Laplace mechanism on a power-of-two grid: epsilon-DP for L1 sensitivity Δ.

Scale b = Δ / epsilon (Dwork, McSherry, Nissim and Smith 2006). The noise is a
discrete Laplace on the grid g <= b * 2^-40 with integer parameter
t = (ceil(Δ/g) + 1) / epsilon, which is epsilon-DP for inputs rounded to the
grid (see ``_samplers``). The cost is exactly epsilon.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accountant import hookimpl
from accountant.mechanism import Cost, Mechanism, PrivacyContext
from accountant.randomness import RandomSource
from accountant_plugins import _samplers
from accountant_plugins._common import ADDITIVE_INPUT, POSITIVE_EPSILON, SENSITIVITY

PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"epsilon": POSITIVE_EPSILON, "sensitivity": SENSITIVITY},
    "required": ["epsilon", "sensitivity"],
    "additionalProperties": False,
}


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    return Cost(epsilon=params["epsilon"])


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    epsilon = float(params["epsilon"])
    sensitivity = float(params["sensitivity"])
    grid = _samplers.grid_for(sensitivity / epsilon)
    t = _samplers.grid_sensitivity(sensitivity, grid) / epsilon
    if "size" in data:
        noise = _samplers.discrete_laplace(source, t, int(data["size"]))
        return {"noise": (noise * grid).tolist(), "grid": grid}
    values = _samplers.snap(_samplers.as_floats(list(data["values"])), grid)
    noise = _samplers.discrete_laplace(source, t, values.size)
    return {"values": (values + noise * grid).tolist()}


LAPLACE = Mechanism(
    name="laplace",
    description="Laplace noise of scale sensitivity/epsilon on a fine power-of-two grid (pure DP).",
    params_schema=PARAMS_SCHEMA,
    input_schema=ADDITIVE_INPUT,
    accounting=("pure", "approx", "zcdp"),
    cost=cost,
    run=run,
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [LAPLACE]
