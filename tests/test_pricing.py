"""Pricing: record-level statements scaled by the contribution bounds, and mechanisms without
a sensitivity scaled in their cost (DESIGN.md, Sensitivity)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from accountant.accounting import pricing
from accountant.accounting.loss import LossRule
from accountant.accounting.modes import MODES
from accountant.exact import EPSILON, RHO, Amount
from accountant_plugins.exponential import EXPONENTIAL
from accountant_plugins.laplace import LAPLACE
from accountant_plugins.randomized_response import RANDOMIZED_RESPONSE
from tests.conftest import Api

PARAMS = {"epsilon": Decimal("0.5"), "sensitivity": Decimal("2")}


@pytest.mark.parametrize(
    ("k", "release", "n", "factor"),
    [
        (2, "joint", 3, 3 * 2),  # r * min(k, |P|)
        (5, "joint", 3, 3 * 3),
        (None, "joint", 4, 3 * 4),  # unbounded k: r * |P|
        (2, "parallel", 3, 3),  # r
        (None, "parallel", 4, 3),
    ],
)
def test_a_record_level_sensitivity_is_scaled(
    k: int | None, release: str, n: int, factor: int
) -> None:
    rule = LossRule("user", k)
    priced = pricing.price(
        mechanism=LAPLACE,
        params=PARAMS,
        sensitivity_unit="record",
        mode=MODES["pure"],
        rule=rule,
        max_records=3,
        release=release,
        n=n,
    )
    assert priced.run_params["sensitivity"] == Decimal(2) * factor
    assert priced.cost == Amount(epsilon=EPSILON.cost_units(Fraction(1, 2)))
    unscaled = pricing.price(
        mechanism=LAPLACE,
        params=PARAMS,
        sensitivity_unit=None,
        mode=MODES["pure"],
        rule=rule,
        max_records=3,
        release=release,
        n=n,
    )
    assert unscaled.run_params["sensitivity"] == Decimal(2)


def test_a_mechanism_without_sensitivity_pays_in_its_cost() -> None:
    rule = LossRule("user", 2)
    params = {"epsilon": Decimal("0.5")}
    # randomized response: f independent responses compose, epsilon * f and rho * f
    pure = pricing.price(
        mechanism=RANDOMIZED_RESPONSE,
        params=params,
        sensitivity_unit="record",
        mode=MODES["pure"],
        rule=rule,
        max_records=3,
        release="joint",
        n=3,
    )
    assert pure.cost == Amount(epsilon=EPSILON.cost_units(Fraction(1, 2) * 6))
    zcdp = pricing.price(
        mechanism=RANDOMIZED_RESPONSE,
        params=params,
        sensitivity_unit="record",
        mode=MODES["zcdp"],
        rule=rule,
        max_records=3,
        release="parallel",
        n=3,
    )
    assert zcdp.cost == Amount(rho=RHO.cost_units(Fraction(1, 8) * 3))  # not (1/8) * 3^2
    # a mechanism whose values are not independent pays group privacy: rho * f^2
    from dataclasses import replace

    grouped = replace(EXPONENTIAL, has_sensitivity=False)
    cost = pricing.price(
        mechanism=grouped,
        params={"epsilon": Decimal("0.5"), "sensitivity": Decimal(1)},
        sensitivity_unit="record",
        mode=MODES["zcdp"],
        rule=rule,
        max_records=3,
        release="parallel",
        n=3,
    ).cost
    assert cost == Amount(rho=RHO.cost_units(Fraction(1, 32) * 9))


@pytest.mark.parametrize(("release", "scale"), [("joint", 6.0), ("parallel", 3.0)])
def test_record_level_noise_is_calibrated_end_to_end(api: Api, release: str, scale: float) -> None:
    """The noise actually drawn has the scaled scale: r * min(k, |P|) = 6 for a joint release
    over 3 partitions with k = 2 and r = 3, and r = 3 for a parallel one (Laplace scale
    6/epsilon vs 1/epsilon without the scaling: standard deviations 8.5 against 1.4)."""
    api.make_dataset(
        privacy_unit="user",
        max_partitions_per_user=2,
        max_records_per_user=3,
        budget={"epsilon": 10},
    )
    response = api.charge(
        partitions=["a", "b", "c"],
        release=release,
        input={"size": 4000},
        params={"epsilon": 1, "sensitivity": 1, "sensitivity_unit": "record"},
    )
    assert response.status_code == 201, response.get_json()
    noise = np.array(response.get_json()["output"]["noise"])
    assert abs(noise.std() / (scale * np.sqrt(2)) - 1) < 0.1
