"""Inputs far from zero: snapping to the grid is exact, so neighbours stay as close as the
noise was calibrated for, however large the value (``_samplers.grid_units``)."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import pytest

from accountant.randomness import SeededRandomSource
from accountant_plugins import _exact, _samplers, gaussian, laplace
from tests.conftest import Api

#: The magnitudes of the audit: 1e9, 1e12, 1e15, 2^53 + 1, 1e18, and 2^60 + 128.
LARGE = [
    Decimal(10**9),
    Decimal(10**12),
    Decimal(10**15),
    Decimal(2**53 + 1),
    Decimal(10**18),
    Decimal(2**60 + 128),
]


def _nearest_units(value: Fraction, grid: float) -> int:
    """An independent reference: the nearest multiple of the grid, ties to even (``round``
    of a Fraction is exact)."""
    return round(value / Fraction(grid))


@pytest.mark.parametrize("grid", [2.0**-41, 2.0**-40, 2.0**-3, 1.0, 2.0**20])
def test_snapping_is_exact(grid: float) -> None:
    values: list[Decimal | int | float] = [
        *LARGE,
        *(-value for value in LARGE),
        Decimal("120.37"),
        Decimal("-0.1"),
        Decimal("1e-300"),
        Decimal("9.99999999999999999999e299"),
        Decimal(2**60 + 129),
        2**60 + 129,
        -(2**70) - 1,
        0.1,
        1e300,
        0,
    ]
    ties = [Fraction(grid) * (2 * n + 1) / 2 for n in (-3, -2, 0, 1, 2**60)]
    values += [Decimal(tie.numerator) / Decimal(tie.denominator) for tie in ties]
    expected = [_nearest_units(Fraction(value), grid) for value in values]
    assert _samplers.grid_units(values, grid) == expected


def _laplace_loss(value: Decimal, sensitivity: Decimal, epsilon: Decimal) -> Fraction:
    """The true epsilon of the released value for neighbours ``value`` and ``value +
    sensitivity``: the output is a function of k = units + n (``test_the_release_is_a_
    function_of_k``), n a discrete Laplace of scale t grid units, so its loss is at most
    |Δunits| / t, and exactly that on any output beyond both centres."""
    grid, t = laplace.calibrate({"epsilon": epsilon, "sensitivity": sensitivity}, 1)
    here, there = _samplers.grid_units([value, value + sensitivity], grid)
    return Fraction(abs(there - here), t)


@pytest.mark.parametrize("value", LARGE)
@pytest.mark.parametrize("sensitivity", [Decimal("0.7"), Decimal(1)])
def test_laplace_neighbours_far_from_zero_lose_at_most_epsilon(
    value: Decimal, sensitivity: Decimal
) -> None:
    for sign in (1, -1):
        assert _laplace_loss(sign * value, sensitivity, Decimal(1)) <= 1


@pytest.mark.parametrize("value", LARGE)
def test_gaussian_neighbours_far_from_zero_stay_within_the_calibrated_sensitivity(
    value: Decimal,
) -> None:
    params = {"epsilon": Decimal(1), "delta": Decimal("1e-6"), "sensitivity": Decimal("0.7")}
    grid, sigma2 = gaussian.calibrate(params, 1)
    here, there = _samplers.grid_units([value, value + Decimal("0.7")], grid)
    calibrated = _samplers.grid_l2_sensitivity(Fraction("0.7"), grid, 1)
    assert abs(there - here) <= calibrated
    # the noise keeps the ratio sigma/sensitivity that (epsilon, delta) needs
    assert sigma2 == gaussian.noise_ratio(Fraction(1), Fraction("1e-6")) ** 2 * calibrated**2


@pytest.mark.parametrize(
    ("mechanism", "params", "draw"),
    [
        (
            laplace,
            {"epsilon": Decimal(1), "sensitivity": Decimal(1)},
            lambda source, scale, n: _exact.discrete_laplace(source, 1, scale, n),
        ),
        (
            gaussian,
            {"epsilon": Decimal(1), "delta": Decimal("1e-6"), "sensitivity": Decimal(1)},
            _samplers.discrete_gaussian,
        ),
    ],
)
def test_the_release_is_a_function_of_k(mechanism: Any, params: Any, draw: Any) -> None:
    """run's output is release(grid_units(values) + noise): each output is k rounded once."""
    values = [*LARGE, Decimal("-3.25"), Decimal("1e299")]
    output = mechanism.run(params, {"values": values}, SeededRandomSource(7))
    grid, scale = mechanism.calibrate(params, len(values))
    noise = draw(SeededRandomSource(7), scale, len(values))
    units = _samplers.grid_units(values, grid)
    assert output["values"] == [
        float(Fraction(unit + int(n)) * Fraction(grid))
        for unit, n in zip(units, noise, strict=True)
    ]


