"""Exact samplers on integers, vectorised with numpy, from uniformly random 64-bit words.

Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy"
(NeurIPS 2020; arXiv 2004.00010), give samplers that use only integer
arithmetic and fair random bits, so they are exact: no floating-point value
ever decides an outcome. This module implements their

- Algorithm 1, Bernoulli(exp(-gamma)) for rational gamma >= 0,
- Algorithm 2, the discrete Laplace, P(y) proportional to exp(-|y| s / t),
- Algorithm 3, the discrete Gaussian, P(y) proportional to exp(-y^2 / (2 sigma^2)),

as masked rejection loops over numpy int64 arrays: each round draws for all
samples still undecided at once. Every ratio is kept below 2^62 so int64
never overflows (the callers choose their rationals accordingly).

Timing: the number of rounds depends on the draws, which is the channel of
Jin et al. (S&P 2022); whole vectors are drawn at once, which blurs the
time of any single value but does not remove the channel.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from accountant.randomness import RandomSource

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

#: Largest denominator this module accepts: products with small counters stay below 2^63.
MAX_DENOMINATOR = 2**55


def uniform_below(source: RandomSource, bounds: Ints) -> Ints:
    """For each bound b >= 1, a uniform integer in [0, b), by rejection on masked words."""
    bounds = np.asarray(bounds, dtype=np.int64)
    mask = bounds - 1
    for shift in (1, 2, 4, 8, 16, 32):
        mask |= mask >> shift
    out = np.empty(bounds.shape, dtype=np.int64)
    pending = np.arange(bounds.size)
    while pending.size:
        words = (source.uint64(pending.size) >> np.uint64(1)).astype(np.int64)
        draws = words & mask[pending]
        accepted = draws < bounds[pending]
        out[pending[accepted]] = draws[accepted]
        pending = pending[~accepted]
    return out


def bernoulli_exp_at_most_one(source: RandomSource, numerators: Ints, denominator: Ints) -> Bools:
    """Bernoulli(exp(-n/d)) for 0 <= n <= d (CKS20, Algorithm 1, first case).

    Draw A_k ~ Bernoulli(gamma / k) for k = 1, 2, ... until one is 0; the
    result is 1 when that first 0 comes at an odd k.
    """
    numerators = np.asarray(numerators, dtype=np.int64)
    denominator = np.broadcast_to(np.asarray(denominator, dtype=np.int64), numerators.shape)
    k = np.ones(numerators.shape, dtype=np.int64)
    pending = np.arange(numerators.size)
    while pending.size:
        success = uniform_below(source, denominator[pending] * k[pending]) < numerators[pending]
        k[pending[success]] += 1
        pending = pending[success]
    odd: Bools = (k % 2) == 1
    return odd


def bernoulli_exp(source: RandomSource, numerators: Ints, denominator: Ints) -> Bools:
    """Bernoulli(exp(-n/d)) for any n >= 0 (CKS20, Algorithm 1).

    exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma))): one
    Bernoulli(exp(-1)) per whole unit, then one for the fraction.
    """
    numerators = np.asarray(numerators, dtype=np.int64)
    denominator = np.broadcast_to(np.asarray(denominator, dtype=np.int64), numerators.shape)
    whole, fraction = np.divmod(numerators, denominator)
    result = np.ones(numerators.shape, dtype=bool)
    step = 0
    while True:
        alive = np.flatnonzero(result & (whole > step))
        if not alive.size:
            break
        ones = np.ones(alive.size, dtype=np.int64)
        result[alive] = bernoulli_exp_at_most_one(source, ones, ones)
        step += 1
    alive = np.flatnonzero(result)
    result[alive] = bernoulli_exp_at_most_one(source, fraction[alive], denominator[alive])
    return result


class _Words:
    """Random 63-bit integers taken one at a time from blocks of the source's words."""

    def __init__(self, source: RandomSource) -> None:
        self._source = source
        self._block: list[int] = []

    def next(self) -> int:
        if not self._block:
            self._block = (self._source.uint64(64) >> np.uint64(1)).tolist()
        return self._block.pop()

    def below(self, bound: int) -> int:
        mask = (1 << (bound - 1).bit_length()) - 1
        while True:
            draw = self.next() & mask
            if draw < bound:
                return draw

    def bernoulli_exp_at_most_one(self, numerator: int, denominator: int) -> bool:
        k = 1
        while self.below(denominator * k) < numerator:
            k += 1
        return k % 2 == 1


