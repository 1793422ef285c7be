"""The samplers against their exact laws: chi-square at fixed sample sizes and seeds."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from accountant.randomness import SeededRandomSource
from accountant_plugins import _exact

ALPHA = 1e-4  # per test; seeded, so a pass is reproducible, and a broken sampler fails hard


def _chi_square(samples: np.ndarray, pmf: dict[int, float]) -> float:
    support = sorted(pmf)
    counts = np.array([np.count_nonzero(samples == k) for k in support], dtype=float)
    expected = np.array([pmf[k] for k in support]) * samples.size
    tail_observed = samples.size - counts.sum()
    tail_expected = samples.size - expected.sum()
    observed = np.append(counts, tail_observed)
    wanted = np.append(expected, tail_expected)
    keep = wanted > 5
    observed, wanted = observed[keep], wanted[keep]
    wanted *= observed.sum() / wanted.sum()
    return float(stats.chisquare(observed, wanted).pvalue)


def _normalised(weights: dict[int, float]) -> dict[int, float]:
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


@pytest.mark.parametrize(
    ("gamma", "seed"),
    [(Fraction(0), 1), (Fraction(1, 3), 2), (Fraction(1), 3), (Fraction(7, 2), 4)],
)
def test_bernoulli_exp_is_exact(gamma: Fraction, seed: int) -> None:
    source = SeededRandomSource(seed)
    n = 200_000
    draws = _exact.bernoulli_exp(
        source,
        np.full(n, gamma.numerator, dtype=np.int64),
        np.full(n, gamma.denominator, dtype=np.int64),
    )
    p = math.exp(-gamma)
    assert stats.binomtest(int(draws.sum()), n, p).pvalue > ALPHA


@pytest.mark.parametrize(("s", "t", "seed"), [(1, 1, 5), (3, 7, 6), (1, 10, 7), (5, 2, 8)])
def test_discrete_laplace_follows_its_law(s: int, t: int, seed: int) -> None:
    samples = _exact.discrete_laplace(SeededRandomSource(seed), s, t, 200_000)
    radius = int(12 * t / s) + 2
    pmf = _normalised({k: math.exp(-abs(k) * s / t) for k in range(-radius * 4, radius * 4)})
    assert _chi_square(samples, {k: v for k, v in pmf.items() if abs(k) <= radius}) > ALPHA
    assert abs(samples.mean()) < 0.05 * t / s + 0.01


@pytest.mark.parametrize(("p", "q", "seed"), [(1, 1, 9), (9, 4, 10), (100, 1, 11), (2000, 3, 12)])
def test_discrete_gaussian_follows_its_law(p: int, q: int, seed: int) -> None:
    assert _exact.fits_exactly(p, q)
    sigma2 = p / q
    samples = _exact.discrete_gaussian(SeededRandomSource(seed), p, q, 200_000)
    radius = int(8 * math.sqrt(sigma2)) + 2
    pmf = _normalised({k: math.exp(-k * k / (2 * sigma2)) for k in range(-radius, radius + 1)})
    assert _chi_square(samples, pmf) > ALPHA
    assert abs(samples.var() / sigma2 - 1) < 0.03


def test_a_wrong_law_is_rejected() -> None:
    """The test above has power: scale 10 samples are not scale 11."""
    samples = _exact.discrete_laplace(SeededRandomSource(13), 1, 11, 200_000)
    pmf = _normalised({k: math.exp(-abs(k) / 10) for k in range(-400, 401)})
    assert _chi_square(samples, {k: v for k, v in pmf.items() if abs(k) <= 130}) < ALPHA


def test_uniform_below_is_uniform() -> None:
    draws = _exact.uniform_below(SeededRandomSource(14), np.full(100_000, 7, dtype=np.int64))
    counts = np.bincount(draws, minlength=7)
    assert counts.size == 7 and stats.chisquare(counts).pvalue > ALPHA


def test_the_scalar_path_follows_the_same_law() -> None:
    source = SeededRandomSource(15)
    samples = np.concatenate([_exact.discrete_laplace(source, 3, 7, 20) for _ in range(5_000)])
    pmf = _normalised({k: math.exp(-abs(k) * 3 / 7) for k in range(-60, 61)})
    assert _chi_square(samples, {k: v for k, v in pmf.items() if abs(k) <= 20}) > ALPHA
