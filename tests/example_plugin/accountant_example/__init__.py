"""An example mechanism plugin: the sum of values clamped to [lower, upper], with Laplace noise.

Clamping bounds each record's contribution, so the add/remove sensitivity of
the sum is max(|lower|, |upper|) per record: the mechanism computes its own
sensitivity instead of asking the caller for one.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from accountant import hookimpl
from accountant.accounting.modes import renyi_of_pure
from accountant.mechanism import Cost, Mechanism, PrivacyContext
from accountant.randomness import RandomSource
from accountant_plugins.samplers import discrete_laplace, grid_for, grid_sensitivity, snap

BOUND = {"type": "number", "minimum": -1e12, "maximum": 1e12}

PARAMS_SCHEMA = {
    "type": "object",
    "properties": {
        "epsilon": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000},
        "lower": BOUND,
        "upper": BOUND,
    },
    "required": ["epsilon", "lower", "upper"],
    "additionalProperties": False,
}
INPUT_SCHEMA = {
    "type": "object",
    "properties": {"values": {"type": "array", "items": BOUND}},
    "required": ["values"],
    "additionalProperties": False,
}


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    """Pure: parameters and privacy unit in, cost out. No data, no randomness."""
    if params["lower"] >= params["upper"]:
        raise ValueError("lower must be below upper")
    if context.order is None:
        return Cost(epsilon=params["epsilon"])
    # an rdp dataset: the Renyi divergence at its order, here the bound of every
    # epsilon-DP mechanism (what the core would charge if this declared none)
    return Cost(
        epsilon=params["epsilon"], rdp=renyi_of_pure(Fraction(params["epsilon"]), context.order)
    )


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    """Runs only after the accountant has charged ``cost``."""
    lower, upper = float(params["lower"]), float(params["upper"])
    sensitivity = max(abs(lower), abs(upper))
    epsilon = Fraction(params["epsilon"])
    grid = grid_for(sensitivity / float(epsilon))
    t = -(-grid_sensitivity(sensitivity, grid) // epsilon)  # ceiling of a Fraction
    total = float(np.clip(np.array(data["values"], dtype=float), lower, upper).sum())
    noisy = snap(np.array([total]), grid) + discrete_laplace(source, 1, int(t), 1) * grid
    return {"sum": float(noisy[0]), "grid": grid}


BOUNDED_SUM = Mechanism(
    name="bounded_sum",
    description="Sum of values clamped to [lower, upper], with Laplace noise (pure DP).",
    params_schema=PARAMS_SCHEMA,
    input_schema=INPUT_SCHEMA,
    accounting=("pure", "approx", "zcdp", "rdp"),
    cost=cost,
    run=run,
    has_sensitivity=False,
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [BOUNDED_SUM]