def _scalar_discrete_laplace(source: RandomSource, s: int, t: int, n: int) -> Ints:
    """The same Algorithm 2 one draw at a time in Python integers: faster for a few values,
    where numpy's per-round overhead dominates (REFERENCES.md, section 1)."""
    words = _Words(source)
    out = []
    while len(out) < n:
        u = words.below(t)
        if not words.bernoulli_exp_at_most_one(u, t):
            continue
        v = 0
        while words.bernoulli_exp_at_most_one(1, 1):
            v += 1
        y = (u + t * v) // s
        negative = words.next() & 1
        if negative and y == 0:
            continue
        out.append(-y if negative else y)
    return np.array(out, dtype=np.int64)


#: Below this many draws the scalar sampler is faster than the vectorised one.
SCALAR_BELOW = 32


def discrete_laplace(source: RandomSource, s: int, t: int, n: int) -> Ints:
    """n draws with P(y) proportional to exp(-|y| s / t): scale t / s (CKS20, Algorithm 2)."""
    if not (1 <= s < MAX_DENOMINATOR and 1 <= t < MAX_DENOMINATOR):
        raise ValueError(f"discrete Laplace parameters out of range: s={s}, t={t}")
    if n < SCALAR_BELOW:
        return _scalar_discrete_laplace(source, s, t, n)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = max(64, int((n - filled) * 1.7))
        u = uniform_below(source, np.full(want, t, dtype=np.int64))
        keep = bernoulli_exp_at_most_one(source, u, np.full(want, t, dtype=np.int64))
        u = u[keep]
        v = np.zeros(u.size, dtype=np.int64)
        pending = np.arange(u.size)
        while pending.size:  # V: the number of Bernoulli(exp(-1)) successes before a failure
            ones = np.ones(pending.size, dtype=np.int64)
            success = bernoulli_exp_at_most_one(source, ones, ones)
            v[pending[success]] += 1
            pending = pending[success]
        y = (u + t * v) // s
        negative = (source.uint64(u.size) & np.uint64(1)).astype(bool)
        valid = ~(negative & (y == 0))
        values = np.where(negative, -y, y)[valid][: n - filled]
        out[filled : filled + values.size] = values
        filled += values.size
    return out


def discrete_gaussian(source: RandomSource, sigma2_num: int, sigma2_den: int, n: int) -> Ints:
    """n draws with P(y) proportional to exp(-y^2 / (2 sigma^2)), sigma^2 = num / den
    (CKS20, Algorithm 3): a discrete Laplace proposal of scale t = floor(sigma) + 1,
    accepted with probability exp(-(|y| - sigma^2 / t)^2 / (2 sigma^2)).

    With sigma^2 = p/q the exponent is (|y| q t - p)^2 / (2 p q t^2); the
    caller keeps 2 p q t^2 below ``MAX_DENOMINATOR`` (see ``fits_exactly``).
    """
    p, q = sigma2_num, sigma2_den
    t = _isqrt_floor(p, q) + 1
    denominator = 2 * p * q * t * t
    if not fits_exactly(p, q):
        raise ValueError("sigma^2 too large or too finely divided for exact int64 sampling")
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = max(64, int((n - filled) * 1.6))
        y = discrete_laplace(source, 1, t, want)
        distance = np.abs(y) * (q * t) - p
        # With q^2 t^4 < 2^47, |distance| < 2^31 whenever |y| <= 64 t. A proposal beyond that
        # (probability about e^-64) would be accepted with probability below e^-1900, so
        # rejecting it changes no probability by more than e^-1900.
        safe = np.abs(distance) < 2**31
        numerators = np.where(safe, distance, 0) ** 2
        accept = safe & bernoulli_exp(source, numerators,
                                      np.full(want, denominator, dtype=np.int64))
        values = y[accept][: n - filled]
        out[filled : filled + values.size] = values
        filled += values.size
    return out


def fits_exactly(p: int, q: int) -> bool:
    """Whether ``discrete_gaussian`` can sample sigma^2 = p/q exactly in int64."""
    t = _isqrt_floor(p, q) + 1
    return 2 * p * q * t * t < 2**48 and q * t < 2**20


def _isqrt_floor(p: int, q: int) -> int:
    """floor(sqrt(p / q)) exactly."""
    import math

    root = math.isqrt(p // q)
    while (root + 1) * (root + 1) * q <= p:
        root += 1
    return root
