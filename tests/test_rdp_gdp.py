"""rdp (Renyi DP at one order fixed at creation) and gdp (Gaussian DP) datasets, checked
through HTTP, against dp_accounting (a test-only reference) and against computations made
here independently of the service."""

from __future__ import annotations

import decimal
import itertools
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import dp_accounting
import mpmath
import pytest
from dp_accounting import pld, rdp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from accountant.accounting.modes import (
    epsilon_of_mu2,
    gdp_delta,
    least_units,
    mu_limit,
    rdp_limit,
    rdp_order,
    renyi_of_pure,
)
from accountant.exact import DELTA, RHO
from accountant_plugins import gaussian
from tests.conftest import Api, unlabelled
from tests.test_gaussian_privacy import _grid_gaussian, discrete_gaussian_delta

NAMES = itertools.count()


def charged_until_refused(
    api: Api,
    name: str,
    mechanism: str,
    params: dict[str, float],
) -> tuple[int, int]:
    granted = 0
    while (reply := api.charge(name, mechanism=mechanism, params=params)).status_code == 201:
        granted += 1
        assert granted < 2000
    return granted, reply.status_code


# --- rdp -------------------------------------------------------------------------------


def test_the_order_is_fixed_at_creation_and_shown(api: Api) -> None:
    made = api.make_dataset(accounting="rdp", budget={"epsilon": 1, "delta": 1e-6})
    assert made["rdp_order"] == 21.98  # argmax B(alpha)/alpha for (1, 1e-6), 4 digits
    assert "rdp" in made["budget"] and made["budget"]["epsilon"] == 1
    api.make_dataset("given", accounting="rdp", rdp_order=8, budget={"epsilon": 1, "delta": 1e-6})
    assert api.get("/v1/datasets/given").get_json()["rdp_order"] == 8
    # a limit change keeps the order
    assert api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2}}).status_code == 200
    assert api.get("/v1/datasets/clicks").get_json()["rdp_order"] == 21.98
    report = api.budget()
    assert set(unlabelled(report["limit"])) == {"rdp", "order", "epsilon", "delta"}
    assert report["limit"]["order"] == 21.98 and report["limit"]["epsilon"] == 2
    # the order belongs to rdp alone, and must exceed 1
    for body, field in (
        ({"accounting": "zcdp", "rdp_order": 8}, "rdp_order"),
        ({"accounting": "rdp", "rdp_order": 1}, "rdp_order"),
        ({"accounting": "rdp", "budget": {"epsilon": 1}}, "budget.delta"),
    ):
        reply = api.post(
            "/v1/datasets",
            {
                "name": "bad",
                "privacy_unit": "record",
                "budget": {"epsilon": 1, "delta": 1e-6},
                **body,
            },
        )
        assert reply.status_code == 400, reply.get_json()
        assert field in str(reply.get_json()), reply.get_json()


def test_gaussians_fit_until_b_of_the_order(api: Api) -> None:
    """(1, 1e-6), Gaussians of sigma 100: 487 fit, as on zcdp."""
    api.make_dataset(accounting="rdp", budget={"epsilon": 1, "delta": 1e-6})
    assert charged_until_refused(api, "clicks", "gaussian", {"sigma": 100, "sensitivity": 1}) == (
        487,
        409,
    )
    loss = api.budget()["loss"]
    assert loss["epsilon"] <= 1 and loss["order"] == 21.98


def test_laplace_is_charged_the_epsilon_dp_bound(api: Api) -> None:
    """(1, 1e-6), Laplace of epsilon 0.01: 490 fit. The built-in laplace is a discrete
    Laplace on a grid, so it is charged the bound of every epsilon-DP mechanism (Bun and
    Steinke 2016, Proposition 3.3), not the continuous Laplace's closed form (492 would fit)."""
    api.make_dataset(accounting="rdp", budget={"epsilon": 1, "delta": 1e-6})
    assert charged_until_refused(api, "clicks", "laplace", {"epsilon": 0.01, "sensitivity": 1}) == (
        490,
        409,
    )


