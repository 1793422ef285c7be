"""Every built-in mechanism end to end, their output laws, and zCDP accounting."""

from __future__ import annotations

import importlib.metadata
import math
from collections import Counter
from decimal import Decimal
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import pytest
from scipy import stats

from accountant.exact import EPSILON
from accountant.plugins import MechanismRegistry, make_plugin_manager
from accountant.randomness import SeededRandomSource
from accountant_plugins import exponential, gaussian, randomized_response
from tests.conftest import Api

# name -> (dataset accounting, params, input, output key)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "laplace": ("pure", {"epsilon": 0.5, "sensitivity": 1}, {"values": [1.5, 2.5]}, "values"),
    "discrete_laplace": ("pure", {"epsilon": 0.5, "sensitivity": 1}, {"values": [3, 4]}, "values"),
    "gaussian": (
        "approx",
        {"epsilon": 0.5, "delta": 1e-6, "sensitivity": 1},
        {"values": [1.5, 2.5]},
        "values",
    ),
    "discrete_gaussian": ("zcdp", {"sigma": 4, "sensitivity": 1}, {"values": [3, 4]}, "values"),
    "exponential": ("pure", {"epsilon": 0.5, "sensitivity": 1}, {"utilities": [1, 5, 2]}, "index"),
    "randomized_response": ("pure", {"epsilon": 0.5}, {"values": [True, False]}, "values"),
}
#: Accounting-only mechanisms (no run; they price holds): name -> (dataset accounting, params).
ACCOUNTING_ONLY: dict[str, tuple[str, dict[str, Any]]] = {
    "subsampled_gaussian": (
        "rdp",
        {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 100, "sensitivity": 1},
    ),
}


def test_every_builtin_mechanism_has_a_case() -> None:
    builtins = {
        ep.name
        for ep in importlib.metadata.entry_points(group="accountant")
        if ep.value.startswith("accountant_plugins.")
    }
    registry = MechanismRegistry(*make_plugin_manager())
    listed = {m.name: m.runs for m in registry.all() if m.plugin in builtins}
    assert listed == {name: True for name in CASES} | {name: False for name in ACCOUNTING_ONLY}


@pytest.mark.parametrize("name", sorted(ACCOUNTING_ONLY))
def test_an_accounting_only_mechanism_is_listed_as_such_and_never_charged(
    api: Api, name: str
) -> None:
    accounting, params = ACCOUNTING_ONLY[name]
    api.make_dataset(accounting=accounting, budget={"epsilon": 10, "delta": 1e-5})
    listed = {m["name"]: m for m in api.get("/v1/mechanisms").get_json()["mechanisms"]}
    assert listed[name]["runs"] is False and listed["laplace"]["runs"] is True
    body = {"dataset": "clicks", "partitions": ["p1"], "mechanism": name, "params": params}
    for path in ("/v1/charges", "/v1/charges/preview", "/v1/charges/plan"):
        response = api.post(path, {**body, "input": {}})
        assert response.status_code == 400, (path, response.get_json())
        [error] = response.get_json()["errors"]
        assert error["field"] == "mechanism" and "accounting-only" in error["message"]
    assert api.ledger() == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_mechanism_charges_then_runs(api: Api, name: str) -> None:
    accounting, params, data, key = CASES[name]
    budget = {"epsilon": 10, "delta": 1e-5} if accounting != "pure" else {"epsilon": 10}
    api.make_dataset(accounting=accounting, budget=budget)
    listed = {m["name"]: m for m in api.get("/v1/mechanisms").get_json()["mechanisms"]}
    assert accounting in listed[name]["accounting"] and listed[name]["plugin"] == name
    response = api.charge(mechanism=name, params=params, input=data)
    assert response.status_code == 201, response.get_json()
    output = response.get_json()["output"]
    assert key in output
    if isinstance(output[key], list):
        assert len(output[key]) == len(data["values"])
    entry = api.ledger()[0]
    assert entry["mechanism"] == name and entry["status"] == "granted"


def test_raw_noise_states_its_grid_and_values_lie_on_it(api: Api) -> None:
    api.make_dataset()
    out = api.charge(
        params={"epsilon": 0.5, "sensitivity": 1}, input={"values": [0.1, 1 / 3]}
    ).get_json()["output"]
    raw = api.charge(params={"epsilon": 0.5, "sensitivity": 1}, input={"size": 1000}).get_json()[
        "output"
    ]
    grid = raw["grid"]
    assert grid == 2.0 ** math.floor(math.log2(2.0 * 2**-40))
    for value in out["values"] + raw["noise"]:
        assert (value / grid).is_integer()
    assert 1.0 < float(np.std(raw["noise"])) < 4.5  # Laplace scale 2: sd 2.83


