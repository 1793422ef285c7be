"""Exact selection with P(i) proportional to exp(-N_i / 2^k), for integers N_i >= 0 and one
of them 0, from the 64-bit words of a RandomSource, in Python integers.

Write N_i = 2^k w_i + f_i with 0 <= f_i < 2^k: w_i = floor(gamma_i) is candidate i's level
and f_i / 2^k its fraction. Let B_g be the candidates at level g (by increasing index),
c_g = |B_g| and C = max c_g. One round:

1. G = the number of successes of Bernoulli(e^-1) trials before the first failure, so
   P(G = g) = e^-g (1 - e^-1); the count stops (the round is rejected) as soon as it passes
   the highest occupied level, since no candidate is found there;
2. the round is rejected when level G is empty; otherwise j uniform in [0, C), rejected
   when j >= c_G; otherwise i is the j-th candidate of B_G (conditioned on j < c_G, j is
   uniform in [0, c_G), so each member of B_G with probability 1/C);
3. i is returned with probability exp(-f_i / 2^k), else the round is rejected.

A round returns i with probability e^-w_i (1 - e^-1) (1/C) e^-(f_i/2^k) = e^-gamma_i (1 -
e^-1) / C, a constant times e^-gamma_i, and rounds are independent, so the output is i with
probability exactly e^-gamma_i / sum_j e^-gamma_j. A round succeeds with probability
(1 - e^-1) sum_j e^-gamma_j / C >= (1 - e^-1) / C, at least (1 - e^-1) times the rate of a
uniform proposal over all n >= C candidates: one or two rounds when the levels are evenly
filled, whatever n.

The Bernoulli trials are exact (no float decides anything):

- Bernoulli(e^-x), 0 <= x <= 1, is Algorithm 1 of Canonne, Kamath and Steinke (2020): draw
  A_j ~ Bernoulli(x / j) for j = 1, 2, ... until one is 0; the answer is 1 when that is at
  an odd j. (For x = 1, A_1 = 1 surely and is not drawn.)
- Bernoulli(a / b) compares U = (w + U') / 2^64 with a / b, w a fresh word and U' uniform
  in [0, 1) and independent: U < a / b iff U' b < z = a 2^64 - w b, which holds surely when
  z >= b, fails surely when z <= 0, and otherwise is Bernoulli(z / b) on U' alone, decided
  the same way from the next word (with probability at most 2^-64 per word).
- A uniform integer in [0, m), m <= 2^64, is Lemire's multiply-and-reject ("Fast random
  integer generation in an interval", 2019): with x a word, x m = 2^64 h + l; keeping only
  draws with l >= 2^64 mod m leaves exactly floor(2^64 / m) words for each h in [0, m).

Timing: the number of rounds and of words depends on the draws (and on the exponents), the
channel of Jin et al. (S&P 2022) that every rejection sampler has.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from accountant.randomness import RandomSource

_WORD = 64
_SPAN = 1 << _WORD
_LOW = _SPAN - 1
#: Words asked of the source at its first call and at every later one: one selection uses
#: about ten words on average.
FIRST_BLOCK = 32
LATER_BLOCK = 64


class Bits:
    """Exact Bernoulli trials and uniform integers from the 64-bit words of a source."""

    __slots__ = ("_block", "_source", "_words")

    def __init__(self, source: RandomSource) -> None:
        self._source = source
        self._words: list[int] = []  # the words not yet used, the next one last
        self._block = FIRST_BLOCK

    def word(self) -> int:
        """The next uniform integer in [0, 2^64)."""
        if not self._words:
            self._words.extend(reversed(self._source.uint64(self._block).tolist()))
            self._block = LATER_BLOCK
        return self._words.pop()

    def bernoulli(self, a: int, b: int) -> bool:
        """Bernoulli(a / b) for integers 0 <= a <= b, b >= 1: one word, and more only with
        probability at most 2^-64 each."""
        words = self._words
        while True:
            z = (a << _WORD) - (words.pop() if words else self.word()) * b
            if z >= b:
                return True
            if z <= 0:
                return False
            a = z

    def below(self, m: int) -> int:
        """A uniform integer in [0, m), m >= 1 (none drawn when m = 1)."""
        if m == 1:
            return 0
        if m > _SPAN:
            bits = (m - 1).bit_length()
            while True:
                draw = 0
                for _ in range(-(-bits // _WORD)):
                    draw = (draw << _WORD) | self.word()
                draw >>= -bits % _WORD
                if draw < m:
                    return draw
        threshold = _SPAN % m
        words = self._words
        while True:
            product = (words.pop() if words else self.word()) * m
            if product & _LOW >= threshold:
                return product >> _WORD

    def exp_minus_one(self) -> bool:
        """Bernoulli(e^-1) (CKS20, Algorithm 1 at x = 1): Bernoulli(1 / j) for j = 2, 3, ...
        (each as ``bernoulli``) until one fails, at an odd j for a 1."""
        words = self._words
        j, a = 2, 1
        while True:
            z = (a << _WORD) - (words.pop() if words else self.word()) * j
            if z >= j:  # A_j = 1
                j, a = j + 1, 1
            elif z <= 0:  # A_j = 0
                return j % 2 == 1
            else:  # on the boundary: A_j ~ Bernoulli(z / j) on the next word
                a = z

    def exp_minus_fraction(self, r: int, d: int) -> bool:
        """Bernoulli(e^-(r/d)) for integers 0 <= r < d (CKS20, Algorithm 1, first case):
        Bernoulli(r / (d j)) for j = 1, 2, ... (each as ``bernoulli``) until one fails, at an
        odd j for a 1; nothing is drawn when r = 0."""
        if r == 0:
            return True
        words = self._words
        j, a, b = 1, r, d
        while True:
            z = (a << _WORD) - (words.pop() if words else self.word()) * b
            if z >= b:  # A_j = 1
                j, a, b = j + 1, r, b + d
            elif z <= 0:  # A_j = 0
                return j % 2 == 1
            else:
                a = z


Ints = npt.NDArray[np.int64]


class Levels:
    """Candidates grouped by level w_i = floor(N_i / 2^k), with their fractions f_i: ``top``
    is the highest occupied level and ``widest`` (C) the most candidates at one level."""

    __slots__ = ("_members", "denominator", "top", "widest")

    def __init__(self, top: int, widest: int, k: int) -> None:
        self.top = top
        self.widest = widest
        self.denominator = 1 << k
        self._members: dict[int, list[int]] = {}

    def count(self, g: int) -> int:
        """How many candidates level g (0 <= g <= top) holds."""
        raise NotImplementedError

    def member(self, g: int, j: int) -> int:
        """The index of the j-th candidate (by increasing index) at level g."""
        found = self._members.get(g)
        if found is None:
            found = self._members[g] = self._at(g)
        return found[j]

    def _at(self, g: int) -> list[int]:
        raise NotImplementedError

    def fraction(self, i: int) -> int:
        """f_i."""
        raise NotImplementedError


class IntegerLevels(Levels):
    """From the numerators as Python integers of any size."""

    __slots__ = ("_counts", "_floors", "_mask", "_numerators")

    def __init__(self, numerators: list[int], k: int) -> None:
        floors = [n >> k for n in numerators]
        counts: dict[int, int] = {}
        for w in floors:
            counts[w] = counts.get(w, 0) + 1
        super().__init__(max(counts), max(counts.values()), k)
        self._numerators = numerators
        self._floors = floors
        self._counts = counts
        self._mask = self.denominator - 1

    def count(self, g: int) -> int:
        return self._counts.get(g, 0)

    def _at(self, g: int) -> list[int]:
        return [i for i, w in enumerate(self._floors) if w == g]

    def fraction(self, i: int) -> int:
        return self._numerators[i] & self._mask


class ArrayLevels(Levels):
    """From the numerators as an int64 array: the same levels as ``IntegerLevels``."""

    __slots__ = ("_count", "_floors", "_mask", "_numerators")

    def __init__(self, numerators: Ints, k: int) -> None:
        floors = numerators >> k
        top = int(floors.max())
        if top <= 4 * floors.size + 1024:
            counts = np.bincount(floors)
            widest = int(counts.max())
            self._count: Callable[[int], int] = lambda g: int(counts[g])
        else:
            occupied, sizes = np.unique(floors, return_counts=True)
            widest = int(sizes.max())
            counted = dict(zip(occupied.tolist(), sizes.tolist(), strict=True))
            self._count = lambda g: counted.get(g, 0)
        super().__init__(top, widest, k)
        self._numerators = numerators
        self._floors = floors
        self._mask = self.denominator - 1

    def count(self, g: int) -> int:
        return self._count(g)

    def _at(self, g: int) -> list[int]:
        found: list[int] = np.flatnonzero(self._floors == g).tolist()
        return found

    def fraction(self, i: int) -> int:
        return int(self._numerators[i]) & self._mask


def select(levels: Levels, bits: Bits) -> int:
    """The index of one candidate, i with probability exp(-N_i / 2^k) / sum_j exp(-N_j / 2^k)
    (see the module docstring)."""
    top = levels.top
    widest = levels.widest
    denominator = levels.denominator
    while True:
        g = 0
        while g <= top and bits.exp_minus_one():
            g += 1
        if g > top:
            continue
        count = levels.count(g)
        if count == 0:
            continue
        j = bits.below(widest)
        if j >= count:
            continue
        i = levels.member(g, j)
        if bits.exp_minus_fraction(levels.fraction(i), denominator):
            return i
