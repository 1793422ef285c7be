"""Tight pricing of a batch's group on an approx dataset (accountant/accounting/plan_pricing.py):
the composed epsilon against dp_accounting's PLD of the continuous mechanisms (a test-only
reference, at its default interval), the grid Gaussian's margin, the discrete Laplace pair
against dp_accounting's own and against the exact product laws it must dominate, the generic
pair against basic composition, and the division of a group's cost."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from decimal import Decimal
from fractions import Fraction
from typing import Any

import mpmath
import pytest
from dp_accounting.pld import privacy_loss_distribution
from hypothesis import given, settings
from hypothesis import strategies as st

from accountant.accounting.plan_pricing import PlanItem, group_cost, group_epsilon, split
from accountant.exact import DELTA, EPSILON, Amount, ComponentName
from accountant.mechanism import PrivacyContext
from accountant.randomness import SeededRandomSource
from accountant_plugins import _samplers, laplace
from accountant_plugins.discrete_gaussian import DISCRETE_GAUSSIAN
from accountant_plugins.discrete_laplace import DISCRETE_LAPLACE
from accountant_plugins.gaussian import GAUSSIAN, noise_ratio
from accountant_plugins.laplace import LAPLACE, discrete_laplace_loss

MILLIONTH = Fraction(1, 10**6)
COMPONENTS: tuple[ComponentName, ...] = ("epsilon", "delta", "rho")
#: dp_accounting's default value_discretization_interval, the reference's.
REFERENCE_INTERVAL = 1e-4


def _decimals(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as the JSON layer hands them to a mechanism."""
    return {name: Decimal(str(value)) for name, value in params.items()}


def gaussian_item(d: int = 1, **params: Any) -> PlanItem:
    return PlanItem(mechanism=GAUSSIAN, params=_decimals(params), coordinates=d, single=None)


def laplace_item(epsilon: str, sensitivity: str = "1", d: int = 1) -> PlanItem:
    params = _decimals({"epsilon": epsilon, "sensitivity": sensitivity})
    single = Amount(epsilon=EPSILON.cost_units(Decimal(epsilon)))
    return PlanItem(mechanism=LAPLACE, params=params, coordinates=d, single=single)


def _charged(units: int) -> Fraction:
    return Fraction(units, EPSILON.scale)


def _reference(parts: list[tuple[Any, int]], delta: float) -> float:
    """dp_accounting's epsilon for the continuous plan: each (distribution, count) composed."""
    composed = None
    for distribution, count in parts:
        part = distribution.self_compose(count) if count > 1 else distribution
        composed = part if composed is None else composed.compose(part)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(delta))


@functools.lru_cache(maxsize=64)
def continuous_gaussian(ratio: float) -> Any:
    """The continuous Gaussian of sigma/sensitivity ``ratio``, as dp_accounting builds it."""
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=ratio, sensitivity=1.0, value_discretization_interval=REFERENCE_INTERVAL
    )


@functools.lru_cache(maxsize=64)
def continuous_laplace(epsilon: float) -> Any:
    """The continuous Laplace of scale sensitivity/epsilon, as dp_accounting builds it."""
    return privacy_loss_distribution.from_laplace_mechanism(
        1 / epsilon, sensitivity=1.0, value_discretization_interval=REFERENCE_INTERVAL
    )


# --- the Gaussian ------------------------------------------------------------------------


def test_a_hundred_gaussians_cost_their_pld_and_never_less() -> None:
    """100 Gaussians of sigma 10: within 2% above dp_accounting's PLD epsilon of the continuous
    mechanism (4.88655 at 1e-6; 4.886554117 exactly, by mu-GDP with mu = 1), never below."""
    charged = _charged(group_epsilon([gaussian_item(sigma=10, sensitivity=1)] * 100, MILLIONTH))
    reference = _reference([(continuous_gaussian(10.0), 100)], 1e-6)
    print(f"100 gaussians of sigma 10: charged {float(charged):.9f}, dp_accounting {reference}")
    assert Fraction(reference) <= charged <= Fraction(reference) * Fraction(102, 100)
    assert abs(charged - Fraction("4.8866")) < Fraction(1, 10**4)
    assert abs(reference - 4.8866) < 1e-4