@pytest.mark.parametrize("name", ["laplace", "discrete_laplace", "gaussian", "discrete_gaussian"])
def test_every_additive_mechanism_states_the_grid_of_its_raw_noise(api: Api, name: str) -> None:
    """API.md: ``{"size": n}`` returns ``{"noise": [...], "grid": g}`` for each additive
    mechanism; an integer mechanism's grid is 1."""
    accounting, params, _, _ = CASES[name]
    budget = {"epsilon": 10} if accounting == "pure" else {"epsilon": 10, "delta": 1e-5}
    api.make_dataset(accounting=accounting, budget=budget)
    response = api.charge(mechanism=name, params=params, input={"size": 50})
    assert response.status_code == 201, response.get_json()
    output = response.get_json()["output"]
    assert set(output) == {"noise", "grid"} and len(output["noise"]) == 50
    if name.startswith("discrete_"):
        assert output["grid"] == 1
        assert all(isinstance(value, int) for value in output["noise"])
    assert all((value / output["grid"]).is_integer() for value in output["noise"])


def test_a_discrete_gaussian_epsilon_too_small_for_its_delta_names_the_least_one(
    api: Api,
) -> None:
    """API.md: a request a mechanism cannot run is a 400 naming the parameter and the usable
    range. At delta 1e-6, rho + 2 sqrt(rho ln(1/delta)) at rho's least unit (1e-12) is
    7.43e-6: 0.00000744 is the least 3-digit epsilon that leaves any rho, and it runs."""
    api.make_dataset(accounting="approx", budget={"epsilon": 1, "delta": 1e-5})
    params = {"epsilon": 1e-6, "delta": 1e-6, "sensitivity": 1}
    refused = api.charge(mechanism="discrete_gaussian", params=params, input={"values": [3]})
    assert refused.status_code == 400
    assert refused.get_json()["errors"][0]["field"] == "params.epsilon"
    assert "at this delta the least epsilon is 0.00000744" in refused.get_json()["detail"]
    for epsilon, status in ((7.43e-6, 400), (7.44e-6, 201)):
        params["epsilon"] = epsilon
        reply = api.charge(mechanism="discrete_gaussian", params=params, input={"values": [3]})
        assert reply.status_code == status, reply.get_json()


def test_zcdp_accounting(api: Api) -> None:
    api.make_dataset(accounting="zcdp", budget={"epsilon": 1, "delta": 1e-6})
    limit = api.budget()["limit"]
    expected = 0.024355970359  # max over alpha of B(alpha)/alpha (tests/test_zcdp_conversion)
    assert limit["rho"] == pytest.approx(expected, abs=1e-12) and limit["delta"] == 1e-6
    # laplace at epsilon 0.1 costs rho = 0.1^2 / 2 = 0.005
    charged = api.charge(params={"epsilon": 0.1, "sensitivity": 1}).get_json()
    assert charged["cost"]["rho"] == 0.005
    # a gaussian with sigma 10 and sensitivity 1 costs rho = 1 / 200 = 0.005
    charged = api.charge(mechanism="gaussian", params={"sigma": 10, "sensitivity": 1})
    assert charged.get_json()["cost"]["rho"] == 0.005
    budget = api.budget()
    assert budget["loss"]["rho"] == 0.01
    # CKS20: min over alpha of 0.01 alpha + ln((alpha-1)/alpha) - (ln 1e-6 + ln alpha)/(alpha-1)
    eps = min(
        0.01 * a + math.log((a - 1) / a) - (math.log(1e-6) + math.log(a)) / (a - 1)
        for a in (1 + i / 1000 for i in range(1, 200_000))
    )
    assert budget["loss"]["epsilon"] == pytest.approx(eps, abs=1e-6)
    assert budget["loss"]["epsilon"] >= eps - 1e-9
    assert budget["remaining"]["rho"] == pytest.approx(expected - 0.01, abs=1e-12)
    # the exponential mechanism uses its tighter epsilon^2 / 8
    charged = api.charge(
        mechanism="exponential",
        params={"epsilon": 0.2, "sensitivity": 1},
        input={"utilities": [1, 2]},
    ).get_json()
    assert charged["cost"]["rho"] == 0.005
    refused = api.charge(
        mechanism="gaussian", params={"epsilon": 0.5, "delta": 1e-6, "sensitivity": 1}
    )
    assert refused.status_code == 400 and "sigma or rho" in refused.get_json()["detail"]


