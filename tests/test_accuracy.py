"""Every grant, preview and plan states the mechanism's accuracy, and each half-width is the
exact one, checked against an independent computation of the law actually sampled."""

from __future__ import annotations

import math
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

import mpmath
import pytest
from jsonschema import Draft202012Validator
from scipy import stats

from accountant.mechanism import Accuracy
from accountant.plugins import MechanismRegistry, make_plugin_manager
from accountant.services import charge_responses
from accountant_plugins import (
    _samplers,
    discrete_gaussian,
    discrete_laplace,
    exponential,
    gaussian,
    laplace,
    randomized_response,
)
from tests.conftest import Api
from tests.test_mechanisms import CASES

REGISTRY = MechanismRegistry(*make_plugin_manager())
_BUDGET = {"epsilon": 10, "delta": 1e-5}


def _body(name: str, **extra: Any) -> dict[str, Any]:
    _mode, params, data, _key = CASES[name]
    return {
        "dataset": "clicks",
        "partitions": ["p1"],
        "mechanism": name,
        "params": params,
        "input": data,
        **extra,
    }


def _dataset(api: Api, name: str) -> None:
    mode = CASES[name][0]
    api.make_dataset(accounting=mode, budget=_BUDGET if mode != "pure" else {"epsilon": 10})


def _schema(api: Api, name: str) -> Draft202012Validator:
    """The document's response schema ``name``, its references resolved in the document."""
    document = api.get("/openapi.json").get_json()
    schema = {**document["components"]["schemas"][name], "components": document["components"]}
    return Draft202012Validator(schema)


@pytest.mark.parametrize("name", sorted(CASES))
def test_grant_preview_and_plan_state_the_same_accuracy(api: Api, name: str) -> None:
    """The three answers carry the mechanism's own statement, for the parameters and input
    shape of the request, in the document's schema; a retry repeats it byte for byte."""
    _dataset(api, name)
    body = _body(name)
    preview = api.post("/v1/charges/preview", body)
    plan = api.post("/v1/charges/plan", body)
    charge = api.post("/v1/charges", body, headers={"Idempotency-Key": "a"})
    assert (preview.status_code, plan.status_code, charge.status_code) == (200, 200, 201)
    stated = charge.get_json()["accuracy"]
    assert stated is not None and stated["confidence"] == 0.95
    assert preview.get_json()["accuracy"] == plan.get_json()["accuracy"] == stated
    mechanism = REGISTRY.get(name)
    assert mechanism is not None and mechanism.accuracy is not None
    _mode, params, data, _key = CASES[name]
    own = mechanism.accuracy({k: Decimal(str(v)) for k, v in params.items()}, data)
    assert own is not None and stated["kind"] == own.kind
    if own.half_width is not None:
        assert stated["half_width_95"] == pytest.approx(float(own.half_width), rel=1e-15)
    for answer, schema in ((charge, "Charge"), (preview, "Preview"), (plan, "Plan")):
        _schema(api, schema).validate(answer.get_json())
    again = api.post("/v1/charges", body, headers={"Idempotency-Key": "a"})
    assert again.text == charge.text