def test_the_epsilon_delta_form_composes_like_its_sigma() -> None:
    """A gaussian stated by (epsilon, delta) runs with the analytic sigma and is priced by
    it: 100 of (0.5, 1e-6) cost what 100 of that sigma cost, and less than basic composition
    (50)."""
    stated = gaussian_item(epsilon="0.5", delta="0.000001", sensitivity=2)
    ratio = noise_ratio(Fraction("0.5"), MILLIONTH)
    charged = _charged(group_epsilon([stated] * 100, MILLIONTH))
    reference = _reference([(continuous_gaussian(float(ratio)), 100)], 1e-6)
    assert Fraction(reference) <= charged <= Fraction(reference) * Fraction(1001, 1000) < 50


def test_the_sigma_form_runs_on_approx_and_is_priced_in_a_group() -> None:
    """sigma and sensitivity: the cost of a single charge on approx refuses it (a batch does
    not ask it for grouped items), while prepare, run and privacy_loss accept it."""
    params = _decimals({"sigma": 10, "sensitivity": 1})
    with pytest.raises(ValueError, match="epsilon and delta"):
        GAUSSIAN.cost(params, PrivacyContext("record", "approx"))
    data = {"values": [Decimal(1), Decimal(2), Decimal(3)]}
    assert GAUSSIAN.prepare is not None and GAUSSIAN.run is not None
    GAUSSIAN.prepare(params, data)
    assert len(GAUSSIAN.run(params, data, SeededRandomSource(31))["values"]) == 3
    assert GAUSSIAN.privacy_loss is not None
    assert GAUSSIAN.privacy_loss(params, 3, 1e-4).get_epsilon_for_delta(1e-6) > 0


def test_the_gaussian_privacy_loss_carries_the_margin() -> None:
    """The grid sampler is dominated by a Gaussian of shift GDP_MARGIN, not 1 (docs/
    accounting.md, gdp): the plugin's distribution composes to strictly more than the same
    Gaussian without the margin (tests/mutation_check.py removes it)."""
    params = _decimals({"sigma": 10, "sensitivity": 1})
    assert GAUSSIAN.privacy_loss is not None
    with_margin = GAUSSIAN.privacy_loss(params, 1, REFERENCE_INTERVAL).self_compose(100)
    without = continuous_gaussian(10.0).self_compose(100)
    for delta in (1e-3, 1e-6, 1e-9):
        assert with_margin.get_epsilon_for_delta(delta) > without.get_epsilon_for_delta(delta)


def test_a_thousand_gaussians_price_quickly() -> None:
    """1000 Gaussians of sigma 10 (the time is printed, not asserted: machines differ)."""
    items = [gaussian_item(sigma=10, sensitivity=1)] * 1000
    group_epsilon(items[:1], MILLIONTH)  # dp_accounting imported, as in a running service
    started = time.perf_counter()
    units = group_epsilon(items, MILLIONTH)
    seconds = time.perf_counter() - started
    reference = _reference([(continuous_gaussian(10.0), 1000)], 1e-6)
    print(f"1000 gaussians of sigma 10: epsilon {units / 1e9} in {seconds:.3f} s")
    assert Fraction(reference) <= _charged(units) <= Fraction(reference) * Fraction(101, 100)


# --- the Laplace -------------------------------------------------------------------------