def test_mode_refusals_are_clear(api: Api) -> None:
    api.make_dataset(accounting="pure")
    api.make_dataset("approx", accounting="approx", budget={"epsilon": 1, "delta": 1e-6})
    refused = api.charge(
        mechanism="discrete_gaussian", params={"sigma": 3, "sensitivity": 1}, input={"values": [1]}
    )
    assert refused.status_code == 400 and refused.get_json()["errors"][0]["field"] == "mechanism"
    refused = api.charge(
        dataset="approx", mechanism="gaussian", params={"sigma": 3, "sensitivity": 1}
    )
    assert refused.status_code == 400
    unknown = api.charge(
        mechanism="randomized_response",
        params={"epsilon": 1},
        input={"values": ["x"], "categories": ["a", "b"]},
    )
    assert unknown.status_code == 400 and api.ledger(dataset="clicks") == []


def _reference_sigma(epsilon: float, delta: float) -> mpmath.mpf:
    """Balle and Wang's analytic calibration, solved independently at 50 digits (a binary64
    solution loses the answer to cancellation at small epsilon)."""
    with mpmath.workdps(50):
        eps, target = mpmath.mpf(epsilon), mpmath.mpf(delta)

        def excess(sigma: mpmath.mpf) -> mpmath.mpf:
            a, b = 1 / (2 * sigma), eps * sigma
            return mpmath.ncdf(a - b) - mpmath.exp(eps) * mpmath.ncdf(-a - b) - target

        low, high = mpmath.mpf(10) ** -6, mpmath.mpf(10) ** 12
        assert excess(low) > 0 > excess(high)
        for _ in range(200):  # the excess falls as sigma grows
            middle = mpmath.sqrt(low * high)
            low, high = (middle, high) if excess(middle) > 0 else (low, middle)
        return high


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    [(1.0, 1e-5), (0.5, 1e-6), (3.0, 1e-9), (0.1, 1e-3), (1e-3, 1e-9), (1e-9, 1e-16)],
)
def test_analytic_gaussian_matches_an_independent_solution(epsilon: float, delta: float) -> None:
    """Never below the exact optimum, and within 10^-12 of it: at (1e-9, 1e-16) the binary64
    calibration was 3.6e-5 too small in delta."""
    sigma = gaussian.analytic_sigma(epsilon, delta, 1.0)
    reference = _reference_sigma(epsilon, delta)
    assert reference <= sigma <= reference * (1 + 1e-12)
    classical = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    if epsilon <= 1:
        assert sigma < classical  # tighter than the textbook bound, where that bound holds


def test_analytic_gaussian_published_value() -> None:
    # Balle and Wang (2018), Figure/Table: epsilon = 1, delta = 1e-5 needs sigma of about 3.73
    # against 4.84 for the classical calibration.
    assert gaussian.analytic_sigma(1.0, 1e-5, 1.0) == pytest.approx(3.73, abs=0.01)


def test_exponential_selects_with_the_exact_probabilities() -> None:
    utilities = [Fraction(0), Fraction(1), Fraction(3), Fraction(3)]
    epsilon, n = Fraction(1), 6_000
    source = SeededRandomSource(21)
    counts = Counter(
        exponential.run({"epsilon": epsilon, "sensitivity": 1}, {"utilities": utilities}, source)[
            "index"
        ]
        for _ in range(n)
    )
    weights = [math.exp(float(epsilon * u / 2)) for u in utilities]
    expected = [w / sum(weights) * n for w in weights]
    assert stats.chisquare([counts[i] for i in range(4)], expected).pvalue > 1e-4


def test_randomized_response_draws_the_law_of_its_coins() -> None:
    """The sampler answers a member with a value as ``coins`` says (the law the exact loss
    test below checks): the truth with probability λ + (1 - λ)/k, λ = w (1 - e^-x), and every
    other category with (1 - λ)/k; an absent member uniformly."""
    source = SeededRandomSource(22)
    for k, epsilon in ((2, Fraction(1)), (5, Fraction(1, 2)), (5, Fraction(2))):
        law = randomized_response.coins(epsilon, k)
        kept = float(law.weight) * (1 - math.exp(-float(law.exponent)))
        for truth, expected in (
            (0, [kept + (1 - kept) / k] + [(1 - kept) / k] * (k - 1)),
            (-1, [1 / k] * k),
        ):
            answers = randomized_response.respond(
                source, np.full(200_000, truth, dtype=np.int64), k, epsilon
            )
            counts = np.bincount(answers, minlength=k)
            assert stats.chisquare(counts, np.array(expected) * answers.size).pvalue > 1e-4


