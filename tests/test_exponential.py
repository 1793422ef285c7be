"""The exponential mechanism: its integer exponents are those of the rational definition, its
selections follow the exact law, and its word consumption is pinned."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from accountant.randomness import KeyedRandomSource, RandomSource, SeededRandomSource
from accountant_plugins import exponential
from accountant_plugins._exponential_sampling import (
    FIRST_BLOCK,
    LATER_BLOCK,
    ArrayLevels,
    Bits,
    IntegerLevels,
    Levels,
)


def reference_exponents(
    epsilon: Fraction, sensitivity: Fraction, utilities: list[Fraction]
) -> tuple[list[int], int]:
    """The exponents as version 2 computed them, in Fractions: the definition."""
    effective = epsilon * (1 - Fraction(1, 2**20))
    k = 0
    while Fraction(1, 2**k) > effective / 2**22:
        k += 1
    denominator = 2**k
    best = max(utilities)
    cap = 2**20 * denominator
    numerators = [
        min(cap, math.ceil(effective * (best - u) / (2 * sensitivity) * denominator))
        for u in utilities
    ]
    return numerators, denominator


def _reference(epsilon: Any, sensitivity: Any, utilities: Sequence[Any]) -> tuple[list[int], int]:
    return reference_exponents(
        Fraction(epsilon), Fraction(sensitivity), [Fraction(u) for u in utilities]
    )


EPSILONS = st.one_of(
    st.floats(min_value=1e-300, max_value=1e6, allow_subnormal=False),
    st.decimals(min_value=Decimal("1e-40"), max_value=Decimal("1e6"), places=None).filter(
        lambda d: d > 0
    ),
    st.sampled_from([Decimal(1), Decimal("0.1"), Decimal("1e-9"), Decimal("1e-300"), 3, 1e6]),
)
SENSITIVITIES = st.one_of(
    st.floats(min_value=1e-12, max_value=1e15),
    st.decimals(min_value=Decimal("1e-12"), max_value=Decimal("1e15"), places=None),
    st.integers(1, 10**15),
)
UTILITY = st.one_of(
    st.integers(-(10**300), 10**300),
    st.integers(-1000, 1000),
    st.floats(min_value=-1e300, max_value=1e300),
    st.decimals(
        min_value=Decimal("-1e300"), max_value=Decimal("1e300"), allow_nan=False, places=None
    ),
    st.fractions(max_denominator=10**6).filter(lambda f: abs(f) < 10**6),
)
#: Where the int64 path applies: moderate epsilons, small integers and dyadic steps, and a
#: few far values whose exponents reach the cap.
MODERATE_EPSILONS = st.one_of(
    st.floats(min_value=1e-4, max_value=1e4),
    st.decimals(min_value=Decimal("1e-4"), max_value=Decimal("1e4"), places=4),
    st.integers(1, 1000),
)
MODERATE_SENSITIVITIES = st.one_of(
    st.integers(1, 100),
    st.decimals(min_value=Decimal("0.01"), max_value=Decimal(100), places=2),
    st.sampled_from([0.5, 0.25, 3.0]),
)
SMALL_UTILITY = st.one_of(
    st.integers(-(10**6), 10**6),
    st.integers(-100, 100),
    st.sampled_from([10**12, -(10**12), 2**61, -(2**61)]),
    st.builds(lambda i, e: i / 2**e, st.integers(-(10**6), 10**6), st.integers(0, 30)),
    st.builds(lambda i, e: Decimal(i).scaleb(-e), st.integers(-(10**6), 10**6), st.integers(0, 6)),
)


@settings(max_examples=400, deadline=None)
@given(EPSILONS, SENSITIVITIES, st.lists(UTILITY, min_size=1, max_size=12))
def test_the_integer_exponents_are_the_rational_ones(
    epsilon: Any, sensitivity: Any, utilities: list[Any]
) -> None:
    assert exponential.exponents(epsilon, sensitivity, utilities) == _reference(
        epsilon, sensitivity, utilities
    )


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(MODERATE_EPSILONS, EPSILONS),
    st.one_of(MODERATE_SENSITIVITIES, SENSITIVITIES),
    st.one_of(
        st.lists(SMALL_UTILITY, min_size=1, max_size=80),
        st.lists(st.one_of(SMALL_UTILITY, UTILITY), min_size=1, max_size=80),
    ),
    st.booleans(),
)
def test_both_paths_give_the_rational_exponents_and_the_same_levels(
    epsilon: Any, sensitivity: Any, utilities: list[Any], integers_only: bool
) -> None:
    if integers_only:
        utilities = [int(u) for u in utilities]
    numerators, denominator = _reference(epsilon, sensitivity, utilities)
    k = denominator.bit_length() - 1
    _, a, b = exponential._scaling(epsilon, sensitivity)
    values, _, common = exponential._integer_array(utilities)
    if values is not None:
        array = exponential._numerator_array(values, a, b * common, k)
        if array is not None:
            assert array.tolist() == numerators
            _same_levels(ArrayLevels(array, k), IntegerLevels(numerators, k), numerators)


def _same_levels(left: Levels, right: Levels, numerators: list[int]) -> None:
    k = left.denominator.bit_length() - 1
    assert (left.top, left.widest, left.denominator) == (right.top, right.widest, right.denominator)
    by_level = Counter(n >> k for n in numerators)
    assert left.top == max(by_level) and left.widest == max(by_level.values())
    for g in {*by_level, *range(min(left.top, 3) + 1)}:
        assert left.count(g) == right.count(g) == by_level.get(g, 0)
        members = [i for i, n in enumerate(numerators) if n >> k == g]
        for j, i in enumerate(members):
            assert left.member(g, j) == right.member(g, j) == i
            assert left.fraction(i) == right.fraction(i) == numerators[i] % left.denominator


ARRAY_CASES: list[tuple[Any, Any, list[Any]]] = [
    (Decimal(1), Decimal(1), [*range(60), 10**7, -(10**7)]),  # capped: the gaps are clipped
    (Decimal("0.1"), Decimal(1), [Decimal(i).scaleb(-2) for i in range(-500, 500)]),
    (Decimal("0.5"), 0.5, [i / 64 for i in range(100)] + [3e6]),
    (Decimal("1e-4"), Decimal("0.25"), [*range(100), 2**40]),
    (Decimal("1e-5"), Decimal("0.3"), [Decimal(i).scaleb(-3) for i in range(100)] + [10**15]),
    (Decimal(3), Decimal(2), [True, *range(99)]),
]


@pytest.mark.parametrize(("epsilon", "sensitivity", "utilities"), ARRAY_CASES)
def test_the_array_path_gives_the_rational_exponents(
    epsilon: Any, sensitivity: Any, utilities: list[Any]
) -> None:
    numerators, denominator = _reference(epsilon, sensitivity, utilities)
    k, a, b = exponential._scaling(epsilon, sensitivity)
    assert denominator == 1 << k
    values, _, common = exponential._integer_array(utilities)
    assert values is not None
    array = exponential._numerator_array(values, a, b * common, k)
    assert array is not None and array.tolist() == numerators
    _same_levels(ArrayLevels(array, k), IntegerLevels(numerators, k), numerators)


def test_the_array_path_is_taken_and_agrees_with_python_integers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = {"epsilon": Decimal("0.3"), "sensitivity": Decimal(2)}
    utilities = [(i * 7919) % 101 - 50 for i in range(500)]
    assert exponential._integer_array(utilities)[0] is not None
    fast = [
        exponential.run(params, {"utilities": utilities}, SeededRandomSource(i))["index"]
        for i in range(200)
    ]
    monkeypatch.setattr(exponential, "ARRAY_FROM", 10**9)
    slow = [
        exponential.run(params, {"utilities": utilities}, SeededRandomSource(i))["index"]
        for i in range(200)
    ]
    assert fast == slow


def _law(params: dict[str, Any], utilities: Sequence[Any]) -> list[mpmath.mpf]:
    numerators, denominator = _reference(params["epsilon"], params["sensitivity"], utilities)
    with mpmath.workdps(40):
        weights = [mpmath.exp(-mpmath.mpf(n) / denominator) for n in numerators]
        total = mpmath.fsum(weights)
        return [w / total for w in weights]


def _pooled(
    counts: Counter[int], law: list[mpmath.mpf], draws: int
) -> tuple[list[int], list[float]]:
    """Observed and expected counts over runs of consecutive candidates, each expecting 10 or
    more (the last run takes the remainder)."""
    observed: list[int] = []
    expected: list[float] = []
    seen, mass = 0, mpmath.mpf(0)
    for i, p in enumerate(law):
        seen += counts[i]
        mass += p
        if mass * draws >= 10:
            observed.append(seen)
            expected.append(float(mass * draws))
            seen, mass = 0, mpmath.mpf(0)
    if observed:
        observed[-1] += seen
        expected[-1] += float(mass * draws)
    return observed, expected


TENTH = Decimal("0.1")
LAWS: dict[str, tuple[dict[str, Any], list[Any], int]] = {
    "ties": ({"epsilon": Decimal(1), "sensitivity": Decimal(1)}, [3, 3, 3, 1, 0, 3], 20_000),
    "cap": (
        {"epsilon": Decimal(1), "sensitivity": Decimal(1)},
        [10**300, 10**300 - 1, 0, 10**300 - 3, -(10**300), Decimal("-1e300"), 10**300],
        20_000,
    ),
    "negative and fractional": (
        {"epsilon": Decimal("0.7"), "sensitivity": Decimal("0.5")},
        [-2.5, Decimal("-0.125"), 0.75, Fraction(1, 3), -1, TENTH, Decimal("-1.2e-1")],
        20_000,
    ),
    "thousand": (
        {"epsilon": Decimal(1), "sensitivity": Decimal(1)},
        [(i * 7919) % 13 for i in range(1000)],
        20_000,
    ),
    "thousand, levels far apart": (
        {"epsilon": Decimal(2), "sensitivity": Decimal(1)},
        [10**6 - i % 5 if i % 20 == 0 else i % 3 for i in range(1000)],
        20_000,
    ),
    "tiny epsilon": (
        {"epsilon": Decimal("1e-12"), "sensitivity": Decimal(1)},
        [0, 10**12, 2 * 10**12, Decimal("2.5e12"), 3e12],
        20_000,
    ),
    "tiny epsilon, many": (
        {"epsilon": Decimal("1e-15"), "sensitivity": 1},
        [i * 10**14 for i in range(60)],
        20_000,
    ),
}


@pytest.mark.parametrize("case", sorted(LAWS))
def test_selections_follow_the_exact_law(case: str) -> None:
    params, utilities, draws = LAWS[case]
    source = SeededRandomSource(sum(map(ord, case)))
    counts = Counter(
        exponential.run(params, {"utilities": utilities}, source)["index"] for _ in range(draws)
    )
    law = _law(params, utilities)
    for i, p in enumerate(law):
        if p < mpmath.mpf(10) ** -30:
            assert counts[i] == 0
    observed, expected = _pooled(counts, law, draws)
    assert len(observed) >= 3
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_the_tiny_epsilon_cases_take_python_integers() -> None:
    for case in ("tiny epsilon", "tiny epsilon, many"):
        params, utilities, _ = LAWS[case]
        k, a, b = exponential._scaling(params["epsilon"], params["sensitivity"])
        values, _, common = exponential._integer_array(utilities)
        assert values is None or exponential._numerator_array(values, a, b * common, k) is None


class _Scripted(RandomSource):
    """Hands out the given words, and records how many each call asked for."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.calls: list[int] = []

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        self.calls.append(n)
        block, self.words = self.words[:n], self.words[n:]
        return np.array(block + [0] * (n - len(block)), dtype=np.uint64)


