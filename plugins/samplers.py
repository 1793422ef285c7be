"""The samplers plugin authors may build on: exact on integers, fed by the accountant's source.

Third-party mechanisms should draw noise only through these (or equally
careful code of their own): never ``numpy.random`` or ``random``, never a
textbook floating-point Laplace or Gaussian.
"""

from __future__ import annotations

from accountant_plugins._common import SAMPLERS_VERSION
from accountant_plugins._exact import bernoulli_exp, discrete_laplace, uniform_below
from accountant_plugins._samplers import (
    as_floats,
    discrete_gaussian,
    grid_for,
    grid_sensitivity,
    grid_units,
    laplace_ratio,
    release,
    snap,
)

__all__ = [
    "SAMPLERS_VERSION",
    "as_floats",
    "bernoulli_exp",
    "discrete_gaussian",
    "discrete_laplace",
    "grid_for",
    "grid_sensitivity",
    "grid_units",
    "laplace_ratio",
    "release",
    "snap",
    "uniform_below",
]