def _same_shape(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every value replaced, its shape (lengths, categories) kept."""
    if "utilities" in data:
        return {"utilities": [7] * len(data["utilities"])}
    if "categories" in data or any(isinstance(v, bool) for v in data["values"]):
        return {**data, "values": [None] * len(data["values"])}
    return {"values": [0] * len(data["values"])}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_accuracy_depends_on_the_input_shape_not_its_values(name: str) -> None:
    """It is published with the release: it may not reveal the private values."""
    mechanism = REGISTRY.get(name)
    assert mechanism is not None and mechanism.accuracy is not None
    _mode, params, data, _key = CASES[name]
    decimals = {k: Decimal(str(v)) for k, v in params.items()}
    assert mechanism.accuracy(decimals, data) == mechanism.accuracy(decimals, _same_shape(data))


def test_a_mechanism_that_states_no_accuracy_is_answered_with_null(api: Api) -> None:
    api.make_dataset()
    body = {
        "dataset": "clicks",
        "partitions": ["p1"],
        "mechanism": "bounded_sum",
        "params": {"epsilon": 0.5, "lower": 0, "upper": 10},
        "input": {"values": [1, 2]},
    }
    for path in ("/v1/charges/preview", "/v1/charges/plan", "/v1/charges"):
        answer = api.post(path, body).get_json()
        assert "accuracy" in answer and answer["accuracy"] is None, path


def test_the_accuracy_is_that_of_the_scaled_sensitivity(api: Api) -> None:
    """A record-level sensitivity is scaled before the mechanism runs: the stated scale is
    the scaled one (r = 3 records per user, parallel: Δ = 3, epsilon 0.5, b = 6)."""
    api.make_dataset(
        privacy_unit="user",
        max_partitions_per_user=2,
        max_records_per_user=3,
        budget={"epsilon": 10},
    )
    body = {
        **_body("discrete_laplace"),
        "release": "parallel",
        "params": {"epsilon": 0.5, "sensitivity": 1, "sensitivity_unit": "record"},
    }
    stated = api.post("/v1/charges", body).get_json()["accuracy"]
    assert stated["scale"] == 6
    assert stated["half_width_95"] == _smallest_laplace_w(Fraction(6))


def test_plans_with_count_state_the_accuracy_of_the_parameter_they_propose(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    body = {k: v for k, v in _body("laplace").items() if k != "input"}
    answer = api.post("/v1/charges/plan", {**body, "params": {"sensitivity": 1}, "count": 20})
    assert answer.get_json()["params"] == {"epsilon": 0.05}
    stated = answer.get_json()["accuracy"]
    # b = 1/0.05 = 20 with the grid's slack: (2^36 + 1)/0.05 units of 2^-36, 20 (1 + 2^-36)
    assert stated["scale"] == 20 * (1 + 2**-36)
    assert stated["half_width_95"] == pytest.approx(20 * math.log(20), rel=1e-9)


def test_a_solved_sigma_states_its_half_width(api: Api) -> None:
    api.make_dataset(accounting="zcdp", budget={"epsilon": 1, "delta": 1e-6, "rho": 0.08})
    body = {k: v for k, v in _body("gaussian").items() if k != "input"}
    answer = api.post("/v1/charges/plan", {**body, "params": {"sensitivity": 1}, "count": 4})
    assert answer.get_json()["params"] == {"sigma": 5.0}
    stated = answer.get_json()["accuracy"]
    assert stated["scale"] == pytest.approx(5, rel=2**-38)
    assert stated["half_width_95"] == pytest.approx(5 * stats.norm.ppf(0.975), rel=1e-9)


def test_what_the_input_shape_decides_is_null_without_input(api: Api) -> None:
    api.make_dataset()
    for name in ("exponential", "randomized_response"):
        body = {k: v for k, v in _body(name).items() if k != "input"}
        stated = api.post("/v1/charges/preview", body).get_json()["accuracy"]
        assert stated["kind"] in ("utility_gap", "randomized_response")
        assert stated["half_width_95"] is None
        assert "candidates" not in stated and "probability_true" not in stated


# Independent computations of the laws actually sampled.


def _laplace_mass(b: Fraction, w: int) -> mpmath.mpf:
    """P(|Y| <= w) for P(y) proportional to exp(-|y|/b), summing the pmf term by term and
    normalising by the sum (no closed form)."""
    with mpmath.workdps(40):
        rate = 1 / (mpmath.mpf(b.numerator) / b.denominator)
        top = int(120 / rate) + w + 10
        weights = [mpmath.exp(-rate * y) for y in range(top)]
        total = weights[0] + 2 * mpmath.fsum(weights[1:])
        inside = weights[0] + 2 * mpmath.fsum(weights[1 : w + 1])
        return inside / total


def _smallest_laplace_w(b: Fraction) -> int:
    w = 0
    while _laplace_mass(b, w) < mpmath.mpf("0.95"):
        w += 1
    return w


@pytest.mark.parametrize(
    ("epsilon", "sensitivity"),
    [("0.5", "1"), ("1", "1"), ("2", "1"), ("0.1", "3"), ("0.7", "2"), ("5", "1"), ("0.05", "1")],
)
def test_the_discrete_laplace_half_width_is_the_smallest(epsilon: str, sensitivity: str) -> None:
    params = {"epsilon": Decimal(epsilon), "sensitivity": Decimal(sensitivity)}
    stated = discrete_laplace.accuracy(params, None)
    b = Fraction(sensitivity) / Fraction(epsilon)
    assert stated.exact and stated.scale == b and stated.grid == 1
    assert stated.half_width == _smallest_laplace_w(b)


def _gaussian_mass(sigma2: Fraction, w: int) -> mpmath.mpf:
    """P(|Y| <= w) for the discrete Gaussian, summing the pmf over |y| < 40 sigma."""
    with mpmath.workdps(40):
        s2 = mpmath.mpf(sigma2.numerator) / sigma2.denominator
        top = int(40 * mpmath.sqrt(s2)) + w + 10
        weights = [mpmath.exp(-(mpmath.mpf(y) ** 2) / (2 * s2)) for y in range(top)]
        total = weights[0] + 2 * mpmath.fsum(weights[1:])
        return (weights[0] + 2 * mpmath.fsum(weights[1 : w + 1])) / total


@pytest.mark.parametrize(
    "params",
    [
        {"sigma": "0.3", "sensitivity": "1"},
        {"sigma": "1", "sensitivity": "1"},
        {"sigma": "4", "sensitivity": "1"},
        {"sigma": "15.9", "sensitivity": "1"},  # summed directly
        {"sigma": "16.1", "sensitivity": "1"},  # Euler-Maclaurin
        {"sigma": "123.4", "sensitivity": "1"},
        {"rho": "0.0001", "sensitivity": "3"},  # sigma = 212.1
        {"epsilon": "1", "delta": "1e-6", "sensitivity": "1"},
    ],
)
def test_the_discrete_gaussian_half_width_is_the_smallest(params: dict[str, str]) -> None:
    decimals = {k: Decimal(v) for k, v in params.items()}
    sampled = _samplers.sampled_sigma2(discrete_gaussian.calibrate(decimals))
    stated = discrete_gaussian.accuracy(decimals, None)
    assert stated.exact and stated.grid == 1
    assert float(stated.scale or 0) == pytest.approx(math.sqrt(sampled), rel=1e-15)
    w = int(stated.half_width or 0)
    assert _gaussian_mass(sampled, w) >= mpmath.mpf("0.95")
    assert w == 0 or _gaussian_mass(sampled, w - 1) < mpmath.mpf("0.95")


@pytest.mark.parametrize(("epsilon", "sensitivity", "d"), [("0.5", "1", 1), ("0.1", "7", 5)])
def test_the_grid_laplace_half_width_is_the_smallest(
    epsilon: str, sensitivity: str, d: int
) -> None:
    """Noise g Y with Y a discrete Laplace of t grid units (t near 2^40: too many terms to
    sum), checked with the geometric tail P(|Y| > w) = 2 q^(w+1)/(1 + q) at 60 digits, and
    against the continuous Laplace quantile b ln 20 (scipy) within two grid units."""
    params = {"epsilon": Decimal(epsilon), "sensitivity": Decimal(sensitivity)}
    data = {"values": [1.0] * d}
    grid, t = laplace.calibrate(params, d)
    stated = laplace.accuracy(params, data)
    g = Fraction(grid)
    assert stated.exact and stated.grid == g and stated.scale == t * g
    w = Fraction(stated.half_width or 0) / g
    assert w.denominator == 1
    with mpmath.workdps(60):
        q = mpmath.exp(-1 / mpmath.mpf(t))

        def outside(k: int) -> mpmath.mpf:
            return 2 * q ** (k + 1) / (1 + q)

        assert outside(int(w)) <= mpmath.mpf("0.05") < outside(int(w) - 1)
    b = float(Fraction(sensitivity) / Fraction(epsilon))
    # the grid's slack: d units of g <= b 2^-40 over Δ/g units, a relative d 2^-40/epsilon
    assert b <= float(stated.scale or 0) <= b * (1 + d * 2**-39 / float(epsilon))
    continuous = stats.laplace.ppf(0.975, scale=float(t * g))
    assert abs(float(stated.half_width or 0) - continuous) <= 2 * grid


@pytest.mark.parametrize(
    "params",
    [
        {"epsilon": "0.5", "delta": "1e-6", "sensitivity": "1"},
        {"sigma": "3", "sensitivity": "2"},
        {"rho": "0.02", "sensitivity": "1"},
    ],
)
def test_the_grid_gaussian_half_width_is_the_smallest(params: dict[str, str]) -> None:
    """Noise g Y with Y a discrete Gaussian of sigma near 2^40 grid units: P(|Y| <= w) is
    erf((w + 1/2)/(sigma sqrt 2)) to within 10^-20 (the midpoint rule's error is of order
    sigma^-2, the normaliser's exp(-2 pi^2 sigma^2)), and w is on the right side of 0.95
    by more than that; and the continuous quantile 1.96 sigma (scipy) is within two grid
    units."""
    decimals = {k: Decimal(v) for k, v in params.items()}
    grid, sigma2 = gaussian.calibrate(decimals, 1)
    sampled = _samplers.sampled_sigma2(sigma2)
    stated = gaussian.accuracy(decimals, None)
    g = Fraction(grid)
    assert stated.exact and stated.grid == g
    w = Fraction(stated.half_width or 0) / g
    assert w.denominator == 1
    with mpmath.workdps(60):
        sigma = mpmath.sqrt(mpmath.mpf(sampled.numerator) / sampled.denominator)

        def inside(k: int) -> mpmath.mpf:
            return mpmath.erf((k + mpmath.mpf(1) / 2) / (sigma * mpmath.sqrt(2)))

        tolerance = mpmath.mpf(10) ** -20
        assert inside(int(w)) - mpmath.mpf("0.95") > tolerance
        assert mpmath.mpf("0.95") - inside(int(w) - 1) > tolerance
        assert float(stated.scale or 0) == pytest.approx(float(sigma * mpmath.mpf(grid)))
    continuous = stats.norm.ppf(0.975, scale=float(stated.scale or 0))
    assert abs(float(stated.half_width or 0) - continuous) <= 2 * grid


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1000])
def test_the_exponential_gap_bound_holds_for_the_implemented_law(n: int) -> None:
    """(2Δ/ε') ln(20 (n - 1)) with ε' = ε (1 - 2^-20); the implemented law (its rounded,
    capped exponents, exactly) puts at most 5% on candidates that far from the best, with
    the n - 1 others at exactly that gap (the worst case) or spread below and above it."""
    epsilon, sensitivity = Fraction(1, 2), Fraction(3)
    params = {"epsilon": Decimal("0.5"), "sensitivity": Decimal(3)}
    stated = exponential.accuracy(params, {"utilities": [0] * n})
    scale = 2 * sensitivity / (epsilon * (1 - Fraction(1, 2**20)))
    assert stated.scale == scale and stated.candidates == n and stated.kind == "utility_gap"
    gap = Fraction(stated.half_width or 0)
    assert float(gap) == pytest.approx(
        0 if n == 1 else float(scale) * math.log(20 * (n - 1)), rel=1e-12
    )
    spread = [gap * Fraction(i, n) * 2 for i in range(1, n)]
    for others in ([gap] * (n - 1), spread):
        utilities = [Fraction(0)] + [-u for u in others]
        numerators, denominator = exponential.exponents(epsilon, sensitivity, utilities)
        with mpmath.workdps(40):
            weights = [mpmath.exp(-mpmath.mpf(k) / denominator) for k in numerators]
            # P(gap >= c); a single candidate (c = 0) is never off the best
            far = mpmath.fsum(
                w for w, u in zip(weights, utilities, strict=True) if -u >= gap and -u > 0
            )
            assert far / mpmath.fsum(weights) <= mpmath.mpf("0.05")


@pytest.mark.parametrize(
    ("epsilon", "k", "expected"),
    [
        ("1", 2, 1 - math.exp(-1) / 2),  # docs/mechanisms.md's table: 0.8161
        ("2", 5, 1 - 4 * math.exp(-2) / 5),  # 0.8917
        ("0.5", 5, math.exp(0.5) / 5),  # e^epsilon <= k - 1: e^epsilon / k
        ("3", 2, 1 - math.exp(-3) / 2),
    ],
)
def test_randomized_response_states_the_probability_of_the_truth(
    epsilon: str, k: int, expected: float
) -> None:
    categories = [f"c{i}" for i in range(k)]
    data = {"values": ["c0"], "categories": categories} if k > 2 else {"values": [True]}
    stated = randomized_response.accuracy({"epsilon": Decimal(epsilon)}, data)
    assert stated.categories == k and stated.exact
    p = Fraction(stated.probability_true or 0)
    assert float(p) == pytest.approx(expected, rel=1e-12)


def test_figures_are_rounded_to_the_safe_side_and_a_failure_states_nothing() -> None:
    third = Fraction(1, 3)
    shown = charge_responses.as_json(
        Accuracy("randomized_response", "x", third, third, True, probability_true=third)
    )
    assert Fraction(shown["half_width_95"]) > third > Fraction(shown["probability_true"])
    assert shown["scale"] == 1 / 3  # the nearest double
    huge = Accuracy("additive_noise", "x", 10**400, None, False)
    assert charge_responses.as_json(huge)["scale"] is None
    mechanism = REGISTRY.get("laplace")
    assert mechanism is not None

    def broken(params: Any, data: Any) -> Accuracy:
        raise ZeroDivisionError

    assert charge_responses.accuracy(replace(mechanism, accuracy=broken), {}, None) is None