def test_a_comparison_on_the_boundary_word_is_finished_by_the_next() -> None:
    third = 2**64 // 3  # 2^64 = 3 third + 1: U < 1/3 is then decided by the next word
    assert Bits(_Scripted([third, 0])).bernoulli(1, 3) is True
    assert Bits(_Scripted([third, 2**64 - 1])).bernoulli(1, 3) is False
    assert Bits(_Scripted([third - 1])).bernoulli(1, 3) is True
    assert Bits(_Scripted([third + 1])).bernoulli(1, 3) is False
    assert Bits(_Scripted([0])).bernoulli(0, 5) is False
    assert Bits(_Scripted([2**64 - 1])).bernoulli(5, 5) is True


def test_uniform_integers_reject_the_uneven_words() -> None:
    # 2^64 mod 3 = 1: the word 0 (product 0, low part 0 < 1) is rejected
    assert Bits(_Scripted([0, 2**63])).below(3) == 1
    assert Bits(_Scripted([])).below(1) == 0
    # beyond 2^64: 65 bits from two words, rejected while at or above the bound
    bound = 2**64 + 1
    bits = Bits(_Scripted([2**64 - 1, 2**63, 0, 2**63]))
    assert bits.below(bound) == 1
    draws = [Bits(SeededRandomSource(s)).below(bound) for s in range(200)]
    assert all(0 <= d < bound for d in draws) and len(set(draws)) == 200