def test_a_mixed_plan_never_costs_less_than_the_continuous_pld() -> None:
    """50 Laplaces of epsilon 0.1 and 50 Gaussians of sigma 10, against dp_accounting's PLD of
    the continuous mechanisms; basic composition would charge 5 for the Laplaces alone."""
    items = [laplace_item("0.1")] * 50 + [gaussian_item(sigma=10, sensitivity=1)] * 50
    charged = _charged(group_epsilon(items, MILLIONTH))
    reference = _reference([(continuous_laplace(0.1), 50), (continuous_gaussian(10.0), 50)], 1e-6)
    print(
        f"50 laplaces (0.1) + 50 gaussians (10): charged {float(charged):.9f}, "
        f"dp_accounting {reference}"
    )
    assert Fraction(reference) <= charged <= Fraction(reference) * Fraction(1001, 1000)


def test_the_laplace_pair_is_priced_above_the_sampler() -> None:
    """The grid sampler adds noise of parameter 1/t; the pair priced has epsilon/L >= 1/t and
    the grid's L1 sensitivity L, so its largest loss is exactly epsilon."""
    for epsilon, sensitivity, d in (("0.1", "1", 1), ("1", "3", 7), ("0.03", "0.5", 1000)):
        params = _decimals({"epsilon": epsilon, "sensitivity": sensitivity})
        grid, t = laplace.calibrate(params, d)
        shift = _samplers.grid_sensitivity(Fraction(sensitivity), grid, d)
        assert Fraction(1, t) <= Fraction(epsilon) / shift


@pytest.mark.parametrize(("epsilon", "sensitivity"), [("1", "1"), ("0.5", "2"), ("1", "3")])
def test_the_discrete_laplace_pair_is_dp_accountings(epsilon: str, sensitivity: str) -> None:
    """discrete_laplace's pair against dp_accounting's DiscreteLaplacePrivacyLoss (connect the
    dots on the grid points next to its L + 1 losses; ours uses every grid point between -aL
    and aL): the same epsilon but for float rounding and a sliver of discretisation, composed
    1 and 20 times (tests/mutation_check.py shrinks the shift by one)."""
    params = _decimals({"epsilon": epsilon, "sensitivity": sensitivity})
    assert DISCRETE_LAPLACE.privacy_loss is not None
    ours = DISCRETE_LAPLACE.privacy_loss(params, 1, REFERENCE_INTERVAL)
    theirs = privacy_loss_distribution.from_discrete_laplace_mechanism(
        float(Fraction(epsilon) / Fraction(sensitivity)),
        sensitivity=int(sensitivity),
        value_discretization_interval=REFERENCE_INTERVAL,
        use_connect_dots=True,
    )
    for count, delta in itertools.product((1, 20), (1e-3, 1e-6)):
        mine = ours.self_compose(count).get_epsilon_for_delta(delta)
        reference = theirs.self_compose(count).get_epsilon_for_delta(delta)
        assert mine == pytest.approx(reference, rel=1e-6)


def _clipped_sum_law(a: Any, shifts: tuple[int, ...]) -> dict[int, Any]:
    """The law of C, the sum over coordinates of clip(k_i, 0, v_i) for independent discrete
    Laplaces k_i of parameter a: clip(k, 0, v) is 0 with probability 1/(1 + r), c with
    (1 - r) r^c / (1 + r) for 0 < c < v and v with r^v / (1 + r), r = e^-a."""
    r = mpmath.exp(-a)
    law: dict[int, Any] = {0: mpmath.mpf(1)}
    for v in shifts:
        if v == 0:
            continue
        one = {c: (1 - r) * r**c / (1 + r) for c in range(1, v)}
        one[0], one[v] = 1 / (1 + r), r**v / (1 + r)
        convolved: dict[int, Any] = {}
        for (c1, p1), (c2, p2) in itertools.product(law.items(), one.items()):
            convolved[c1 + c2] = convolved.get(c1 + c2, 0) + p1 * p2
        law = convolved
    return law


