"""Random bits for mechanisms: the operating system's CSPRNG, or an explicit test seed.

numpy's default generators (PCG64, MT19937) are predictable from their
outputs, so production noise draws its bits from ``os.urandom`` (REFERENCES.md,
section 1). A seeded source exists only for tests that ask for one by name.
"""

from __future__ import annotations

import hashlib
import hmac
import os

import numpy as np
import numpy.typing as npt


class RandomSource:
    """Uniform random words from the operating system's cryptographic generator."""

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        return np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()


class KeyedRandomSource(RandomSource):
    """The random words of one charge: SHAKE-256 keyed by a secret and the charge id.

    A keyed XOF is a pseudorandom generator as strong as its key (FIPS 202),
    so the words are as unpredictable as ``os.urandom`` to anyone without the
    secret. Because they are a function of (secret, charge id), a retried
    request regenerates exactly the same noise, and the database never has
    to hold noise (which, beside a published value, would reveal the true
    statistic). Each call draws the next block of the stream.
    """

    def __init__(self, secret: bytes, charge_id: str) -> None:
        self._seed = hmac.new(secret, charge_id.encode(), hashlib.sha256).digest()
        self._calls = 0

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        block = hashlib.shake_256(self._seed + self._calls.to_bytes(8, "big")).digest(8 * n)
        self._calls += 1
        return np.frombuffer(block, dtype=np.uint64).copy()


class SeededRandomSource(RandomSource):
    """A reproducible source, for tests only: its outputs are predictable."""

    def __init__(self, seed: int) -> None:
        self._generator = np.random.Generator(np.random.PCG64(seed))

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        return self._generator.integers(0, 2**64, size=n, dtype=np.uint64)
