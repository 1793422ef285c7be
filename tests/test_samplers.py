"""The samplers against their exact laws: chi-square at fixed sample sizes and seeds."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
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


def _geometric_p_value(samples: np.ndarray, t: int, width: int, bins: int) -> float:
    """X with P(X >= x) = exp(-x/t) against its exact law, binned by X // width: bin j has
    probability q^(j w) (1 - q^w), q = exp(-1/t); the last bin takes the tail."""
    index = np.minimum(samples // width, bins - 1).astype(np.int64)
    counts = np.bincount(index, minlength=bins)
    ratio = math.exp(-width / t)
    probabilities = np.array(
        [ratio**j * (1 - ratio) for j in range(bins - 1)] + [ratio ** (bins - 1)]
    )
    expected = probabilities * samples.size
    return float(stats.chisquare(counts, expected).pvalue)


def _geometric(source: SeededRandomSource, t: int, n: int, per_draw: int = 5_000) -> np.ndarray:
    pool = _exact.WordPool(source)
    words = _exact.PoolWords(pool)
    draws = [_exact._Geometric(pool, words, t).draw(per_draw) for _ in range(n // per_draw)]
    return np.concatenate(draws)


@pytest.mark.parametrize(
    ("t", "seed"), [(1, 20), (2, 21), (7, 22), (1000, 23), (2**41 + 12345, 24), (2**54 + 1, 25)]
)
def test_the_geometric_sampler_follows_its_law(t: int, seed: int) -> None:
    """X = t V + floor(t x) from von Neumann's trials: P(X >= x) = exp(-x/t) exactly. Bins of
    width t/8 (1 for small t) check V and the top bits of x; X mod 8, with
    P(X mod 8 = j) = q^j (1 - q) / (1 - q^8), its low bits."""
    samples = _geometric(SeededRandomSource(seed), t, 200_000)
    assert samples.dtype == np.int64 and samples.min() >= 0
    assert _geometric_p_value(samples, t, max(1, t // 8), 60) > ALPHA
    q = math.exp(-1 / t)
    low = np.array([q**j * -math.expm1(-1 / t) / -math.expm1(-8 / t) for j in range(8)])
    assert stats.chisquare(np.bincount(samples % 8, minlength=8), low * samples.size).pvalue > ALPHA


@pytest.mark.parametrize("bits", [2, 5])
@pytest.mark.parametrize(("t", "seed"), [(1, 26), (3, 27), (2**41 + 12345, 28), (2**54 + 1, 29)])
def test_coarse_chunks_leave_the_geometric_law_exact(
    monkeypatch: pytest.MonkeyPatch, bits: int, t: int, seed: int
) -> None:
    """With comparisons on 2 or 5 bits of each chunk, a run's chunks tie often (1/4, 1/32 per
    comparison), and floor(t x) is often undecided by the first chunk: those are finished in
    Python integers from the bits already drawn, and the law stays exact. Few trials per
    batch make the rejected trials of a batch carry into the next one."""
    monkeypatch.setattr(_exact, "CHUNK_BITS", bits)
    monkeypatch.setattr(_exact._Geometric, "TRIALS_PER_RUN", 0.5)
    samples = _geometric(SeededRandomSource(seed), t, 100_000, per_draw=997)
    assert _geometric_p_value(samples, t, max(1, t // 8), 60) > ALPHA


@pytest.mark.parametrize(
    ("s", "t", "seed"), [(1, 2**41 + 12345, 30), (3, 2**41 + 12345, 31), (7, 2**54 + 1, 32)]
)
def test_discrete_laplace_of_large_scale_follows_its_law(s: int, t: int, seed: int) -> None:
    """|Y| binned by t/(8 s): P(|Y| in bin j) from the exact law, and a fair sign."""
    samples = _exact.discrete_laplace(SeededRandomSource(seed), s, t, 200_000)
    assert samples.dtype == np.int64
    magnitude = np.abs(samples)
    # P(y) is proportional to r^|y|, r = exp(-s/t): P(|Y| >= e) = 2 r^e / (1 + r) for e >= 1
    width = t // (8 * s)
    counts = np.bincount(np.minimum(magnitude // width, 59), minlength=60)
    edges = [0, *[j * width for j in range(1, 60)]]
    ratio = math.exp(-s / t)
    tail = [2 * math.exp(-e * s / t) / (1 + ratio) if e else 1.0 for e in edges]  # P(|Y| >= e)
    probabilities = np.array([tail[j] - tail[j + 1] for j in range(59)] + [tail[59]])
    assert stats.chisquare(counts, probabilities * samples.size).pvalue > ALPHA
    assert stats.binomtest(int((samples > 0).sum()), int((samples != 0).sum())).pvalue > ALPHA


@pytest.mark.parametrize(("s", "t", "p", "q", "seed"), [(3, 7, 9, 4, 33), (1, 2, 100, 1, 34)])
def test_coarse_chunks_leave_the_laplace_and_gaussian_laws_exact(
    monkeypatch: pytest.MonkeyPatch, s: int, t: int, p: int, q: int, seed: int
) -> None:
    monkeypatch.setattr(_exact, "CHUNK_BITS", 3)
    samples = _exact.discrete_laplace(SeededRandomSource(seed), s, t, 100_000)
    pmf = _normalised({k: math.exp(-abs(k) * s / t) for k in range(-200, 201)})
    assert _chi_square(samples, {k: v for k, v in pmf.items() if abs(k) <= 40}) > ALPHA
    sigma2 = p / q
    samples = _exact.discrete_gaussian(SeededRandomSource(seed + 100), p, q, 100_000)
    radius = int(8 * math.sqrt(sigma2)) + 2
    pmf = _normalised({k: math.exp(-k * k / (2 * sigma2)) for k in range(-radius, radius + 1)})
    assert _chi_square(samples, pmf) > ALPHA


@pytest.mark.parametrize("bits", [2, 16])
@pytest.mark.parametrize(
    ("gamma", "seed"),
    [
        (Fraction(1), 35),
        (Fraction(2, 3), 36),
        (Fraction(5, 2), 37),
        (Fraction(2**54 + 12345, 2**55 - 1), 38),  # the long division takes several steps
        (Fraction(3 * 2**40 + 1, 2**40), 39),
    ],
)
def test_bernoulli_exp_is_exact_with_any_chunk(
    monkeypatch: pytest.MonkeyPatch, bits: int, gamma: Fraction, seed: int
) -> None:
    """On 2-bit chunks a quarter of the whole-part coins and of the fraction's first
    comparisons are finished in Python integers (exp(-w) from its certified bounds)."""
    monkeypatch.setattr(_exact, "CHUNK_BITS", bits)
    n = 100_000
    draws = _exact.bernoulli_exp(
        SeededRandomSource(seed),
        np.full(n, gamma.numerator, dtype=np.int64),
        np.full(n, gamma.denominator, dtype=np.int64),
    )
    assert stats.binomtest(int(draws.sum()), n, math.exp(-gamma)).pvalue > ALPHA


def test_bernoulli_exp_of_a_huge_exponent_is_false_and_of_zero_true() -> None:
    source = SeededRandomSource(40)
    ones = np.ones(1000, dtype=np.int64)
    assert not _exact.bernoulli_exp(source, ones * 10**12, ones).any()
    assert _exact.bernoulli_exp(source, ones * 0, ones * 7).all()
    mixed = _exact.bernoulli_exp(source, np.array([0, 10**15, 0]), np.array([1, 3, 5]))
    assert mixed.tolist() == [True, False, True]


@pytest.mark.parametrize(("offset", "seed"), [(0.0, 41), (2.9, 42)])
def test_coarse_chunks_leave_large_acceptances_exact(
    monkeypatch: pytest.MonkeyPatch, offset: float, seed: int
) -> None:
    monkeypatch.setattr(_exact, "CHUNK_BITS", 2)
    p = 3 * 2**80 + 7
    t = math.isqrt(p) + 1
    a = p // t + int(offset * math.isqrt(p))
    gamma = Fraction((a * t - p) ** 2, 2 * p * t * t)
    n = 100_000
    source = SeededRandomSource(seed)
    accepted = _exact.accept_large(source, _exact.Words(source), np.full(n, a, dtype=np.int64), p)
    assert stats.binomtest(int(accepted.sum()), n, math.exp(-gamma)).pvalue > ALPHA


def test_a_forced_huge_value_falls_back_to_python_integers(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the int64 limit lowered to 4 t, V > 3 (probability e^-4 per draw) leaves it: those
    batches become Python integers, with the same law, and the Gaussian takes them too."""
    t = 1000
    monkeypatch.setattr(_exact, "_INT64_SAFE", 4 * t)
    samples = _geometric(SeededRandomSource(43), t, 100_000)
    assert samples.dtype == object and all(type(x) is int for x in samples[:100])
    assert max(samples) > 4 * t
    assert _geometric_p_value(samples, t, t // 8, 60) > ALPHA
    laplace = _exact.discrete_laplace(SeededRandomSource(44), 1, t, 5_000)
    assert laplace.dtype == object and max(abs(int(y)) for y in laplace) > 4 * t
    # sigma^2 = 2000/3: proposals of scale t = 26
    monkeypatch.setattr(_exact, "_INT64_SAFE", 4 * 26)
    gaussian = _exact.discrete_gaussian(SeededRandomSource(45), 2000, 3, 2_000)
    assert gaussian.dtype == object
    assert abs(np.var(gaussian.astype(np.float64)) / (2000 / 3) - 1) < 0.15
    sigma = 2**41 + 12345
    monkeypatch.setattr(_exact, "_INT64_SAFE", 4 * (sigma + 1))
    large = _exact.discrete_gaussian_large(SeededRandomSource(46), sigma * sigma, 2_000)
    assert large.dtype == object
    assert abs(np.var(large.astype(np.float64)) / sigma**2 - 1) < 0.15


def test_exp_neg_bounds_enclose_exp_neg_w() -> None:
    with mpmath.workdps(1000):
        for w in (0, 1, 2, 5, 11, 12, 40, 1000):
            exact = mpmath.exp(-w)
            for bits in (16, 64, 200, 1500):
                lo, hi = _exact._exp_neg_bounds(w, bits)
                assert lo <= exact * mpmath.mpf(2) ** bits <= hi and hi - lo <= 4
    with mpmath.workdps(50):
        table = [int(mpmath.floor(mpmath.exp(-w) * 2**16)) for w in range(13)]
    assert _exact._EXP16.tolist() == table and table[-1] == 0


def test_the_wide_product_and_the_long_division_are_exact() -> None:
    words = SeededRandomSource(46).uint64(2000)
    words[:4] = [0, 1, 2**64 - 1, 2**63]
    for t in (1, 3, 2**32 - 1, 2**32, 2**41 + 12345, 2**55 - 1, 2**64 - 1):
        high, low_top = _exact._mul_wide(words, t)
        for w, h, lo in zip(words.tolist(), high.tolist(), low_top.tolist(), strict=True):
            assert h == (w * t) >> 64 and lo == (w * t) % 2**64 >> 32
    rng = np.random.default_rng(47)
    for top in (7, 2**20, 2**47, 2**55, 2**61):
        d = rng.integers(1, top, 1000, dtype=np.int64)
        r = (rng.random(1000) * d).astype(np.int64)
        below, above = _exact._sixteen_bits(r, d)
        for ri, di, b, a in zip(
            r.tolist(), d.tolist(), below.tolist(), above.tolist(), strict=True
        ):
            assert b == (ri << 16) // di and a == -(-(ri << 16) // di)


class _Counting(SeededRandomSource):
    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.calls: list[int] = []

    def uint64(self, n: int) -> np.ndarray:
        self.calls.append(n)
        return super().uint64(n)


def test_words_come_in_few_large_blocks_each_used_once() -> None:
    source = _Counting(48)
    _exact.discrete_laplace(source, 1, 2**41 + 12345, 100_000)
    assert len(source.calls) <= 8
    scripted = _Counting(49)
    pool = _exact.WordPool(scripted)
    words = SeededRandomSource(49).uint64(_exact._MIN_BLOCK)
    pieces = words.view(np.uint16)
    assert pool.chunks(3).tolist() == pieces[:3].tolist()
    assert pool.words(2).tolist() == words[1:3].tolist()  # aligned to the next whole word
    assert pool.chunks(1).tolist() == pieces[12:13].tolist()


def test_uniform_below_is_uniform_for_wide_and_mixed_bounds() -> None:
    bound = 2**40 + 3
    draws = _exact.uniform_below(SeededRandomSource(50), np.full(100_000, bound, dtype=np.int64))
    assert draws.min() >= 0 and draws.max() < bound
    assert stats.chisquare(np.bincount(draws * 8 // bound, minlength=8)).pvalue > ALPHA
    bounds = np.tile(np.array([1, 2, 3, 2**17 + 1], dtype=np.int64), 25_000)
    mixed = _exact.uniform_below(SeededRandomSource(51), bounds)
    assert (mixed < bounds).all() and (mixed[bounds == 1] == 0).all()
    assert stats.chisquare(np.bincount(mixed[bounds == 3], minlength=3)).pvalue > ALPHA


def test_a_geometric_scale_beyond_the_documented_range_is_refused() -> None:
    """Vectorised draws need t < 2^55 (int64 products): a larger scale is an error, never
    a wrong law (sigma^2 = 2^120 makes t about 2^60)."""
    with pytest.raises(ValueError, match="out of range"):
        _exact.discrete_gaussian_large(SeededRandomSource(7), 2**120, 100)
