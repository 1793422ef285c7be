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
from typing import Any

from accountant import hookimpl
from accountant.mechanism import Accuracy, Cost, Mechanism, PrivacyContext, UnusableParameters
from accountant.randomness import RandomSource
from accountant_plugins import _accuracy, _exact, _samplers
from accountant_plugins._common import (
    ADDITIVE_INPUT,
    approx,
    coordinates,
    epsilon_params,
    version,
)

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
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [LAPLACE]