#: Epsilons on both sides of e^ε = k - 1 (ln 2 = 0.6931471805..., ln 4 = 1.3862943611...).
RR_EPSILONS = ["0.001", "0.1", "0.5", "1", "2", "5", "30"]
RR_EPSILONS += ["0.693147180", "0.693147181", "1.386294360", "1.386294361"]


def _roster_loss(epsilon: Fraction, k: int) -> mpmath.mpf:
    """The add/remove loss of the sampler's law for one member: the largest |ln| of the ratio
    of each answer's probability with the member's value and without (uniform), computed at
    60 digits from the coins the sampler draws."""
    law = randomized_response.coins(epsilon, k)
    with mpmath.workdps(60):
        exponent = mpmath.mpf(law.exponent.numerator) / law.exponent.denominator
        weight = mpmath.mpf(law.weight.numerator) / law.weight.denominator
        kept = weight * (1 - mpmath.exp(-exponent))
        present = [kept + (1 - kept) / k] + [(1 - kept) / k] * (k - 1)
        absent = [mpmath.mpf(1) / k] * k
        assert abs(mpmath.fsum(present) - 1) < mpmath.mpf(10) ** -55
        return max(abs(mpmath.log(p / q)) for p, q in zip(present, absent, strict=True))


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("epsilon", RR_EPSILONS)
def test_randomized_response_loses_exactly_its_charge(k: int, epsilon: str) -> None:
    """A member's value against the same member absent (add/remove neighbours): the loss of
    the law the sampler draws is at most the charged epsilon and within 10^-9 of it."""
    charged = Fraction(EPSILON.cost_units(Decimal(epsilon)), EPSILON.scale)
    loss = _roster_loss(Fraction(Decimal(epsilon)), k)
    with mpmath.workdps(60):
        bound = mpmath.mpf(charged.numerator) / charged.denominator
        assert loss <= bound + mpmath.mpf(10) ** -50, (k, epsilon, loss)
        assert loss >= bound * (1 - mpmath.mpf(10) ** -9), (k, epsilon, loss)


def test_grid_gaussian_follows_the_normal_law() -> None:
    source = SeededRandomSource(23)
    noise = np.array(
        gaussian.run({"sigma": 4, "sensitivity": 1}, {"size": 200_000}, source)["noise"]
    )
    # sigma is inflated by the grid slack (ceil(1/g) + 1) g, a factor 1 + 2^-40 or so
    assert stats.kstest(noise / 4, "norm").pvalue > 1e-4
    assert abs(noise.std() / 4 - 1) < 0.01


@pytest.mark.parametrize("d", [1, 10, 100_000])
def test_grid_rounding_is_paid_for_per_coordinate(d: int) -> None:
    """Rounding d values to the grid moves them up to d grid units apart in L1 and sqrt(d) in
    L2, so the noise must be calibrated to Δ/g + d (Laplace) and Δ/g + sqrt(d) (Gaussian)."""
    from decimal import Decimal

    from accountant_plugins import laplace

    params = {"epsilon": Decimal(1), "sensitivity": Decimal(1)}
    grid, t = laplace.calibrate(params, d)
    assert Fraction(t) >= (Fraction(1) / Fraction(grid) + d) / 1
    zcdp = {"sigma": Decimal(3), "sensitivity": Decimal(1)}
    grid, sigma2 = gaussian.calibrate(zcdp, d)
    ratio = Fraction(3)
    assert sigma2 >= (ratio * (Fraction(1) / Fraction(grid) + Fraction(math.sqrt(d)))) ** 2 * (
        1 - Fraction(1, 10**15)
    )


def test_randomized_response_answers_the_whole_roster(api: Api) -> None:
    """The output has one response per roster member, present or not, so its length is the
    public roster size; absent members are answered uniformly."""
    api.make_dataset(budget={"epsilon": 10})
    roster = [True, None, False, None] * 500
    response = api.charge(
        mechanism="randomized_response", params={"epsilon": 2}, input={"values": roster}
    )
    assert response.status_code == 201
    answers = response.get_json()["output"]["values"]
    assert len(answers) == len(roster)
    absent = [a for a, v in zip(answers, roster, strict=True) if v is None]
    assert stats.binomtest(sum(absent), len(absent), 0.5).pvalue > 1e-4
    present = [a == v for a, v in zip(answers, roster, strict=True) if v is not None]
    kept = 1 - math.exp(-2) / 2  # the truth, or a uniform answer with probability e^-2
    assert stats.binomtest(sum(present), len(present), kept).pvalue > 1e-4
    labels = api.charge(
        mechanism="randomized_response",
        params={"epsilon": 1},
        input={"values": ["a", None], "categories": ["a", "b", "c"]},
    )
    assert labels.status_code == 201 and len(labels.get_json()["output"]["values"]) == 2
