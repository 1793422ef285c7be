"""Integer noise on a power-of-two grid, vectorised with numpy, from a CSPRNG.

Real-valued mechanisms follow Google's "Secure Noise Generation" design
(differential-privacy/common_docs/Secure_Noise_Generation.pdf): the input is
rounded to a multiple of a power of two g no larger than scale * 2^-40, and
integer noise times g is added, so every output lies on the grid and its low
bits carry nothing about the input (the attack of Mironov, CCS 2012, needs
the porous set of doubles that textbook samplers produce). Rounding moves two
neighbouring inputs apart by at most g, so the noise is calibrated to the
sensitivity ceil(Δ/g) + 1 in grid units: the slack goes into the noise scale,
never into the charged cost.

The integer samplers draw geometric variables by inversion of the
exponential tail, floor(-t ln U), on uniforms built from ``os.urandom`` bits:
the discrete Laplace is the difference of two such geometrics, and the
discrete Gaussian is the rejection sampler of Canonne, Kamath and Steinke
(NeurIPS 2020, Algorithm 3) on top of it. The acceptance tests evaluate
exp() in double precision, a relative error of about 2^-52 in each
probability; only integers leave these functions.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from accountant.randomness import RandomSource

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


def _geometric(source: RandomSource, t: float, n: int) -> IntArray:
    """n draws with P(G >= g) = exp(-g / t) for g = 0, 1, 2, ..."""
    return np.floor(-t * np.log(source.uniform(n))).astype(np.int64)


def discrete_laplace(source: RandomSource, t: float, n: int) -> IntArray:
    """n draws with P(Z = z) proportional to exp(-|z| / t), the two-sided geometric."""
    difference: IntArray = _geometric(source, t, n) - _geometric(source, t, n)
    return difference


def discrete_gaussian(source: RandomSource, sigma: float, n: int) -> IntArray:
    """n draws with P(Z = z) proportional to exp(-z^2 / (2 sigma^2)) (CKS20, Algorithm 3)."""
    t = math.floor(sigma) + 1
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = max(16, int((n - filled) * 1.6))
        y = discrete_laplace(source, t, want)
        excess = np.abs(y) - sigma * sigma / t
        accept = source.uniform(want) <= np.exp(-(excess * excess) / (2 * sigma * sigma))
        taken = y[accept][: n - filled]
        out[filled : filled + taken.size] = taken
        filled += taken.size
    return out


def as_floats(values: list[object]) -> FloatArray:
    """Input numbers (parsed as decimals) as doubles; the schema bounds them to be finite."""
    return np.array([float(v) for v in values], dtype=np.float64)  # type: ignore[arg-type]