def _cell(output: float, grid: float, k: int) -> tuple[int, int]:
    """The integers k' (an interval around ``k``) that ``release`` maps to ``output``, found
    by bisection on the release itself."""
    zero = np.zeros(1, dtype=np.int64)

    def maps_to_output(candidate: int) -> bool:
        return _samplers.release([candidate], zero, grid) == [output]

    def edge(inside: int, step: int) -> int:
        while maps_to_output(inside + step):
            inside, step = inside + step, step * 2
        outside = inside + step
        while abs(outside - inside) > 1:
            middle = (inside + outside) // 2
            inside, outside = (middle, outside) if maps_to_output(middle) else (inside, middle)
        return inside

    return edge(k, -1), edge(k, 1)


def test_released_doubles_near_2_to_the_60_have_the_declared_loss_exactly() -> None:
    """The audit's neighbours 2^60 + 128 and 2^60 + 129 (Laplace, epsilon 1, sensitivity 1):
    the exact probability of each released double under either input, from the discrete
    Laplace's law summed over the integers k that round to it. Before exact snapping the two
    inputs became doubles 2^48 grid units apart: a loss of 256."""
    params = {"epsilon": Decimal(1), "sensitivity": Decimal(1)}
    grid, t = laplace.calibrate(params, 1)
    inputs = [Decimal(2**60 + 128), Decimal(2**60 + 129)]
    centres = _samplers.grid_units(inputs, grid)
    with mpmath.workdps(60):
        r = mpmath.exp(-mpmath.mpf(1) / t)

        def at_least(a: int) -> Any:  # P(n >= a) for a >= 0
            return r**a / (1 + r)

        def mass(centre: int, low: int, high: int) -> Any:
            """P(low <= centre + n <= high) for P(n) = (1 - r) / (1 + r) r^|n|, from the tails
            (no difference of two numbers near 1)."""
            low, high = low - centre, high - centre
            if low >= 0:
                return at_least(low) - at_least(high + 1)
            if high <= 0:
                return at_least(-high) - at_least(-low + 1)
            return 1 - at_least(high + 1) - at_least(-low + 1)

        losses = []
        k = centres[0] - 300 * t
        while k <= centres[1] + 300 * t:
            output = _samplers.release([k], np.zeros(1, dtype=np.int64), grid)[0]
            low, high = _cell(output, grid, k)
            ratio = mass(centres[0], low, high) / mass(centres[1], low, high)
            losses.append(abs(mpmath.log(ratio)))
            k = high + 1
        assert len(losses) >= 4  # released doubles 256 apart, 2^48 grid units: about 256 t
        assert max(losses) <= 1
        assert max(losses) > 1 - mpmath.mpf(10) ** -9  # tight: the cells past both centres


def test_neighbours_near_2_to_the_60_are_not_told_apart(api: Api) -> None:
    """Over HTTP, 128 releases of each of two neighbours: both give both nearby doubles
    (before, each gave only its own: 2^60 or 2^60 + 256, every time)."""
    api.make_dataset(budget={"epsilon": 10})
    seen = []
    for value in (2**60 + 128, 2**60 + 129):
        response = api.charge(
            epsilon=1, params={"epsilon": 1, "sensitivity": 1}, input={"values": [value] * 128}
        )
        assert response.status_code == 201, response.get_json()
        seen.append(set(response.get_json()["output"]["values"]))
    assert seen[0] == seen[1] == {math.ldexp(1, 60), math.ldexp(1, 60) + 256}
