"""Exact samplers on integers, vectorised with numpy, from uniformly random 64-bit words.

Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy"
(NeurIPS 2020; arXiv 2004.00010), give samplers that use only integer
arithmetic and fair random bits, so they are exact: no floating-point value
ever decides an outcome. This module samples their laws:

- Bernoulli(exp(-gamma)) for rational gamma >= 0 (their Algorithm 1),
- the discrete Laplace, P(y) proportional to exp(-|y| s / t) (Algorithm 2),
- the discrete Gaussian, P(y) proportional to exp(-y^2 / (2 sigma^2))
  (Algorithm 3: discrete Laplace proposals, accepted with probability
  exp(-gamma)),

as masked loops over numpy arrays, processed in batches of ``BATCH`` so that
every array stays in cache (fewer than ``SCALAR_BELOW`` draws run CKS20's
algorithms as stated, in Python integers). Binary64 enters only through the
proven enclosure of ``discrete_gaussian_large``. The pieces below are exact
for these reasons.

Uniform reals, revealed lazily. A uniform real in [0, 1) is a sequence of
independent fair bits. A random 64-bit word supplies 64 of them and a 16-bit
piece of a word (a *chunk*) 16. A comparison is decided from a prefix only
when every continuation of the prefix gives the same answer ("surely"), in
integer arithmetic; otherwise more bits are revealed (``_Lazy``, in Python
integers, 63 fresh bits at a time) until it is. Bits not yet revealed are
independent of everything decided so far, so every comparison has exactly the
probability it has for real uniforms. Undecided prefixes are rare (about
2^-16 per comparison of chunks); events of probability 0 (two uniforms
equal, a uniform equal to an irrational) are never decided, and the loops
that reveal bits end with probability 1. Bits that were drawn but never looked
at may be dropped: the tests compare only the first ``CHUNK_BITS`` of each
chunk, leaving many comparisons to the Python paths, and the laws stay exact.

Von Neumann's exponential (1951; Forsythe 1972; Karney, "Sampling exactly
from the normal distribution", 2016, Algorithm V). For uniforms x, U2, U3,
..., let n be the length of the descending run x > U2 > ... > U_n (U_{n+1}
is the first not below U_n). Given x, P(n >= j) = x^(j-1)/(j-1)!, so
P(n odd) = sum_j (-1)^(j-1) x^(j-1)/(j-1)! = exp(-x) (``_run_odd``). A
*trial* draws x and its run and is accepted when n is odd; repeating trials,
the accepted x has density exp(-x)/(1 - e^-1) on [0, 1), and the number V of
rejected trials before it has P(V >= v) = e^-v, independent of x. So E = V + x
is exponential with mean 1 (for an integer v and y in [0, 1),
P(E >= v + y) = e^-(v+1) + e^-v (e^-y - e^-1) = e^-(v+y)), and for an
integer t >= 1, X = floor(t E) = t V + floor(t x) has P(X >= j) = exp(-j/t):
exactly the geometric law of CKS20's U + t V in Algorithm 2 (``_Geometric``).
Then Y = floor(X / s) has P(Y >= y) = exp(-y s / t), and a fair sign with
"-0" rejected gives the discrete Laplace of scale t/s, exactly as Algorithm 2
does. No Bernoulli(exp(-1)) is drawn for V: it is counted.

Bernoulli(exp(-gamma)), gamma = w + f with w = floor(gamma). The run
f > U1 > U2 > ... has P(length >= j) = f^j / j!, so it has even length with
probability exp(-f) (``_bernoulli_exp_fraction``): U1 meets f once, its chunk
against integers below and above f 2^16 (exact for a rational f, from the
enclosure in the large Gaussian), and the rest of the run compares uniforms
only. Bernoulli(exp(-w)) is
U < exp(-w) for one uniform U, decided on a chunk against floor(exp(-w) 2^16)
(``_EXP16``) and otherwise against exact integer bounds on exp(-w) 2^b for as
many bits b as it takes (``_exp_neg_bounds``). The two coins are independent
and their conjunction is Bernoulli(exp(-gamma)).

Streams and batches. Words come from a ``WordPool``: large blocks of the
source's words, each handed out once, in order; an i.i.d. sequence read in order
stays i.i.d. given everything read before it, however many words each step
reads. Independent proposals filtered by a test of their own (a sign with
"-0", a Gaussian acceptance) leave an i.i.d. sequence, of which the first n
are kept. Trials are consumed as a stream: a sample is a run of rejected
trials ended by an accepted one, consecutive runs of one stream are i.i.d., and
the rejected trials at the end of a batch are carried into the next (a
stream's first k complete runs, never the runs that happen to fit in a
batch, which would favour short ones).

Integer ranges. Chunks are below 2^16 and words below 2^64; t < 2^55. t h for
a chunk h is formed only when t < 2^16; the 128-bit product of a word and t
is formed from 32-bit halves, each partial product below 2^64
(``_mul_wide``); X = u + t V is formed in int64 only when V <= (2^62 - t) / t
and in Python integers beyond (probability below e^-128): a tail is never
cut. The int64 Gaussian keeps its documented bounds (``discrete_gaussian``).

Timing: the number of rounds depends on the draws, which is the channel of
Jin et al. (S&P 2022); whole vectors are drawn at once, which blurs the
time of any single value but does not remove the channel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from accountant.randomness import RandomSource

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Chunks = npt.NDArray[np.uint16]
Words64 = npt.NDArray[np.uint64]
#: lo <= v 2^bits <= hi for a value v in [0, 1], at any requested ``bits``.
Bounds = Callable[[int], tuple[int, int]]

#: Largest denominator this module accepts: products with small counters stay below 2^63.
MAX_DENOMINATOR = 2**55

#: Samples per batch of the vectorised samplers: their arrays stay in cache.
BATCH = 2**14
#: Runs still descending after this few are finished one by one in Python integers.
_FEW = 8
#: Words per ``source.uint64`` call of a ``WordPool``, at least and at most.
_MIN_BLOCK, _MAX_BLOCK = 2**9, 2**17
#: The bits of a chunk that comparisons look at. Fewer (tests only) leave more comparisons
#: to the exact Python paths; the bits of a chunk below them are never looked at.
CHUNK_BITS = 16


class WordPool:
    """Random words of one sampler call: blocks of the source's words (one ``uint64`` call
    per block, a single digest of the keyed source or system call of the operating
    system's), handed out in order as 64-bit words or 16-bit chunks, each at most once.
    Unused words at the end are dropped, never reused. A chunk is the first ``bits`` bits
    (``CHUNK_BITS``) of a 16-bit piece of a word."""

    def __init__(self, source: RandomSource, expected_words: int = 0) -> None:
        self.source = source
        self.bits = CHUNK_BITS
        self._chunks: Chunks = np.empty(0, dtype=np.uint16)
        self._at = 0
        self._block = min(max(expected_words, _MIN_BLOCK), _MAX_BLOCK)

    def pieces(self, n: int) -> Chunks:
        """The next n 16-bit pieces of words: uniform 16-bit integers."""
        end = self._at + n
        if end <= self._chunks.size:
            out = self._chunks[self._at : end]
            self._at = end
            return out
        rest = self._chunks[self._at :]
        words = max(-(-(n - rest.size) // 4), self._block)
        self._chunks = self.source.uint64(words).view(np.uint16)
        self._at = n - rest.size
        self._block = min(2 * self._block, _MAX_BLOCK)
        fresh = self._chunks[: self._at]
        return np.concatenate((rest, fresh)) if rest.size else fresh

    def chunks(self, n: int) -> Chunks:
        """n uniform integers of ``bits`` bits, the first bits of as many pieces."""
        out = self.pieces(n)
        if self.bits < 16:
            return out >> np.uint16(16 - self.bits)
        return out

    def words(self, n: int) -> Words64:
        """n uniform 64-bit words (four pieces each, from the next whole word of the block)."""
        self._at += -self._at % 4
        return self.pieces(4 * n).view(np.uint64)

    def coins(self, n: int) -> Bools:
        """n fair coins."""
        coins: Bools = np.unpackbits(self.words(-(-n // 64)).view(np.uint8))[:n].view(np.bool_)
        return coins


def uniform_below(source: RandomSource, bounds: Ints) -> Ints:
    """For each bound b >= 1, a uniform integer in [0, b), by rejection on masked draws: a
    16-bit chunk where every bound is at most 2^16, else the top 63 bits of a word."""
    bounds = np.asarray(bounds, dtype=np.int64)
    pool = WordPool(source, bounds.size)
    flat = bounds.ravel()
    out = np.empty(flat.size, dtype=np.int64)
    for start in range(0, flat.size, BATCH):
        out[start : start + BATCH] = _uniform_below(pool, flat[start : start + BATCH])
    return out.reshape(bounds.shape)


def _uniform_below(pool: WordPool, bounds: Ints) -> Ints:
    mask = bounds - 1
    for shift in (1, 2, 4, 8, 16, 32):
        mask |= mask >> shift
    small = bounds.size == 0 or int(bounds.max()) <= 2**16
    out = np.empty(bounds.size, dtype=np.int64)
    pending = np.arange(bounds.size)
    while pending.size:
        if small:
            raw = pool.pieces(pending.size).astype(np.int64)
        else:
            raw = (pool.words(pending.size) >> np.uint64(1)).astype(np.int64)
        draws = raw & mask[pending]
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
    """Bernoulli(exp(-n/d)) for any n >= 0 and 1 <= d < 2^62: Bernoulli(exp(-floor(n/d)))
    and Bernoulli(exp(-f)) for the fraction f = (n mod d)/d, both as in the module's
    docstring (``_bernoulli_exp_rational``)."""
    numerators = np.asarray(numerators, dtype=np.int64)
    denominator = np.broadcast_to(np.asarray(denominator, dtype=np.int64), numerators.shape)
    pool = WordPool(source, numerators.size // 2)
    words = PoolWords(pool)
    whole, fraction = np.divmod(numerators.ravel(), denominator.ravel())
    denominators = denominator.ravel()
    result = np.empty(whole.size, dtype=bool)
    for start in range(0, whole.size, BATCH):
        part = slice(start, start + BATCH)
        result[part] = _bernoulli_exp_rational(
            pool, words, whole[part], fraction[part], denominators[part]
        )
    return result.reshape(numerators.shape)


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


class PoolWords(Words):
    """``Words`` drawn from a ``WordPool``: the exact Python-integer paths of a sampler call
    read the same stream as its vectorised rounds."""

    def __init__(self, pool: WordPool) -> None:
        super().__init__(pool.source)
        self._pool = pool

    def next(self) -> int:
        if not self._block:
            self._block = (self._pool.words(64) >> np.uint64(1)).tolist()
        return self._block.pop()


class _Lazy:
    """A uniform real in [0, 1) known by its first ``n`` bits, ``bits``; ``reveal`` appends
    63 fresh ones."""

    __slots__ = ("bits", "n")

    def __init__(self, bits: int, n: int) -> None:
        self.bits = bits
        self.n = n

    def reveal(self, words: Words) -> None:
        self.bits = (self.bits << 63) | words.next()
        self.n += 63


def _less(a: _Lazy, b: _Lazy, words: Words) -> bool:
    """Whether a < b, revealing bits of the one known less far until their prefixes differ."""
    while True:
        n = min(a.n, b.n)
        prefix_a, prefix_b = a.bits >> (a.n - n), b.bits >> (b.n - n)
        if prefix_a != prefix_b:
            return prefix_a < prefix_b
        if a.n <= b.n:
            a.reveal(words)
        else:
            b.reveal(words)


def _less_than_value(x: _Lazy, bounds: Bounds, words: Words) -> bool:
    """Whether x < v for a value v known by ``bounds``: x lies in [bits, bits + 1) 2^-n, so
    x < v surely when (bits + 1) 2^-n <= lo 2^-b and x >= v surely when bits 2^-n >= hi 2^-b
    (b = n + 64); otherwise x is revealed further."""
    while True:
        lo, hi = bounds(x.n + 64)
        if (x.bits + 1) << 64 <= lo:
            return True
        if x.bits << 64 >= hi:
            return False
        x.reveal(words)


def _rational(numerator: int, denominator: int) -> Bounds:
    """Exact bounds on numerator / denominator."""

    def bounds(bits: int) -> tuple[int, int]:
        low, remainder = divmod(numerator << bits, denominator)
        return low, low + (remainder != 0)

    return bounds


@lru_cache(maxsize=1024)
def _exp_neg_bounds(w: int, bits: int) -> tuple[int, int]:
    """Integers lo <= exp(-w) 2^bits <= hi (w >= 0), with hi - lo at most a few units.

    With q working bits, e 2^q lies in [S, S + k + 2], S the sum of floor(2^q / j!) over the
    k terms that are not 0 (each floor loses less than 1, the omitted tail is below 2).
    Powers by repeated squaring, rounding each product down for the lower bound and up for
    the upper one, bound e^w 2^q; then exp(-w) 2^bits = 2^(bits + q) / (e^w 2^q), rounded
    down from the upper bound and up from the lower one. q exceeds ``bits`` by enough guard
    bits that the relative error, about (k + 2) w 2^-q, is far below 2^-bits. For w >= bits,
    exp(-w) 2^bits < 2^bits e^-bits < 1: the bounds are 0 and 1, at no cost however large w."""
    if w == 0:
        return 1 << bits, 1 << bits
    if w >= bits:
        return 0, 1
    q = bits + 2 * w.bit_length() + 24
    term, total, k = 1 << q, 0, 0
    while term:
        total += term
        k += 1
        term //= k
    base_lo, base_hi = total, total + k + 2
    lo = hi = 1 << q
    power = w
    while power:
        if power & 1:
            lo, hi = (lo * base_lo) >> q, -((-hi * base_hi) >> q)
        power >>= 1
        if power:
            base_lo, base_hi = (base_lo * base_lo) >> q, -((-base_hi * base_hi) >> q)
    scaled = 1 << (bits + q)
    return scaled // hi, -(-scaled // lo)


def _exp16_table() -> Ints:
    """floor(exp(-w) 2^16) for w = 0, ..., 12, from bounds that agree on it (0 from 12 on)."""
    table = []
    for w in range(13):
        lo, hi = _exp_neg_bounds(w, 16 + 40)
        if lo >> 40 != hi >> 40:  # never: the bounds are 40 bits tighter than needed
            raise ArithmeticError(f"exp(-{w}) is not resolved")
        table.append(lo >> 40)
    return np.array(table, dtype=np.int32)


#: floor(exp(-w) 2^16) for w = 0..12; exp(-w) 2^16 < 1 for every w >= 12.
_EXP16 = _exp16_table()


def _exp_neg(w: int) -> Bounds:
    """Exact bounds on exp(-w)."""

    def bounds(bits: int) -> tuple[int, int]:
        return _exp_neg_bounds(w, bits)

    return bounds


def _finish_run(words: Words, last: _Lazy, new: _Lazy, n: int) -> bool:
    """A descending run of length n ending at ``last``, whose next uniform is ``new``, finished
    exactly: whether its final length is odd."""
    while _less(new, last, words):
        n += 1
        last, new = new, _Lazy(0, 0)
    return n % 2 == 1


def _finish_fraction(words: Words, first: _Lazy, fraction: Bounds) -> bool:
    """Bernoulli(exp(-f)) exactly, f known by ``fraction``, from its first uniform ``first``:
    the run f > first > U2 > ... has even length."""
    if not _less_than_value(first, fraction, words):
        return True
    return not _finish_run(words, first, _Lazy(0, 0), 1)


def _floor_times(x: _Lazy, t: int, words: Words) -> int:
    """floor(t x) exactly: x's bits are revealed until [t bits, t (bits + 1)) 2^-n holds no
    integer but at its left end."""
    while True:
        low = (t * x.bits) >> x.n
        if low == (t * (x.bits + 1) - 1) >> x.n:
            return low
        x.reveal(words)


def _run_odd(pool: WordPool, words: Words, first: Chunks) -> tuple[Bools, dict[int, _Lazy]]:
    """For uniforms x_i whose first chunks are ``first[i]``: whether the descending run
    x_i > U2 > U3 > ... has odd length (von Neumann's trial; see the module's docstring).

    U2 and U3 come as chunks c1, c2 for every i. c1 < first means U2 < x surely, c1 > first
    that U2 > x surely, and likewise for c2 against c1; a run still descending after U3
    continues in ``_run_tail_odd``. Where the chunk that ends the run equals the one before
    it, both are revealed further (``_finish_run``); the returned dict holds x_i, revealed
    further, for the i whose x needed more bits."""
    c1, c2 = pool.chunks(first.size), pool.chunks(first.size)
    b = pool.bits
    down1 = c1 < first
    down2 = down1 & (c2 < c1)
    odd: Bools = down1 == down2  # run length 1 + down1 + down2 (while not longer)
    firsts: dict[int, _Lazy] = {}
    for i in np.flatnonzero((c1 == first) | (down1 & (c2 == c1))).tolist():
        if c1[i] == first[i]:  # U2 against x itself: x is revealed further
            firsts[i] = _Lazy(int(first[i]), b)
            odd[i] = _finish_run(words, firsts[i], _Lazy(int(c1[i]), b), 1)
        else:
            odd[i] = _finish_run(words, _Lazy(int(c1[i]), b), _Lazy(int(c2[i]), b), 2)
    longer = np.flatnonzero(down2)
    if longer.size:
        odd[longer] = _run_tail_odd(pool, words, c2[longer], 3)
    return odd, firsts


def _run_tail_odd(pool: WordPool, words: Words, last: Chunks, n: int) -> Bools:
    """Descending runs of length n whose last uniforms are known by their first chunks,
    ``last``, and no further: whether each final length is odd. One chunk per round and run,
    and the last ``_FEW`` runs one at a time in Python integers."""
    odd = np.full(last.size, n % 2 == 1)
    pending = np.arange(last.size)
    while pending.size:
        if pending.size <= _FEW:  # fewer numpy rounds: the last runs one by one
            for j, i in enumerate(pending.tolist()):
                odd[i] = _finish_run(words, _Lazy(int(last[j]), pool.bits), _Lazy(0, 0), n)
            break
        c = pool.chunks(pending.size)
        for j in np.flatnonzero(c == last).tolist():
            tied = _Lazy(int(last[j]), pool.bits), _Lazy(int(c[j]), pool.bits)
            odd[pending[j]] = _finish_run(words, *tied, n)
        down = c < last
        pending, last = pending[down], c[down]
        n += 1
        odd[pending] = n % 2 == 1
    return odd


def _bernoulli_exp_whole(pool: WordPool, words: Words, whole: Ints) -> Bools:
    """Bernoulli(exp(-w)) for integers w >= 0: U < exp(-w) for a uniform U. Its first chunk h
    (b bits) decides surely unless h = floor(exp(-w) 2^b) = floor(``_EXP16[w]`` / 2^(16-b))
    (exp(-w) 2^b is irrational for w >= 1, and below 1 for w >= 12); then U is revealed
    further against ``_exp_neg_bounds``."""
    result = np.ones(whole.size, dtype=bool)
    index = np.flatnonzero(whole > 0)
    if index.size:
        h = pool.chunks(index.size)
        threshold = _EXP16[np.minimum(whole[index], 12)] >> (16 - pool.bits)
        result[index] = h < threshold
        for j in np.flatnonzero(h == threshold).tolist():
            exp_neg = _exp_neg(int(whole[index[j]]))
            result[index[j]] = _less_than_value(_Lazy(int(h[j]), pool.bits), exp_neg, words)
    return result


def _bernoulli_exp_fraction(
    pool: WordPool, words: Words, below: Ints, above: Ints, exact: Callable[[int], Bounds]
) -> Bools:
    """Bernoulli(exp(-f_i)) for f_i in [0, 1), given integers below[i] <= f_i 2^16 <= above[i]:
    the run f > U1 > U2 > ... has even length.

    U1 lies in [h, h + 1) 2^-16 for its first chunk h, so h < below[i] means U1 < f surely
    and h >= above[i] means U1 >= f surely; in between, U1 is compared exactly with
    ``exact(i)``, bounds on f_i, and that coin is finished in Python integers
    (``_finish_fraction``). Chunks of b < 16 bits compare with floor(below / 2^(16-b)) and
    ceil(above / 2^(16-b)) alike."""
    h = pool.chunks(below.size)
    if pool.bits < 16:  # floor(floor(f 2^16) / 2^k) = floor(f 2^(16-k)), and so for ceilings
        below, above = below >> (16 - pool.bits), -(-above >> (16 - pool.bits))
    less = h < below
    result = ~less  # U1 >= f: a run of length 0
    index = np.flatnonzero(less)
    if index.size:
        odd, _ = _run_odd(pool, words, h[index])
        result[index] = ~odd
    for i in np.flatnonzero(~less & (h < above)).tolist():
        result[i] = _finish_fraction(words, _Lazy(int(h[i]), pool.bits), exact(i))
    return result


def _sixteen_bits(numerators: Ints, denominators: Ints | int) -> tuple[Ints, Ints]:
    """(floor(r 2^16 / d), ceil(r 2^16 / d)) for 0 <= r < d < 2^62, by long division in
    uint64: each step shifts a remainder below d by at most 64 - bitlength(d) bits (one step
    for d < 2^48)."""
    step = 64 - int(np.max(denominators)).bit_length()
    divisor = np.asarray(denominators).astype(np.uint64)
    quotient = np.zeros(numerators.shape, dtype=np.uint64)
    remainder = numerators.astype(np.uint64)
    done = 0
    while done < 16:
        shift = np.uint64(min(step, 16 - done))
        digits, remainder = np.divmod(remainder << shift, divisor)
        quotient = (quotient << shift) | digits
        done += int(shift)
    below = quotient.astype(np.int64)
    return below, below + (remainder != 0)


def _bernoulli_exp_rational(
    pool: WordPool, words: Words, whole: Ints, fraction: Ints, denominator: Ints | int
) -> Bools:
    """Bernoulli(exp(-(w + r/d))) for integers w >= 0 and 0 <= r < d < 2^62: the conjunction
    of Bernoulli(exp(-w)) and Bernoulli(exp(-r/d)), the second drawn only where the first
    succeeded and r > 0 (independent coins: their conjunction does not depend on the order)."""
    result = _bernoulli_exp_whole(pool, words, whole)
    index = np.flatnonzero(result & (fraction > 0))
    if index.size:
        d = denominator if isinstance(denominator, int) else denominator[index]
        r = fraction[index]
        below, above = _sixteen_bits(r, d)

        def exact(j: int) -> Bounds:
            return _rational(int(r[j]), d if isinstance(d, int) else int(d[j]))

        result[index] = _bernoulli_exp_fraction(pool, words, below, above, exact)
    return result


_LOW32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def _mul_wide(words: Words64, t: int) -> tuple[Words64, Words64]:
    """For the 128-bit products t w (0 <= t < 2^64): their high 64 bits, and bits 32 to 63
    of their low half. From 32-bit halves: each partial product is below 2^64 and the middle
    sum below 3 2^32."""
    t_low, t_high = np.uint64(t & 0xFFFFFFFF), np.uint64(t >> 32)
    w_low, w_high = words & _LOW32, words >> _32
    high_low = w_high * t_low
    middle = ((w_low * t_low) >> _32) + (high_low & _LOW32)
    high = high_low >> _32
    if t_high:
        low_high = w_low * t_high
        middle += low_high & _LOW32
        high += w_high * t_high + (low_high >> _32)
    high += middle >> _32
    return high, middle & _LOW32


class _Geometric:
    """Draws of X with P(X >= x) = exp(-x/t), integer t in [1, 2^55): X = t V + floor(t x) from
    von Neumann's trials (see the module's docstring).

    Each trial's x starts as one chunk h of b bits (``CHUNK_BITS``), compared in
    ``_run_odd``. For an accepted trial whose x was not revealed further there, the bits
    after h are fresh, so x = (h + rest) 2^-b with rest uniform in [0, 1). floor(t x) is
    floor(t h 2^-b) when t < 2^b and no integer lies inside [t h, t (h + 1)) 2^-b.
    Otherwise 64 more bits r are drawn: x = (h 2^64 + r + rest') 2^-(64+b), and with
    t r = H 2^64 + L, t x 2^(64+b) = (t h + H) 2^64 + L + t rest', so floor(t x) =
    floor((t h + H) / 2^b) whenever L + t <= 2^64; where not, x is revealed exactly
    (``_floor_times``)."""

    #: Trials drawn per run still wanted (a run takes 1 / (1 - e^-1) = 1.582 on average).
    TRIALS_PER_RUN = 1.59

    def __init__(self, pool: WordPool, words: Words, t: int) -> None:
        if not 1 <= t < MAX_DENOMINATOR:
            raise ValueError(f"geometric scale out of range: t={t}")
        self.pool, self.words, self.t = pool, words, t
        self._limit = (_INT64_SAFE - t) // t  # u + t V < 2^62 for V up to this

    def draw(self, k: int) -> Ints:
        """The first k complete runs of a fresh stream of trials, as X."""
        out = _Output(k)
        carry = 0
        while out.filled < k:
            m = int((k - out.filled) * self.TRIALS_PER_RUN) + 16
            h = self.pool.chunks(m)
            odd, firsts = _run_odd(self.pool, self.words, h)
            accepted = np.flatnonzero(odd)[: k - out.filled]
            if not accepted.size:
                carry += m
                continue
            v = np.empty(accepted.size, dtype=np.int64)  # rejected trials before each
            v[0] = accepted[0] + carry
            np.subtract(accepted[1:], accepted[:-1], out=v[1:])
            v[1:] -= 1
            carry = m - 1 - int(accepted[-1])  # only used when all accepted trials were kept
            u = self._floor_times(h, accepted, firsts)
            if int(v.max()) <= self._limit:
                v *= self.t
                v += u
                out.add(v)
            else:  # t V would leave int64 (probability below e^-128): Python integers
                values = [a + self.t * b for a, b in zip(u.tolist(), v.tolist(), strict=True)]
                out.add(np.array(values, dtype=object))
        return out.values

    def _floor_times(self, h: Chunks, accepted: Ints, firsts: dict[int, _Lazy]) -> Ints:
        """floor(t x) for the accepted trials."""
        t, bits = self.t, self.pool.bits
        top = h[accepted].astype(np.uint64)
        if t < 1 << bits:
            product = top * np.uint64(t)
            u = product >> np.uint64(bits)
            unsure = np.flatnonzero(u != (product + np.uint64(t - 1)) >> np.uint64(bits))
            if unsure.size:
                u[unsure] = self._with_more_bits(top[unsure])
        else:  # an interval of length t >= 2^bits: the first chunk alone rarely decides
            u = self._with_more_bits(top)
        out = u.astype(np.int64)
        for i, x in firsts.items():  # x was revealed beyond its chunk: continue from there
            position = int(np.searchsorted(accepted, i))
            if position < accepted.size and accepted[position] == i:
                out[position] = _floor_times(x, t, self.words)
        return out

    def _with_more_bits(self, top: Words64) -> Words64:
        """floor(t x) for x whose first chunks are ``top``, from 64 more bits r of each:
        floor((t top + H) / 2^bits) with H the high half of t r, unless bits 32 to 63 of its
        low half L are at least those of 2^64 - t (a superset of L > 2^64 - t), where x is
        revealed exactly. t top + H is formed as (t >> bits) top + (((t mod 2^bits) top + H)
        >> bits): terms below 2^55 and 2^56."""
        t, bits = self.t, self.pool.bits
        rest = self.pool.words(top.size)
        high, low_top = _mul_wide(rest, t)
        t_high, t_low = np.uint64(t >> bits), np.uint64(t & ((1 << bits) - 1))
        u = t_high * top + ((t_low * top + high) >> np.uint64(bits))
        for j in np.flatnonzero(low_top >= np.uint64((2**64 - t) >> 32)).tolist():
            x = _Lazy((int(top[j]) << 64) | int(rest[j]), 64 + bits)
            u[j] = _floor_times(x, t, self.words)
        return u


class _Output:
    """n values filled in order: int64, or Python integers once any part holds them."""

    def __init__(self, n: int) -> None:
        self.values: Ints = np.empty(n, dtype=np.int64)
        self.filled = 0

    def add(self, values: Ints) -> None:
        values = values[: self.values.size - self.filled]
        if values.dtype == object and self.values.dtype != object:
            self.values = self.values.astype(object)
        self.values[self.filled : self.filled + values.size] = values
        self.filled += values.size


def _laplace(pool: WordPool, words: Words, s: int, t: int, n: int) -> Ints:
    """n draws of the discrete Laplace of scale t/s: Y = floor(X / s) with a fair sign,
    "-0" rejected (CKS20, Algorithm 2, with X from ``_Geometric``)."""
    geometric = _Geometric(pool, words, t)
    kept = 1 - (1 - math.exp(-s / t)) / 2  # the share a sign keeps, for batch sizes only
    out = _Output(n)
    while out.filled < n:
        y = geometric.draw(min(BATCH, int((n - out.filled) / kept * 1.02) + 8))
        if s > 1:
            y //= s
        negative = pool.coins(y.size)
        zero = negative & (y == 0)
        np.negative(y, out=y, where=negative)
        out.add(y[~zero] if zero.any() else y)
    return out.values


def _scalar_discrete_laplace(source: RandomSource, s: int, t: int, n: int) -> Ints:
    """CKS20's Algorithm 2 one draw at a time in Python integers: faster for a few values,
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


#: Below this many draws the scalar samplers are faster than the vectorised ones.
SCALAR_BELOW = 32
LARGE_SCALAR_BELOW = 12


def discrete_laplace(source: RandomSource, s: int, t: int, n: int) -> Ints:
    """n draws with P(y) proportional to exp(-|y| s / t): scale t / s (CKS20's Algorithm 2
    law; von Neumann's trials for its geometric part, see the module's docstring)."""
    if not (1 <= s < MAX_DENOMINATOR and 1 <= t < MAX_DENOMINATOR):
        raise ValueError(f"discrete Laplace parameters out of range: s={s}, t={t}")
    if n < SCALAR_BELOW:
        return _scalar_discrete_laplace(source, s, t, n)
    pool = WordPool(source, 3 * n)
    return _laplace(pool, PoolWords(pool), s, t, n)


def discrete_gaussian(source: RandomSource, sigma2_num: int, sigma2_den: int, n: int) -> Ints:
    """n draws with P(y) proportional to exp(-y^2 / (2 sigma^2)), sigma^2 = num / den
    (CKS20, Algorithm 3): a discrete Laplace proposal of scale t = floor(sigma) + 1,
    accepted with probability exp(-(|y| - sigma^2 / t)^2 / (2 sigma^2)).

    With sigma^2 = p/q the exponent is (|y| q t - p)^2 / (2 p q t^2); the
    caller keeps 2 p q t^2 below 2^48 (see ``fits_exactly``), so for every
    proposal with |y| q t < 2^31 + p the acceptance runs in int64
    ((|y| q t - p)^2 < 2^62, as p^2 < 2 p q t^2 < 2^48) and uint64
    (``_sixteen_bits`` shifts remainders below 2^48 by 16 bits), as
    ``_bernoulli_exp_rational``. A proposal beyond (probability about e^-64
    each) is decided in Python integers: no proposal is ever rejected for its
    size, so the tails are exact too.
    """
    p, q = sigma2_num, sigma2_den
    t = _isqrt_floor(p, q) + 1
    denominator = 2 * p * q * t * t
    if not fits_exactly(p, q):
        raise ValueError("sigma^2 too large or too finely divided for exact int64 sampling")
    pool = WordPool(source, 4 * n)
    words = PoolWords(pool)
    limit = (2**31 + p) // (q * t)
    out = _Output(n)
    while out.filled < n:
        want = min(BATCH, int((n - out.filled) * 1.45) + 16)
        y = _laplace(pool, words, 1, t, want)
        if y.dtype != object and int(np.abs(y).max()) < limit:  # every proposal is safe
            distance = np.abs(y) * (q * t) - p
            whole, fraction = np.divmod(distance * distance, denominator)
            accept = _bernoulli_exp_rational(pool, words, whole, fraction, denominator)
        else:
            safe = np.abs(y) < limit if y.dtype != object else np.zeros(want, bool)
            distance = np.where(safe, np.abs(np.where(safe, y, 0)) * (q * t) - p, 0)
            whole, fraction = np.divmod(distance.astype(np.int64) ** 2, denominator)
            accept = safe & _bernoulli_exp_rational(pool, words, whole, fraction, denominator)
            for i in np.flatnonzero(~safe).tolist():
                accept[i] = words.bernoulli_exp((abs(int(y[i])) * q * t - p) ** 2, denominator)
        out.add(y[accept])
    return out.values


def discrete_gaussian_large(source: RandomSource, p: int, n: int) -> Ints:
    """n draws of the discrete Gaussian with sigma^2 = p, an integer too large for the int64
    sampler (CKS20, Algorithm 3, exactly as ``discrete_gaussian``), vectorised.

    A proposal a = |y| of scale t = isqrt(p) + 1 is accepted with probability
    exp(-gamma), gamma = (a t - p)^2 / (2 p t^2), an exact rational of up to
    ~2^170 (``accept_large``). Numpy decides it from a binary64 enclosure
    [gamma - E, gamma + E] that provably holds (``enclosure``): where the
    enclosure does not straddle an integer, floor(gamma) is known exactly and
    Bernoulli(exp(-floor(gamma))) is drawn as in the module's docstring; the
    fraction f = gamma - floor(gamma) lies in the enclosure shifted by it, and
    the run f > U1 > U2 > ... is decided on U1's first chunk wherever that chunk
    lies clear of f's enclosure scaled by 2^16. Whatever the enclosure cannot
    decide (probability about 2^-16 per draw), and every proposal of 2^52 or
    more, is decided exactly in Python integers, continuing from the bits
    already drawn (``_finish_fraction``, ``Words.bernoulli_exp``). So every
    acceptance probability is exactly exp(-gamma): no tail is cut, however far
    (a binary64 uniform never falls below 2^-53, so comparing it with
    exp(-gamma) would reject every proposal beyond 9.6 sigma).
    """
    t = math.isqrt(p) + 1
    denominator = 2 * p * t * t
    words = Words(source)
    if n < LARGE_SCALAR_BELOW:  # a few values: Python integers throughout are faster
        drawn: list[int] = []
        while len(drawn) < n:
            y = int(_scalar_discrete_laplace(source, 1, t, 1)[0])
            if words.bernoulli_exp((abs(y) * t - p) ** 2, denominator):
                drawn.append(y)
        return _as_array(drawn)
    pool = WordPool(source, 4 * n)
    pool_words = PoolWords(pool)
    out = _Output(n)
    while out.filled < n:
        want = min(BATCH, int((n - out.filled) * 1.4) + 16)
        proposals = _laplace(pool, pool_words, 1, t, want)
        out.add(proposals[_accept_large(pool, pool_words, proposals, p)])
    return out.values


def accept_large(source: RandomSource, words: Words, y: Ints, p: int) -> Bools:
    """For each proposal y, Bernoulli(exp(-gamma)) with gamma = (|y| t - p)^2 / (2 p t^2),
    t = isqrt(p) + 1, exactly (see ``discrete_gaussian_large``); ``words`` finishes what
    the enclosure cannot decide."""
    return _accept_large(WordPool(source, y.size), words, y, p)


def _accept_large(pool: WordPool, words: Words, y: Ints, p: int) -> Bools:
    t = math.isqrt(p) + 1
    denominator = 2 * p * t * t
    if y.dtype == object:
        small, a = np.zeros(y.size, dtype=bool), np.zeros(y.size, dtype=np.int64)
    else:
        a = np.abs(y)
        small = a < 2**52
        if not small.all():
            a = np.where(small, a, 0)
    low, high = enclosure(a, p, t)
    whole = np.floor(low)
    # floor(gamma) = whole exactly where the enclosure holds one integer part (below 2^62)
    fast = small & (whole == np.floor(high)) & (high < 2.0**62)
    accept = np.zeros(y.size, dtype=bool)
    index = np.flatnonzero(fast)
    index = index[_bernoulli_exp_whole(pool, words, whole[index].astype(np.int64))]
    # gamma - floor(gamma) lies in [low - whole, high - whole], both exact differences
    below = np.floor((low[index] - whole[index]) * 2.0**16).astype(np.int64)
    above = np.ceil((high[index] - whole[index]) * 2.0**16).astype(np.int64)

    def exact(j: int) -> Bounds:
        return _rational((int(a[index[j]]) * t - p) ** 2 % denominator, denominator)

    accept[index] = _bernoulli_exp_fraction(pool, words, below, above, exact)
    for i in np.flatnonzero(~fast).tolist():
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
    by ``exactly(j, k, w)``. The samplers draw this coin as von Neumann's run instead
    (``_bernoulli_exp_fraction``: one comparison with f, then chunks of uniforms)."""
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