def test_words_come_in_blocks_in_order() -> None:
    source = _Scripted(list(range(1, 200)))
    bits = Bits(source)
    assert [bits.word() for _ in range(FIRST_BLOCK + 3)] == list(range(1, FIRST_BLOCK + 4))
    assert source.calls == [FIRST_BLOCK, LATER_BLOCK]


def test_the_trials_have_their_exact_probabilities() -> None:
    bits = Bits(SeededRandomSource(5))
    n = 100_000
    for trial, p in (
        (bits.exp_minus_one, math.exp(-1)),
        (lambda: bits.exp_minus_fraction(1, 3), math.exp(-1 / 3)),
        (lambda: bits.exp_minus_fraction(2**40 - 1, 2**40), math.exp(-(1 - 2**-40))),
        (lambda: bits.bernoulli(2, 7), 2 / 7),
    ):
        assert stats.binomtest(sum(trial() for _ in range(n)), n, p).pvalue > 1e-4
    counts = np.bincount([bits.below(7) for _ in range(70_000)], minlength=7)
    assert stats.chisquare(counts).pvalue > 1e-4


#: Indices selected with the keyed source of charges "golden-0", "golden-1", ...: a change of
#: the word consumption changes them, and needs a new mechanism version.
GOLDEN: dict[str, tuple[dict[str, Any], list[Any], list[int]]] = {
    "three": (
        {"epsilon": Decimal(1), "sensitivity": Decimal(1)},
        [1, 5, 2],
        [1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 1, 1, 1],
    ),
    "hundred": (
        {"epsilon": Decimal(1), "sensitivity": Decimal(1)},
        list(range(100)),
        [97, 97, 98, 99, 99, 99, 97, 96, 98, 94, 99, 96, 99, 99, 98, 99, 99, 99, 98, 99],
    ),
    "tiny epsilon": (
        {"epsilon": Decimal("1e-12"), "sensitivity": Decimal(1)},
        [0, 10**12, Decimal("2.5e12"), 3e12],
        [1, 1, 3, 3, 2, 2, 1, 3, 2, 2, 3, 2, 3, 3, 2, 3, 3, 3, 2, 3],
    ),
}


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_the_word_consumption_is_pinned(case: str) -> None:
    params, utilities, expected = GOLDEN[case]
    assert exponential.EXPONENTIAL.version == "3+samplers.3"
    secret = bytes(range(32))
    selected = [
        exponential.run(params, {"utilities": utilities}, KeyedRandomSource(secret, f"golden-{i}"))[
            "index"
        ]
        for i in range(20)
    ]
    assert selected == expected