@pytest.mark.parametrize("epsilon", ["0.001", "0.01", "0.5", "1", "3", "40"])
@pytest.mark.parametrize("order", ["1.5", "2", "21.98", "300"])
def test_the_epsilon_dp_bound_is_randomized_responses_divergence(epsilon: str, order: str) -> None:
    """The bound equals the Renyi divergence of binary randomized response, computed here
    from its two distributions, and is at least the continuous Laplace's (dp_accounting)."""
    eps, alpha = float(epsilon), float(order)
    bound = float(renyi_of_pure(Fraction(epsilon), Decimal(order)))
    with mpmath.workdps(60):
        e, a = mpmath.mpf(epsilon), mpmath.mpf(order)
        p = mpmath.exp(e) / (1 + mpmath.exp(e))
        exact = mpmath.log(p**a * (1 - p) ** (1 - a) + (1 - p) ** a * p ** (1 - a)) / (a - 1)
    assert bound == pytest.approx(float(min(exact, e)), rel=1e-12, abs=1e-15)
    assert bound >= float(min(exact, e))
    laplace = rdp.RdpAccountant(orders=[alpha])
    laplace.compose(dp_accounting.LaplaceDpEvent(1 / eps))
    assert bound >= laplace._rdp[0] - 1e-12


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    workload=st.lists(
        st.one_of(
            st.tuples(st.just("laplace"), st.sampled_from([0.05, 0.1, 0.3])),
            st.tuples(st.just("gaussian"), st.sampled_from([5, 10, 30])),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_rdp_never_reports_less_than_the_references(
    api: Api, workload: list[tuple[str, float]]
) -> None:
    """The reported epsilon is at least dp_accounting's PLD epsilon (the exact loss of the
    continuous mechanisms) and its RDP epsilon at the dataset's order."""
    name = f"mix{next(NAMES)}"
    made = api.make_dataset(name, accounting="rdp", budget={"epsilon": 50, "delta": 1e-6})
    exact, at_order = pld.PLDAccountant(), rdp.RdpAccountant(orders=[made["rdp_order"]])
    for mechanism, value in workload:
        params = (
            {"epsilon": value, "sensitivity": 1}
            if mechanism == "laplace"
            else {"sigma": value, "sensitivity": 1}
        )
        assert api.charge(name, mechanism=mechanism, params=params).status_code == 201
        event = (
            dp_accounting.LaplaceDpEvent(1 / value)
            if mechanism == "laplace"
            else dp_accounting.GaussianDpEvent(value)
        )
        exact.compose(event)
        at_order.compose(event)
    reported = api.budget(name)["loss"]["epsilon"]
    assert reported >= exact.get_epsilon(1e-6)
    assert reported >= at_order.get_epsilon(1e-6) - 1e-9


@pytest.mark.parametrize(("epsilon", "delta"), [("1", "1e-6"), ("10", "1e-6"), ("0.5", "1e-9")])
def test_the_rdp_limit_converts_back_within_the_budget(epsilon: str, delta: str) -> None:
    order = rdp_order(Decimal(epsilon), Decimal(delta))
    units = rdp_limit(Decimal(epsilon), Decimal(delta), order)
    accountant = rdp.RdpAccountant(orders=[float(order)])
    accountant._rdp = [units / RHO.scale]  # a loss of exactly the limit at that order
    assert accountant.get_epsilon(float(delta)) <= float(epsilon) + 1e-9
    accountant._rdp = [units / RHO.scale * 1.0001]
    assert accountant.get_epsilon(float(delta)) > float(epsilon) - 1e-3


# --- gdp -------------------------------------------------------------------------------


def mu_star(epsilon: float, delta: float) -> float:
    """mu* solved here with scipy in binary64 (independently of the service)."""

    def excess(mu: float) -> float:
        return float(
            stats.norm.cdf(-epsilon / mu + mu / 2)
            - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
            - delta
        )

    return float(optimize.brentq(excess, 1e-3, 50, xtol=1e-14))


@pytest.mark.parametrize(("epsilon", "delta"), [("1", "1e-6"), ("10", "1e-6"), ("0.5", "1e-5")])
def test_the_gdp_limit_is_mu_star_squared(epsilon: str, delta: str) -> None:
    units = mu_limit(Decimal(epsilon), Decimal(delta))
    assert units / RHO.scale == pytest.approx(mu_star(float(epsilon), float(delta)) ** 2, rel=1e-8)
    with mpmath.workdps(60):  # rounded down: the limit's delta stays within delta
        mu = mpmath.sqrt(mpmath.mpf(units) / RHO.scale)
        assert gdp_delta(mpmath.mpf(epsilon), mu) <= mpmath.mpf(delta)


def test_a_gdp_limit_and_what_remains_of_it_are_shown_rounded_down(api: Api) -> None:
    """DESIGN.md: a limit is rounded down. The budget report's and a charge's ``mu`` of a
    limit or a remainder is the floor of sqrt(mu*^2) at 12 decimals, as the dataset itself
    states it; a loss's is rounded up."""
    created = api.make_dataset(accounting="gdp", budget={"epsilon": 1, "delta": 1e-6})
    units = mu_limit(Decimal(1), Decimal("1e-6"))

    floor = _mu(units, decimal.ROUND_FLOOR)
    assert floor < _mu(units, decimal.ROUND_CEILING)  # the case tells the roundings apart
    report = api.budget()
    assert created["budget"]["mu"] == report["limit"]["mu"] == report["remaining"]["mu"] == floor
    granted = api.charge(mechanism="gaussian", params={"sigma": 1000, "sensitivity": 1})
    left = units - api.ledger()[-1]["cost_units"][2]  # mu^2 (about 1e-6, and a grid margin)
    assert _mu(left, decimal.ROUND_FLOOR) < _mu(left, decimal.ROUND_CEILING)
    assert granted.get_json()["remaining"]["mu"] == _mu(left, decimal.ROUND_FLOOR)
    assert api.budget()["remaining"]["mu"] == _mu(left, decimal.ROUND_FLOOR)


def _mu(mu2_units: int, rounding: str) -> float:
    """mu of ``mu2_units`` at 12 decimals, rounded as ``rounding`` says."""
    with decimal.localcontext() as context:
        context.prec = 60
        exact = (Decimal(mu2_units) / RHO.scale).sqrt()
        return float(exact.quantize(Decimal("1e-12"), rounding=rounding))


def test_every_gdp_limit_and_remainder_shown_is_rounded_down(api: Api) -> None:
    """Each place that states a limit or what remains of one, on a gdp dataset and a gdp
    population whose every limit is (1, 1e-6): the window's, the partition budget's, the
    quota's, the population's, a denial's, a preview's, a hold's and a settle's."""
    budget = {"epsilon": 1, "delta": 1e-6}
    population = {"name": "pop", "privacy_unit": "user", "accounting": "gdp", "budget": budget}
    assert api.post("/v1/populations", population).status_code == 201
    api.make_dataset(
        privacy_unit="user",
        accounting="gdp",
        budget=budget,
        partition_budget=budget,
        windows=[{"period": "1d", **budget}],
        population="pop",
    )
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": budget}))
    units = mu_limit(Decimal(1), Decimal("1e-6"))
    floor = _mu(units, decimal.ROUND_FLOOR)
    gaussian: dict[str, Any] = {
        "mechanism": "gaussian",
        "params": {"sigma": 1000, "sensitivity": 1},
    }
    preview = service.post(
        "/v1/charges/preview", {"dataset": "clicks", "partitions": ["p1"], **gaussian}
    ).get_json()
    assert service.charge(**gaussian).status_code == 201
    left = _mu(units - api.ledger()[-1]["cost_units"][2], decimal.ROUND_FLOOR)
    assert left < _mu(units - api.ledger()[-1]["cost_units"][2], decimal.ROUND_CEILING)
    assert preview["remaining_after"]["mu"] == left
    report = api.budget()
    (window,) = report["windows"]
    assert (window["limit"]["mu"], window["remaining"]["mu"]) == (floor, left)
    assert report["partition_limit"]["mu"] == floor
    assert report["partitions"]["remaining"]["mu"] == left
    quota = service.get("/v1/consumers/me").get_json()["use"]["clicks"]
    assert quota["remaining"]["mu"] == left
    pop = api.get("/v1/populations/pop/budget").get_json()
    assert (pop["limit"]["mu"], pop["remaining"]["mu"]) == (floor, left)
    denied = service.charge(mechanism="gaussian", params={"sigma": 0.5, "sensitivity": 1})
    assert denied.status_code == 409 and denied.get_json()["limit"]["mu"] == floor
    hold = {"dataset": "clicks", "partitions": ["p1"], "amount": {"mu": 0.01}, "expires_in": 60}
    held = service.post("/v1/holds", hold).get_json()
    after_hold = units - sum(e["cost_units"][2] for e in api.ledger() if e["status"] == "granted")
    assert held["remaining"]["mu"] == _mu(after_hold, decimal.ROUND_FLOOR)
    settled = service.post(f"/v1/holds/{held['hold_id']}/release", {}).get_json()
    assert settled["remaining"]["mu"] == left


def test_gaussians_fit_until_mu_star(api: Api) -> None:
    """(1, 1e-6): 560 Gaussians of sigma 100 fit; (10, 1e-6): 341 of sigma 10."""
    api.make_dataset(accounting="gdp", budget={"epsilon": 1, "delta": 1e-6})
    assert charged_until_refused(api, "clicks", "gaussian", {"sigma": 100, "sensitivity": 1}) == (
        560,
        409,
    )
    api.make_dataset("ten", accounting="gdp", budget={"epsilon": 10, "delta": 1e-6})
    plan = api.post(
        "/v1/charges/plan",
        {
            "dataset": "ten",
            "partitions": ["p1"],
            "mechanism": "gaussian",
            "params": {"sigma": 10, "sensitivity": 1},
        },
    ).get_json()
    assert plan["fits"] == 341


def test_the_reported_gdp_loss_matches_the_pld(api: Api) -> None:
    """(10, 1e-6), 100 Gaussians of sigma 10: epsilon 4.8866, dp_accounting's PLD 4.88655
    (exact for this composition), never below it."""
    api.make_dataset(accounting="gdp", budget={"epsilon": 10, "delta": 1e-6})
    for _ in range(100):
        assert (
            api.charge(mechanism="gaussian", params={"sigma": 10, "sensitivity": 1}).status_code
            == 201
        )
    loss = api.budget()["loss"]
    reference = pld.PLDAccountant()
    reference.compose(dp_accounting.GaussianDpEvent(10.0), 100)
    exact = reference.get_epsilon(1e-6)
    assert loss["epsilon"] >= exact
    assert loss["epsilon"] == pytest.approx(4.8866, abs=1e-4)
    assert loss["mu"] == pytest.approx(1.0, rel=1e-5) and loss["mu"] >= 1


def test_gdp_refuses_mechanisms_without_a_gaussian_dp_cost(api: Api) -> None:
    api.make_dataset(accounting="gdp", budget={"epsilon": 1, "delta": 1e-6})
    for mechanism, params in (
        ("laplace", {"epsilon": 0.1, "sensitivity": 1}),
        ("discrete_gaussian", {"sigma": 10, "sensitivity": 1}),
    ):
        reply = api.charge(mechanism=mechanism, params=params, input={"values": [10]})
        assert reply.status_code == 400, reply.get_json()
        body = reply.get_json()
        assert "gdp" in body["detail"] and "approx" in body["detail"], body
    assert api.ledger() == []
    listed = {
        m["name"]: m["accounting"] for m in api.get("/v1/mechanisms").get_json()["mechanisms"]
    }
    assert "gdp" in listed["gaussian"] and "gdp" not in listed["laplace"]
    assert "rdp" in listed["laplace"] and "rdp" in listed["exponential"]


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sigmas=st.lists(st.sampled_from([3, 10, 30]), min_size=1, max_size=10))
def test_gdp_never_reports_less_than_the_pld(api: Api, sigmas: list[float]) -> None:
    name = f"g{next(NAMES)}"
    api.make_dataset(name, accounting="gdp", budget={"epsilon": 50, "delta": 1e-6})
    # gdp is exact for Gaussians: the reference's own discretisation (pessimistic, so above
    # the exact figure by up to about its interval) is the tolerance
    exact = pld.PLDAccountant(value_discretization_interval=1e-4)
    for sigma in sigmas:
        assert (
            api.charge(
                name, mechanism="gaussian", params={"sigma": sigma, "sensitivity": 1}
            ).status_code
            == 201
        )
        exact.compose(dp_accounting.GaussianDpEvent(sigma))
    reported, reference = api.budget(name)["loss"]["epsilon"], exact.get_epsilon(1e-6)
    assert reported >= reference - 2e-4
    assert reported <= reference + 1e-3


def test_epsilon_of_mu_inverts_the_profile() -> None:
    for mu2 in (10**9, 10**12, 5 * 10**12):
        epsilon = epsilon_of_mu2(mu2, DELTA.limit_units(Decimal("1e-6")))
        with mpmath.workdps(60):
            mu = mpmath.sqrt(mpmath.mpf(mu2) / RHO.scale)
            at = gdp_delta(mpmath.mpf(str(epsilon)), mu)
            assert at <= mpmath.mpf("1e-6")  # rounded up: delta at the reported epsilon
            # and it is the least such epsilon on the grid of epsilon units (10^-9)
            assert gdp_delta(mpmath.mpf(str(epsilon)) - mpmath.mpf("1e-9"), mu) > mpmath.mpf("1e-6")


@pytest.mark.parametrize("guess", [None, 1, 12_344, 12_345, 12_347, 99_999, 10**15])
def test_the_grid_search_finds_the_least_point_from_any_proposal(guess: int | None) -> None:
    """epsilon_of_mu2 steps from a floating-point proposal; a proposal that is missing, or
    off by any amount, only costs time."""
    calls: list[int] = []

    def within(units: int) -> bool:
        calls.append(units)
        return units >= 12_345

    assert least_units(within, guess) == 12_345
    if guess in (12_344, 12_345, 12_347):
        assert len(calls) <= 6  # a close proposal takes a few evaluations, not a search


def test_epsilon_of_mu_from_a_float_proposal_matches_a_search_at_60_digits() -> None:
    """The least grid epsilon with delta(epsilon) <= delta, found without the float
    proposal (doubling and bisection on the grid, every comparison at 60 digits), equals
    what epsilon_of_mu2 answers, over mu from 10^-3 to 10^2 and delta from 10^-15 to 0.1."""
    for mu2 in (10**6, 37 * 10**8, 10**10, 10**12, 7 * 10**12, 10**14, 10**16):
        for delta in (10**3, 10**6, 10**12, 10**17):
            with mpmath.workdps(60):
                mu = mpmath.sqrt(mpmath.mpf(mu2) / RHO.scale)
                target = mpmath.mpf(delta) / DELTA.scale

                def within(units: int, mu: mpmath.mpf = mu, target: mpmath.mpf = target) -> bool:
                    return bool(gdp_delta(mpmath.mpf(units) / 10**9, mu) <= target)

                units = 0 if within(0) else least_units(within, None)
                expected = Decimal(units) / 10**9
            assert epsilon_of_mu2.__wrapped__(mu2, delta) == expected, (mu2, delta)


def test_the_smoothing_kernel_of_the_domination_proof() -> None:
    """Step (2) of docs/accounting.md's proof that the grid sampler is (D/sigma)(1 + 2^-20)
    GDP: sum_j g(y - j), with g the N(0, t^2) density, is within 3 exp(-2 pi^2 t^2) of 1
    (Poisson summation), checked where the deviation is large enough to see; and the
    constants of step (4)."""
    for t in (1, 2):
        with mpmath.workdps(90):
            bound = 3 * mpmath.exp(-2 * mpmath.pi**2 * t**2)
            deviations = [
                abs(mpmath.fsum(mpmath.npdf(y - j, 0, t) for j in range(-40 * t, 40 * t + 2)) - 1)
                for y in (mpmath.mpf(i) / 16 for i in range(17))
            ]
            assert max(deviations) <= bound
            assert max(deviations) >= bound / 2  # the bound is the size of the effect
    assert mpmath.npdf(0) / mpmath.ncdf(0) >= 0.79  # the normal's hazard rate at 0
    assert mpmath.npdf(1) / mpmath.ncdf(1) >= 0.28  # its reversed hazard rate at 1


# The charged mu dominates the implemented sampler's privacy profile: the real-valued
# gaussian samples a discrete Gaussian of sigma >= 2^40 grid units, whose delta(epsilon)
# (CKS20, Theorem 7, computed exactly) must stay below mu-GDP's at every epsilon.
EPSILONS = [Fraction(i, 8) for i in range(0, 8 * 12 + 1)]


@pytest.mark.parametrize("sigma", ["1", "10", "0.37"])
def test_the_charged_mu_dominates_the_grid_sampler(sigma: str) -> None:
    sigma2, shift = _grid_gaussian({"sigma": sigma, "sensitivity": "1"})
    charged = Fraction(1) / Fraction(sigma) * gaussian.GDP_MARGIN
    with mpmath.workdps(60):
        mu = mpmath.mpf(charged.numerator) / charged.denominator
        for epsilon in EPSILONS:
            e = mpmath.mpf(epsilon.numerator) / epsilon.denominator
            for moved in (shift, shift - 1):
                assert discrete_gaussian_delta(sigma2, moved, e) <= gdp_delta(
                    e, mu * moved / shift
                ), (moved, float(e))


@pytest.mark.parametrize("moved", [1, 2])
def test_a_coordinate_moved_by_one_grid_unit_stays_within_its_share(moved: int) -> None:
    """In a release of several values a coordinate may move by a single grid unit: its
    share of the charged mu is (moved / s)(1 + 2^-20), s the sampled sigma in grid units.
    Its exact profile stays within that share's at epsilon from 0 to 40 times the share,
    where delta falls below 10^-300 (the proof in docs/accounting.md covers the rest)."""
    sigma2, _ = _grid_gaussian({"sigma": "1", "sensitivity": "1"})
    with mpmath.workdps(60):
        s = mpmath.sqrt(mpmath.mpf(sigma2.numerator) / sigma2.denominator)
        margin = gaussian.GDP_MARGIN
        share = moved / s * mpmath.mpf(margin.numerator) / margin.denominator
        for step in range(0, 8 * 40 + 1):
            e = share * step / 8
            assert discrete_gaussian_delta(sigma2, moved, e) <= gdp_delta(e, share), step
        assert gdp_delta(share * 40, share) < mpmath.mpf(10) ** -300


def test_a_small_discrete_gaussian_exceeds_its_continuous_profile() -> None:
    """Why the margin, and why discrete_gaussian (sigma as small as 1) is not offered on gdp:
    at sigma 1 and shift 1 the discrete profile is above 1-GDP's."""
    with mpmath.workdps(40):
        e = mpmath.mpf(1)
        assert discrete_gaussian_delta(Fraction(1), 1, e) > gdp_delta(e, mpmath.mpf(1)) + 0.01


def test_quotas_are_named_in_their_datasets_measure(api: Api) -> None:
    api.make_dataset("renyi", accounting="rdp", budget={"epsilon": 1, "delta": 1e-6})
    api.make_dataset("gauss", accounting="gdp", budget={"epsilon": 1, "delta": 1e-6})
    api.make_consumer(
        "svc",
        datasets=["renyi", "gauss"],
        quotas={"renyi": {"epsilon": 0.5}, "gauss": {"epsilon": 0.5}},
    )
    listed = {c["name"]: c for c in api.get("/v1/consumers").get_json()["consumers"]}
    quotas = listed["svc"]["quotas"]
    assert set(quotas["renyi"]) == {"epsilon", "rdp"} and set(quotas["gauss"]) == {"epsilon", "mu"}
    assert 0 < quotas["gauss"]["mu"] < 0.2367  # mu* of (0.5, 1e-6) is below that of (1, 1e-6)