def test_several_values_are_dominated_by_one_shifted_by_the_whole_norm() -> None:
    """The lemma of docs/accounting.md ("Batches"): discrete Laplaces shifted by integers
    (v_1, ..., v_d) of L1 norm at most L are dominated by one coordinate shifted by L. A
    coordinate shifted by v loses a(v - 2 clip(k, 0, v)), so the product loses a(|v| - 2C);
    its exact divergence (at 30 digits) stays below the priced pair's at every epsilon tried,
    from -aL to aL, for every way of writing up to L <= 6 as three parts."""
    with mpmath.workdps(30):
        for a, shift in itertools.product(("0.05", "0.3", "1", "2.5"), range(1, 7)):
            priced = discrete_laplace_loss(Fraction(a), shift, 1e-3)
            top = float(Fraction(a) * shift)
            epsilons = [top * (k / 10 - 1) for k in range(21)]
            bounds = [priced.get_delta_for_epsilon(epsilon) for epsilon in epsilons]
            for parts in itertools.product(range(shift + 1), repeat=3):
                if not 1 <= sum(parts) <= shift or list(parts) != sorted(parts):
                    continue  # the order of the coordinates does not matter
                law, norm = _clipped_sum_law(mpmath.mpf(a), parts), sum(parts)
                for epsilon, bound in zip(epsilons, bounds, strict=True):
                    exact = sum(
                        p * max(0, 1 - mpmath.exp(epsilon - mpmath.mpf(a) * (norm - 2 * c)))
                        for c, p in law.items()
                    )
                    assert exact <= bound + 1e-12, (a, parts, epsilon)


def test_the_discrete_laplace_pair_is_exact_at_its_grid_points() -> None:
    """At a grid point the priced pair's divergence is the closed form (connect the dots
    interpolates only between them), for a shift near 2^40 as the grid Laplace has."""
    shift = 2**40 + 3
    a = Fraction(1, 10) / shift
    priced = discrete_laplace_loss(a, shift, REFERENCE_INTERVAL)
    with mpmath.workdps(40):
        for k in (-900, -1, 0, 1, 500, 999):
            epsilon = k * REFERENCE_INTERVAL
            # the continuous Laplace's 1 - e^((epsilon - aL)/2), within O(a) of the discrete
            exact = 1 - mpmath.exp((mpmath.mpf(epsilon) - mpmath.mpf("0.1")) / 2)
            assert priced.get_delta_for_epsilon(epsilon) == pytest.approx(float(exact), rel=1e-8)


# --- any plan ----------------------------------------------------------------------------


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[PlanItem], list[tuple[Any, int]]]:
    """A plan of one to four kinds (a gaussian by sigma or by (epsilon, delta), a laplace),
    each repeated, with random d; and the continuous plan dp_accounting prices."""
    items: list[PlanItem] = []
    reference: list[tuple[Any, int]] = []
    for _ in range(draw(st.integers(1, 4))):
        count, d = draw(st.integers(1, 40)), draw(st.integers(1, 50))
        sensitivity = draw(st.sampled_from(["0.5", "1", "3"]))
        kind = draw(st.sampled_from(["sigma", "epsilon_delta", "laplace"]))
        if kind == "sigma":
            halves = draw(st.integers(4, 60))
            ratio, sigma = Fraction(halves, 2), Decimal(halves) / 2 * Decimal(sensitivity)
            items += [gaussian_item(d, sigma=sigma, sensitivity=sensitivity)] * count
            reference.append((continuous_gaussian(float(ratio)), count))
        elif kind == "epsilon_delta":
            epsilon = draw(st.sampled_from(["0.2", "0.5", "1"]))
            delta = draw(st.sampled_from(["0.00001", "0.000001", "1e-9"]))
            item = gaussian_item(d, epsilon=epsilon, delta=delta, sensitivity=sensitivity)
            items += [item] * count
            ratio = noise_ratio(Fraction(epsilon), Fraction(Decimal(delta)))
            reference.append((continuous_gaussian(float(ratio)), count))
        else:
            epsilon = draw(st.sampled_from(["0.01", "0.1", "0.3", "1"]))
            items += [laplace_item(epsilon, sensitivity, d)] * count
            reference.append((continuous_laplace(float(epsilon)), count))
    return items, reference


