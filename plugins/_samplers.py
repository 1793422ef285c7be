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

Snapping is exact too. Input numbers arrive as decimals (or integers), and
``grid_units`` rounds each x to the nearest integer multiple of g in integer
arithmetic: turning x into a double first would move it by up to half its
unit in the last place, which past 2^53 grid units exceeds the one grid unit
per coordinate that calibration pays for (at 2^60 + 128 and 2^60 + 129, scale
1, two neighbours became doubles 2^48 grid units apart).

Every sampler here is exact: the grid Laplace is ``_exact.discrete_laplace``,
and the grid Gaussian, whose sigma near 2^40 grid units is beyond what int64
holds squared, is ``_exact.discrete_gaussian_large``. A release is computed
from k = snapped units + noise, an exact integer, alone (``release``): k is
rounded once to a double and scaled by g, so what is published is a function
of k, post-processing of an epsilon-DP value, and costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
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
    """Round each double to a nearest multiple of ``grid`` (exact in binary64). Inputs that
    are decimals go through ``grid_units`` instead: their conversion to doubles is not."""
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


_LARGEST = float(np.finfo(np.float64).max)


def on_grid(noise: IntArray, grid: float) -> list[float]:
    """Integer noise times the grid, as doubles (exact below 2^53 grid units; beyond, rounding
    is post-processing)."""
    return _scaled(noise, grid)


def grid_units(values: Sequence[Decimal | int | float], grid: float) -> list[int]:
    """Each value divided by ``grid`` and rounded to the nearest integer (half to even),
    exactly: x = n/d as integers, g = 2^e, so x/g = n 2^-e / d and one integer division
    rounds it. Decimals, integers and doubles are all exact rationals; none is converted to
    a double on the way."""
    _, exponent = math.frexp(grid)  # grid = 0.5 * 2^exponent
    shift = exponent - 1
    units = []
    for value in values:
        numerator, denominator = value.as_integer_ratio()
        if shift < 0:
            numerator <<= -shift
        else:
            denominator <<= shift
        quotient, remainder = divmod(numerator, denominator)
        twice = 2 * remainder
        if twice > denominator or (twice == denominator and quotient & 1):
            quotient += 1
        units.append(quotient)
    return units


#: Below this, a sum of grid units and noise is exact in int64.
_INT64_SAFE = 2**62


def release(units: list[int], noise: IntArray, grid: float) -> list[float]:
    """The released doubles for snapped ``units`` plus integer ``noise``: k = units + noise
    exactly, then k rounded once to a double (half to even) and scaled by the grid (a power
    of two, so the scaling is exact), clipped to the largest double. Each output is a
    function of its k alone."""
    small = all(-_INT64_SAFE < unit < _INT64_SAFE for unit in units)
    if small and (noise.size == 0 or int(np.abs(noise).max()) < _INT64_SAFE):
        return _scaled(np.asarray(units, dtype=np.int64) + noise, grid)
    return [
        _scaled_one(unit + int(draw), grid)
        for unit, draw in zip(units, noise.tolist(), strict=True)
    ]


def _scaled(k: IntArray, grid: float) -> list[float]:
    """float64(k) * grid: int64 to double rounds to nearest, the power-of-two scaling is
    exact (|k| < 2^63 and g <= 2^920 keep it finite; g >= 2^-1020 keeps it normal)."""
    scaled: list[float] = (k.astype(np.float64) * grid).tolist()
    return scaled


def _scaled_one(k: int, grid: float) -> float:
    """k times the grid, rounded once to a double (Python's integer division is correctly
    rounded), or the largest double of its sign where k g is beyond it."""
    try:
        if grid >= 1:
            return float(k * int(grid))
        return k / round(1 / grid)
    except OverflowError:
        return math.copysign(_LARGEST, k)


def as_floats(values: list[object]) -> FloatArray:
    """Numbers as doubles, rounded to nearest. Not for a mechanism's private input: a double
    can be far from the decimal it came from; snap those with ``grid_units``."""
    return np.asarray(values, dtype=np.float64)


def as_ints(values: list[object]) -> IntArray:
    return np.asarray(values, dtype=np.int64)
