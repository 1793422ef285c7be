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

import math
from collections.abc import Callable

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


class Words:
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

    def big_below(self, bound: int) -> int:
        """A uniform integer in [0, bound) for any bound >= 1: rejection on as many 63-bit
        words as the bound needs."""
        bits = (bound - 1).bit_length()
        words = -(-bits // 63)
        while True:
            draw = 0
            for _ in range(words):
                draw = (draw << 63) | self.next()
            draw &= (1 << bits) - 1
            if draw < bound:
                return draw

    def bernoulli(self, numerator: int, denominator: int) -> bool:
        """Bernoulli(n/d) for any integers 0 <= n <= d, d >= 1."""
        return numerator >= denominator or (
            numerator > 0 and self.big_below(denominator) < numerator
        )

    def bernoulli_exp(self, numerator: int, denominator: int) -> bool:
        """Bernoulli(exp(-n/d)) for any integers n >= 0, d >= 1, in Python integers (CKS20,
        Algorithm 1): one Bernoulli(exp(-1)) per whole unit, then the fraction."""
        whole, fraction = divmod(numerator, denominator)
        for _ in range(whole):
            if not self.bernoulli_exp_at_most_one(1, 1):
                return False
        return self.fraction_tail(fraction, denominator, 1, None)

    def fraction_tail(self, r: int, d: int, k: int, word: int | None) -> bool:
        """Finish Bernoulli(exp(-r/d)), 0 <= r < d, from round ``k`` of Algorithm 1's first case,
        where A_k ~ Bernoulli(r / (d k)) compares a uniform U with r / (d k). ``word`` is the
        first 63 bits of U when they were drawn already (U = (word + V) / 2^63 with V
        uniform and fresh): the comparison is then finished on V alone, so the draws made so
        far keep their exact probabilities."""
        if word is None:
            success = self.bernoulli(r, d * k)
        else:
            # (word + V) / 2^63 < r / (d k)  <=>  V < (r 2^63 - word d k) / (d k)
            success = self.bernoulli(max(0, (r << 63) - word * d * k), d * k)
        while success:
            k += 1
            success = self.bernoulli(r, d * k)
        return k % 2 == 1


def _scalar_discrete_laplace(source: RandomSource, s: int, t: int, n: int) -> Ints:
    """The same Algorithm 2 one draw at a time in Python integers: faster for a few values,
    where numpy's per-round overhead dominates (REFERENCES.md, section 1)."""
    words = Words(source)
    out: list[int] = []
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
    return _as_array(out)


def _as_array(values: list[int]) -> Ints:
    """int64 when every value fits (always, but with a probability below e^-100), else Python
    integers in an object array: a tail is never cut or wrapped around."""
    if all(-_INT64_SAFE < v < _INT64_SAFE for v in values):
        return np.array(values, dtype=np.int64)
    return np.array(values, dtype=object)


_INT64_SAFE = 2**62


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
        if v.size and int(v.max()) > (_INT64_SAFE - t) // t:
            # u + t v would leave int64 (probability below e^-128 per draw): Python integers.
            y = np.array(
                [(int(a) + t * int(b)) // s for a, b in zip(u, v, strict=True)], dtype=object
            )
            out = out.astype(object)
        else:
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
    caller keeps 2 p q t^2 below 2^48 (see ``fits_exactly``), so for every
    proposal with |y| q t < 2^31 + p the acceptance runs in int64. A proposal
    beyond (probability about e^-64 each) is decided in Python integers: no
    proposal is ever rejected for its size, so the tails are exact too.
    """
    p, q = sigma2_num, sigma2_den
    t = _isqrt_floor(p, q) + 1
    denominator = 2 * p * q * t * t
    if not fits_exactly(p, q):
        raise ValueError("sigma^2 too large or too finely divided for exact int64 sampling")
    words = Words(source)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = max(64, int((n - filled) * 1.6))
        y = discrete_laplace(source, 1, t, want)
        safe = np.abs(y) < (2**31 + p) // (q * t) if y.dtype != object else np.zeros(want, bool)
        distance = np.where(safe, np.abs(np.where(safe, y, 0)) * (q * t) - p, 0).astype(np.int64)
        accept = safe & bernoulli_exp(
            source, distance**2, np.full(want, denominator, dtype=np.int64)
        )
        for i in np.flatnonzero(~safe):
            accept[i] = words.bernoulli_exp((abs(int(y[i])) * q * t - p) ** 2, denominator)
        values = y[accept][: n - filled]
        if values.dtype == object and out.dtype != object:
            out = out.astype(object)
        out[filled : filled + values.size] = values
        filled += values.size
    return out


def discrete_gaussian_large(source: RandomSource, p: int, n: int) -> Ints:
    """n draws of the discrete Gaussian with sigma^2 = p, an integer too large for the int64
    sampler (CKS20, Algorithm 3, exactly as ``discrete_gaussian``), vectorised.

    A proposal a = |y| of scale t = isqrt(p) + 1 is accepted with probability
    exp(-gamma), gamma = (a t - p)^2 / (2 p t^2), an exact rational of up to
    ~2^170. Each acceptance is CKS20's Algorithm 1 on that rational: floor(gamma)
    Bernoulli(exp(-1)) draws, then Bernoulli(f / k) for k = 1, 2, ... with f the
    fractional part, each the comparison of a uniform U with f / k. Numpy
    decides them from a binary64 enclosure [gamma - E, gamma + E] that provably
    holds (``enclosure``): the whole part when the enclosure does not straddle
    an integer, and each comparison from the first 63 bits of U when they lie
    clear of the enclosure of f / k. Whatever the enclosure cannot decide
    (probability about 2^-40 per draw), and every proposal of 2^52 or more, is
    decided exactly in Python integers, continuing from the bits already
    drawn (``Words.fraction_tail``). So every acceptance probability is exactly
    exp(-gamma): no tail is cut, however far (a binary64 uniform never falls
    below 2^-53, so comparing it with exp(-gamma) would reject every proposal
    beyond 9.6 sigma).
    """
    t = math.isqrt(p) + 1
    denominator = 2 * p * t * t
    words = Words(source)
    if n < SCALAR_BELOW:  # a few values: Python integers throughout are faster
        drawn: list[int] = []
        while len(drawn) < n:
            y = int(_scalar_discrete_laplace(source, 1, t, 1)[0])
            if words.bernoulli_exp((abs(y) * t - p) ** 2, denominator):
                drawn.append(y)
        return _as_array(drawn)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = max(64, int((n - filled) * 1.4))
        proposals = discrete_laplace(source, 1, t, want)
        values = proposals[accept_large(source, words, proposals, p)][: n - filled]
        if values.dtype == object and out.dtype != object:
            out = out.astype(object)
        out[filled : filled + values.size] = values
        filled += values.size
    return out


def accept_large(source: RandomSource, words: Words, y: Ints, p: int) -> Bools:
    """For each proposal y, Bernoulli(exp(-gamma)) with gamma = (|y| t - p)^2 / (2 p t^2),
    t = isqrt(p) + 1, exactly (see ``discrete_gaussian_large``)."""
    t = math.isqrt(p) + 1
    denominator = 2 * p * t * t
    small = (np.abs(y) < 2**52) if y.dtype != object else np.zeros(y.size, dtype=bool)
    a = np.where(small, np.abs(np.where(small, y, 0)), 0).astype(np.int64)
    low, high = enclosure(a, p, t)
    whole = np.floor(low)
    fast = small & (whole == np.floor(high))
    accept = np.zeros(y.size, dtype=bool)
    index = np.flatnonzero(fast)
    alive = bernoulli_exp(
        source, whole[index].astype(np.int64), np.ones(index.size, dtype=np.int64)
    )
    index = index[alive]
    fraction_low = np.floor((low[index] - whole[index]) * 2.0**63).astype(np.int64)
    fraction_high = np.ceil((high[index] - whole[index]) * 2.0**63).astype(np.int64)

    def exactly(j: int, k: int, word: int) -> bool:
        r = (int(a[index[j]]) * t - p) ** 2 % denominator
        return words.fraction_tail(r, denominator, k, word)

    accept[index] = fraction_rounds(source, fraction_low, fraction_high, exactly)
    for i in np.flatnonzero(~fast):
        accept[i] = words.bernoulli_exp((abs(int(y[i])) * t - p) ** 2, denominator)
    return accept


def enclosure(a: Ints, p: int, t: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Binary64 bounds low <= gamma <= high of gamma = (a - p/t)^2 / (2p), for 0 <= a < 2^52.

    Each IEEE operation is correctly rounded, with relative error at most
    u = 2^-53. With m = p/t: float(p), float(t) and their quotient carry at
    most 3u, so |m~ - m| <= 4u m; a is exact; d~ = a - m~ is within
    e_d = 4u m + u |d~| + u^2 of d = a - m, and e_d below is 8 times that.
    Then |d~^2 - d^2| <= e_d (2 |d~| + e_d), and dividing by float(2p) and
    squaring add at most 4u gamma~ more; E below exceeds the sum by a factor
    of 8 and adds 2^-60, so rounding in E's own evaluation cannot matter.
    ``low`` is clipped at 0 (gamma >= 0).
    """
    u = 2.0**-53
    m = float(p) / float(t)
    d = a.astype(np.float64) - m
    e_d = 8 * (4 * u * m + u * np.abs(d)) + 2.0**-100
    gamma = d * d / (2 * float(p))
    error = 8 * (e_d * (2 * np.abs(d) + e_d) / (2 * float(p)) + 4 * u * gamma) + 2.0**-60
    return np.maximum(gamma - error, 0.0), gamma + error


def fraction_rounds(
    source: RandomSource, low: Ints, high: Ints, exactly: Callable[[int, int, int], bool]
) -> Bools:
    """Bernoulli(exp(-f)) for f known to lie in [low, high] / 2^63 (Algorithm 1, first case):
    round k compares U_k, whose first 63 bits are a fresh word w, with f / k. It succeeds
    surely when (w + 1) k <= low, fails surely when w k >= high, and otherwise is finished
    by ``exactly(j, k, w)``."""
    result = np.zeros(low.size, dtype=bool)
    pending = np.arange(low.size)
    k = 1
    while pending.size:
        w = (source.uint64(pending.size) >> np.uint64(1)).astype(np.int64)
        succeeded = w < low[pending] // k
        failed = w >= -((-high[pending]) // k)
        result[pending[failed]] = k % 2 == 1
        for j in np.flatnonzero(~(succeeded | failed)):
            result[pending[j]] = exactly(int(pending[j]), k, int(w[j]))
        pending = pending[succeeded]
        k += 1
    return result


def fits_exactly(p: int, q: int) -> bool:
    """Whether ``discrete_gaussian`` can sample sigma^2 = p/q exactly in int64."""
    t = _isqrt_floor(p, q) + 1
    return 2 * p * q * t * t < 2**48 and q * t < 2**20


def _isqrt_floor(p: int, q: int) -> int:
    """floor(sqrt(p / q)) exactly."""
    root = math.isqrt(p // q)
    while (root + 1) * (root + 1) * q <= p:
        root += 1
    return root
