"""Noise on a power-of-two grid for real-valued mechanisms, and rational parameters for the
exact integer samplers of ``_exact``.

Real-valued mechanisms follow Google's "Secure Noise Generation"
(differential-privacy/common_docs/Secure_Noise_Generation.pdf): the input is
rounded to a multiple of a power of two g no larger than scale * 2^-40, and
integer noise times g is added, so every output lies on the grid and its low
bits carry nothing about the input (Mironov, CCS 2012, exploits the porous
set of doubles that textbook samplers produce).

Rounding is paid for per coordinate. Rounding a value to the nearest multiple
of g moves it by at most g/2, so two neighbouring inputs x, x' of d values
with ||x - x'||_1 <= Δ round to grid points whose difference v (an integer
vector, in grid units) has ||v||_1 <= Δ/g + d, and ||v||_2 <= Δ/g + sqrt(d)
when ||x - x'||_2 <= Δ (triangle inequality: v = (x - x')/g + e, each
|e_i| <= 1). The noise is calibrated to those grid sensitivities
(``grid_sensitivity``, ``grid_l2_sensitivity``): the slack goes into the
noise scale, never into the charged cost. Raw noise (``size``) is the same
with d = size: the caller rounds its values to the grid.

Every sampler here is exact: the grid Laplace is ``_exact.discrete_laplace``,
and the grid Gaussian, whose sigma near 2^40 grid units is beyond what int64
holds squared, is ``_exact.discrete_gaussian_large``. Outputs are turned into
doubles only at the end (g times an integer, plus a grid value): rounding a
released value is post-processing and costs nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from accountant.randomness import RandomSource
from accountant_plugins import _exact

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: Doubles of magnitude at least 2^52 * g are already multiples of g.
_EXACT_MULTIPLES = 2.0**52


def grid_for(scale: float) -> float:
    """The largest power of two not above ``scale * 2^-40``."""
    _, exponent = math.frexp(scale)  # scale = m * 2^exponent with m in [0.5, 1)
    return math.ldexp(1.0, exponent - 1 - 40)


def grid_sensitivity(sensitivity: float | Fraction, grid: float, coordinates: int = 1) -> int:
    """L1 sensitivity in grid units after rounding ``coordinates`` values to the grid:
    ceil(Δ/g) + d, computed exactly (an integer at least Δ/g + d)."""
    return math.ceil(Fraction(sensitivity) / Fraction(grid)) + coordinates


def grid_l2_sensitivity(
    sensitivity: float | Fraction, grid: float, coordinates: int = 1
) -> Fraction:
    """L2 sensitivity in grid units after rounding ``coordinates`` values to the grid: a
    rational at least Δ/g + sqrt(d)."""
    root = math.isqrt(coordinates)
    sqrt_d = (
        root if root * root == coordinates else Fraction(math.isqrt(coordinates * 4**20) + 1, 2**20)
    )
    return Fraction(sensitivity) / Fraction(grid) + sqrt_d


def snap(values: FloatArray, grid: float) -> FloatArray:
    """Round each value to a nearest multiple of ``grid`` (exact in binary64)."""
    small = np.abs(values) < _EXACT_MULTIPLES * grid
    inside = np.where(small, values, 0.0)  # no division of values the grid cannot hold
    snapped: FloatArray = np.where(small, np.round(inside / grid) * grid, values)
    return snapped


def laplace_ratio(scale: Fraction) -> tuple[int, int]:
    """(s, t) with t/s >= ``scale`` and both small enough for ``_exact``: the scale itself
    when it fits, else rounded up (more noise, never less) to a multiple of 2^-k."""
    if scale.denominator < 2**50 and scale.numerator < 2**50:
        return scale.denominator, scale.numerator
    for k in range(40, -1, -1):
        t = math.ceil(scale * 2**k)
        if t < 2**50:
            return 2**k, t
    raise ValueError(f"Laplace scale {float(scale)} is too large")


def sampled_sigma2(sigma2: Fraction) -> Fraction:
    """The variance parameter ``discrete_gaussian`` samples for a requested one: sigma^2 rounded
    up to a multiple of 2^-k where the int64 sampler can take it, else up to an integer (a
    relative increase below 2^-40 there)."""
    for k in range(20, -1, -1):
        p = math.ceil(sigma2 * 2**k)
        if _exact.fits_exactly(p, 2**k):
            return Fraction(p, 2**k)
    return Fraction(math.ceil(sigma2))


def discrete_gaussian(source: RandomSource, sigma2: Fraction, n: int) -> IntArray:
    """n draws of the discrete Gaussian with variance parameter ``sampled_sigma2(sigma2)``,
    exactly (``_exact``)."""
    used = sampled_sigma2(sigma2)
    if used.denominator > 1 or _exact.fits_exactly(used.numerator, 1):
        return _exact.discrete_gaussian(source, used.numerator, used.denominator, n)
    return _exact.discrete_gaussian_large(source, used.numerator, n)


_LARGEST = np.finfo(np.float64).max


def on_grid(noise: IntArray, grid: float) -> list[float]:
    """Integer noise times the grid, as doubles (exact below 2^53 grid units; beyond, rounding
    and clipping to the largest double are post-processing)."""
    return add_on_grid(np.zeros(noise.size), noise, grid)


def add_on_grid(values: FloatArray, noise: IntArray, grid: float) -> list[float]:
    """Grid values plus integer noise times the grid, as doubles."""
    with np.errstate(over="ignore"):
        total = values + noise.astype(np.float64) * grid
    clipped: list[float] = np.clip(total, -_LARGEST, _LARGEST).tolist()
    return clipped


def as_floats(values: list[object]) -> FloatArray:
    """Input numbers (parsed as decimals) as doubles; the schema bounds them to be finite."""
    return np.asarray(values, dtype=np.float64)


def as_ints(values: list[object]) -> IntArray:
    return np.asarray(values, dtype=np.int64)