@settings(max_examples=25, deadline=None)
@given(plan=plans(), delta=st.sampled_from(["0.0001", "0.000001", "1e-9"]))
def test_a_plan_never_costs_less_than_its_continuous_pld(
    plan: tuple[list[PlanItem], list[tuple[Any, int]]], delta: str
) -> None:
    items, reference = plan
    charged = _charged(group_epsilon(items, Fraction(Decimal(delta))))
    assert charged >= Fraction(_reference(reference, float(delta)))


# --- the generic pair, the cost, errors -----------------------------------------------------


def test_a_mechanism_without_privacy_loss_is_priced_by_its_single_cost() -> None:
    """discrete_gaussian states no privacy-loss distribution: each item is the generic pair of
    its single (epsilon, delta), and the group costs no more than basic composition of the
    items (here far less: 20 releases of (0.5, 1e-7) at delta 1e-5)."""
    params = _decimals({"epsilon": "0.5", "delta": "1e-7", "sensitivity": 1})
    single = Amount(epsilon=EPSILON.cost_units(Decimal("0.5")), delta=DELTA.cost_units(1e-7))
    item = PlanItem(mechanism=DISCRETE_GAUSSIAN, params=params, coordinates=1, single=single)
    assert DISCRETE_GAUSSIAN.privacy_loss is None
    delta = Fraction(1, 10**5)
    units = group_epsilon([item] * 20, delta)
    assert units <= 20 * single.epsilon and 20 * single.delta <= DELTA.cost_units(delta)
    print(f"20 discrete gaussians of (0.5, 1e-7) at 1e-5: epsilon {units / 1e9} (basic: 10)")
    # a mechanism the core scales (no sensitivity) is priced by its single cost, too
    unscaled = dataclasses.replace(GAUSSIAN, has_sensitivity=False)
    assert group_epsilon([dataclasses.replace(item, mechanism=unscaled)] * 20, delta) == units


def test_an_item_with_neither_a_privacy_loss_nor_a_single_cost_is_refused() -> None:
    item = PlanItem(mechanism=DISCRETE_GAUSSIAN, params={}, coordinates=1, single=None)
    with pytest.raises(ValueError, match="discrete_gaussian states no privacy-loss"):
        group_epsilon([gaussian_item(sigma=10, sensitivity=1), item], MILLIONTH)


def test_a_delta_too_small_for_any_epsilon_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="no finite epsilon for the group at delta 1e-17"):
        group_epsilon([gaussian_item(sigma=10, sensitivity=1)] * 3, Fraction(1, 10**17))
    with pytest.raises(ValueError, match="delta must lie in"):
        group_epsilon([gaussian_item(sigma=10, sensitivity=1)], Fraction(0))


def test_a_group_too_wide_to_compose_is_refused() -> None:
    """sigma/sensitivity 1/1000: a loss spanning about 20000 in epsilon; price it singly."""
    with pytest.raises(ValueError, match="cannot compose the group tightly"):
        group_epsilon([gaussian_item(sigma="0.001", sensitivity=1)], MILLIONTH)


def test_the_group_cost_is_its_epsilon_at_the_batchs_delta() -> None:
    items = [gaussian_item(sigma=10, sensitivity=1)] * 4
    assert group_cost(items, MILLIONTH) == Amount(
        epsilon=group_epsilon(items, MILLIONTH), delta=10**12
    )


@given(
    epsilon=st.integers(0, 10**15),
    delta=st.integers(0, 10**17),
    rho=st.integers(0, 10**12),
    n=st.integers(1, 1000),
)
def test_a_split_adds_to_at_least_the_total(epsilon: int, delta: int, rho: int, n: int) -> None:
    total = Amount(epsilon, delta, rho)
    parts = split(total, n)
    assert len(parts) == n
    added = Amount()
    for part in parts:
        added = added.plus(part)
        assert all(part[name] == math.ceil(Fraction(total[name], n)) for name in COMPONENTS)
    assert all(added[name] >= total[name] for name in COMPONENTS)
    with pytest.raises(ValueError):
        split(total, 0)
