"""Noise on a power-of-two grid for real-valued mechanisms, and rational parameters for the
exact integer samplers of ``_exact``.

Real-valued mechanisms follow Google's "Secure Noise Generation"
(differential-privacy/common_docs/Secure_Noise_Generation.pdf): the input is
rounded to a multiple of a power of two g no larger than scale * 2^-40, and
integer noise times g is added, so every output lies on the grid and its low
bits carry nothing about the input (Mironov, CCS 2012, exploits the porous
set of doubles that textbook samplers produce). Rounding moves two
neighbouring inputs apart by at most g, so the noise is calibrated to the
sensitivity ceil(Δ/g) + 1 in grid units: the slack goes into the noise
scale, never into the charged cost.

The grid Laplace is exact (``_exact.discrete_laplace``). The grid Gaussian
has sigma near 2^40 grid units, beyond what int64 can hold squared, so its
proposal is the exact discrete Laplace and only its acceptance test,
exp(-(|y| - sigma^2/t)^2 / (2 sigma^2)) against a uniform double, is
computed in binary64 (a relative error near 2^-52 in each acceptance
probability). Integer Gaussians small enough for int64 are sampled exactly.
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


def grid_sensitivity(sensitivity: float, grid: float) -> int:
    """Sensitivity in grid units after rounding inputs to the grid: ceil(Δ/g) + 1."""
    return math.ceil(sensitivity / grid) + 1


def snap(values: FloatArray, grid: float) -> FloatArray:
    """Round each value to the nearest multiple of ``grid`` (exact in binary64)."""
    small = np.abs(values) < _EXACT_MULTIPLES * grid
    snapped: FloatArray = np.where(small, np.round(values / grid) * grid, values)
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


def discrete_gaussian(source: RandomSource, sigma2: Fraction, n: int) -> IntArray:
    """n draws of the discrete Gaussian with variance parameter at least ``sigma2``: exact when
    sigma^2, rounded up to a multiple of 2^-k, fits int64; else with a binary64 acceptance."""
    for k in range(20, -1, -1):
        p = math.ceil(sigma2 * 2**k)
        if _exact.fits_exactly(p, 2**k):
            return _exact.discrete_gaussian(source, p, 2**k, n)
    return _large_discrete_gaussian(source, math.sqrt(float(sigma2)) * (1 + 2**-40), n)


def _large_discrete_gaussian(source: RandomSource, sigma: float, n: int) -> IntArray:
    t = math.floor(sigma) + 1
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = max(64, int((n - filled) * 1.6))
        y = _exact.discrete_laplace(source, 1, t, want)
        excess = np.abs(y) - sigma * sigma / t
        accept = source.uniform(want) <= np.exp(-(excess * excess) / (2 * sigma * sigma))
        taken = y[accept][: n - filled]
        out[filled : filled + taken.size] = taken
        filled += taken.size
    return out


def as_floats(values: list[object]) -> FloatArray:
    """Input numbers (parsed as decimals) as doubles; the schema bounds them to be finite."""
    return np.asarray(values, dtype=np.float64)


def as_ints(values: list[object]) -> IntArray:
    return np.asarray(values, dtype=np.int64)
