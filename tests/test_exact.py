"""Exact arithmetic: integer units, costs rounded up, limits rounded down, no binary floats."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from accountant.accounting.modes import epsilon_of_rho, rho_by_bun_steinke, rho_limit
from accountant.exact import DELTA, EPSILON, RHO
from accountant.jsonio import JSONInputError, RefusedValue, loads
from tests.conftest import Api


def test_ten_charges_of_a_tenth_fill_one_exactly(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    for _ in range(10):
        assert api.charge(epsilon=0.1).status_code == 201
    budget = api.budget()
    assert budget["loss"]["epsilon"] == 1.0
    assert budget["remaining"]["epsilon"] == 0
    assert api.charge(epsilon=0.000000001).status_code == 409


def test_a_tenth_and_a_fifth_fit_in_three_tenths(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 0.3})
    assert api.charge(epsilon=0.1).status_code == 201
    assert api.charge(epsilon=0.2).status_code == 201
    assert api.budget()["remaining"]["epsilon"] == 0


def test_a_thousand_thousandths_fill_one(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    granted = sum(api.charge(epsilon=0.001).status_code == 201 for _ in range(1001))
    assert granted == 1000


def test_no_positive_cost_is_stored_as_zero(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    response = api.charge(epsilon=1e-15)
    assert response.status_code == 201
    # 1e-15 rounds up to one unit, 1e-9, never down to zero
    assert response.get_json()["cost"]["epsilon"] == 1e-9
    assert api.budget()["loss"]["epsilon"] == 1e-9


def test_rounding_is_outward() -> None:
    assert EPSILON.cost_units(Decimal("0.1")) == 100_000_000
    assert EPSILON.cost_units(Decimal("1e-12")) == 1
    assert EPSILON.limit_units(Decimal("1e-12")) == 0
    assert EPSILON.cost_units(0.1) == 100_000_001  # the double 0.1 is a little above 1/10
    assert EPSILON.limit_units(0.1) == 100_000_000
    assert DELTA.cost_units(Decimal("1e-6")) == 10**12
    assert RHO.cost_units(Fraction(1, 3)) == 333_333_333_334
    assert EPSILON.to_decimal(1_500_000_000) == Decimal("1.5")
    for bad in (Decimal("NaN"), Decimal("Infinity"), float("inf"), -1):
        with pytest.raises(ValueError):
            EPSILON.cost_units(bad)


def test_json_numbers_are_decimals_and_specials_are_refused() -> None:
    assert loads('{"e": 0.1}') == {"e": Decimal("0.1")}
    assert loads('{"e": 1e400}')["e"] == Decimal("1e400")  # huge but bounded: stays exact
    for text in ('{"e": NaN}', '{"e": Infinity}', '{"e": -Infinity}', '{"e": 1, "e": 2}'):
        with pytest.raises(JSONInputError):
            loads(text)
    with pytest.raises(RefusedValue) as refused:
        loads('{"a": [1, {"e": -Infinity}]}')
    assert refused.value.field == "a.1.e" and "-Infinity" in refused.value.message


def test_zcdp_conversions_round_toward_privacy() -> None:
    # the classic rho for (epsilon, delta) = (1, 1e-6): (sqrt(ln 1e6 + 1) - sqrt(ln 1e6))^2
    import math

    expected = (math.sqrt(math.log(1e6) + 1) - math.sqrt(math.log(1e6))) ** 2
    classic = rho_by_bun_steinke(Decimal(1), Decimal("1e-6"))
    assert classic <= expected * 10**12 < classic + 2
    # the enforced limit (CKS20) is larger, rounded down to a rho unit
    units = rho_limit(Decimal(1), Decimal("1e-6"))
    assert units == 24355970359 > classic
    # and back: the epsilon of that rho is at most 1 (rounded up to an epsilon unit)
    assert epsilon_of_rho(units, 10**12) <= Decimal(1)
    assert epsilon_of_rho(units + 10**6, 10**12) > Decimal(1)
