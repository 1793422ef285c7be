"""Approx datasets with advanced composition: the filter of Whitehouse, Ramdas, Rogers and Wu
(2023), checked against an independent statement of the theorem's inequality."""

from __future__ import annotations

import json
import random
import re
from decimal import ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction
from typing import Any

import mpmath
import pytest
from flask.testing import FlaskClient

from accountant.accounting.loss import LossRule, ScopeBooks, ScopeState, loss_after
from accountant.accounting.modes import StatedCost, limit_of, mode_of
from accountant.exact import DELTA, Amount
from tests.conftest import ADMIN_KEY, Api, run_sql, unlabelled


def theorem_admits(
    squares: Fraction, deltas: Fraction, epsilon: str, delta: str, share: str
) -> bool:
    """Whether the filter of WRRW23 lets a sequence through whose releases' epsilon_m^2 sum to
    ``squares`` and whose deltas sum to ``deltas``: with delta = delta' + delta'', it stops
    before release n+1 as soon as
    epsilon < sqrt(2 ln(1/delta') sum_{m<=n+1} eps_m^2) + (1/2) sum_{m<=n+1} eps_m^2
    or delta'' < sum_{m<=n+1} delta_m. Both sides grow with n, so a whole sequence passes
    if its last prefix does. Evaluated at 80 digits, as the theorem states it."""
    return epsilon_slack(squares, epsilon, share) >= 0 and deltas <= Fraction(delta) - Fraction(
        share
    )


def epsilon_slack(squares: Fraction, epsilon: str, share: str) -> Fraction:
    """epsilon - sqrt(2 ln(1/delta') squares) - squares / 2, relative to epsilon (to 10^-60)."""
    with mpmath.workdps(80):
        exact = mpmath.mpf(squares.numerator) / squares.denominator
        bound = mpmath.sqrt(2 * mpmath.log(1 / mpmath.mpf(share)) * exact) + exact / 2
        return Fraction(mpmath.nstr(mpmath.mpf(epsilon) - bound, 60)) / Fraction(epsilon)


def theorem_count(each: Fraction, epsilon: str, delta: str, share: str) -> int:
    """How many releases of epsilon ``each`` (delta 0) the theorem's filter admits."""
    low, high = 0, 1
    while theorem_admits(high * each**2, Fraction(0), epsilon, delta, share):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if theorem_admits(middle * each**2, Fraction(0), epsilon, delta, share):
            low = middle
        else:
            high = middle
    return low


def service_admits(
    releases: list[tuple[Fraction, Fraction]], epsilon: str, delta: str, share: str
) -> list[bool]:
    """What the service's accounting decides for each release in turn (the lifetime scope of
    a record dataset, one partition): the mode's prices and limit, and the loss rule."""
    mode = mode_of("approx", None, DELTA.limit_units(Decimal(share)))
    limit = limit_of(mode, {"epsilon": Decimal(epsilon), "delta": Decimal(delta)}, None)
    rule = LossRule("record", None)
    books = ScopeBooks()
    decisions = []
    for eps, dlt in releases:
        cost = mode.amount_of(StatedCost(epsilon=eps, delta=dlt, rho=None))
        state = ScopeState(
            total=books.total,
            max_all=books.max_spend,
            max_touched=books.spends.get("p", Amount()),
        )
        after = loss_after(rule, state, cost, 1, "joint", mode.components)
        admitted = not limit.is_exceeded_by(after, mode.components)
        if admitted:
            books.add(cost, 1, ["p"], "joint")
        decisions.append(admitted)
    return decisions


BUDGETS = [
    ("1", "1e-6", "1e-6"),
    ("1", "1e-6", "5e-7"),
    ("10", "1e-6", "1e-6"),
    ("0.3", "1e-9", "1e-10"),
]


@pytest.mark.parametrize("budget", BUDGETS)
def test_the_filter_never_admits_what_the_theorem_refuses(budget: tuple[str, str, str]) -> None:
    """Random adaptive sequences of mixed epsilons and deltas, each request made whatever
    came before: every sequence the service grants passes the theorem's inequality, and a
    request it refuses would have taken the sequence within 10^-9 of a bound or past it."""
    epsilon, delta, share = budget
    spare = Fraction(delta) - Fraction(share)
    rng = random.Random(f"advanced {budget}")
    for _ in range(25):
        releases = []
        for _ in range(200):
            eps = Fraction(rng.choice([1, 3, 10, 25, 70, 200, 999]), rng.choice([1000, 10000]))
            dlt = Fraction(0) if rng.random() < 0.7 or not spare else spare * rng.randint(1, 9) / 40
            releases.append((eps, dlt))
        granted = _Granted()
        for (eps, dlt), admitted in zip(
            releases, service_admits(releases, epsilon, delta, share), strict=True
        ):
            exact, slack = granted.theorem(eps, dlt, epsilon, delta, share)
            if admitted:
                assert exact, (budget, granted.count)
                granted.add(eps, dlt)
            elif exact:  # refused only through rounding: within a unit of a limit
                assert slack < Fraction(1, 10**9), (budget, slack)
        assert granted.count > 0, budget


class _Granted:
    """The sums over the releases granted so far, kept exactly."""

    def __init__(self) -> None:
        self.squares = Fraction(0)
        self.deltas = Fraction(0)
        self.count = 0

    def add(self, eps: Fraction, dlt: Fraction) -> None:
        self.squares += eps**2
        self.deltas += dlt
        self.count += 1

    def theorem(
        self, eps: Fraction, dlt: Fraction, epsilon: str, delta: str, share: str
    ) -> tuple[bool, Fraction]:
        """The theorem's decision on one more release, and how far within both bounds the
        sequence would then be (the lesser slack, relative to epsilon or to delta)."""
        squares, deltas = self.squares + eps**2, self.deltas + dlt
        delta_slack = (Fraction(delta) - Fraction(share) - deltas) / Fraction(delta)
        admitted = theorem_admits(squares, deltas, epsilon, delta, share)
        return admitted, min(epsilon_slack(squares, epsilon, share), delta_slack)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("each", ["0.01", "0.0123", "0.1", "0.001"])
def test_the_filter_admits_within_one_release_of_the_theorem(
    budget: tuple[str, str, str], each: str
) -> None:
    """n identical releases are one of n times the cost in every loss rule (as the plan
    counts them): the service grants n where the theorem grants n or n + 1."""
    epsilon, delta, share = budget
    exact = theorem_count(Fraction(each), epsilon, delta, share)
    mode = mode_of("approx", None, DELTA.limit_units(Decimal(share)))
    limit = limit_of(mode, {"epsilon": Decimal(epsilon), "delta": Decimal(delta)}, None)
    cost = mode.amount_of(StatedCost(epsilon=Fraction(each), delta=Fraction(0), rho=None))

    def grants(n: int) -> bool:
        after = loss_after(
            LossRule("record", None), ScopeState(), cost.scaled(n), 1, "joint", mode.components
        )
        return not limit.is_exceeded_by(after, mode.components)

    assert grants(exact) or grants(exact - 1)
    assert not grants(exact + 1)
    if exact < 2000:  # and charged one by one
        decisions = service_admits(
            [(Fraction(each), Fraction(0))] * (exact + 2), epsilon, delta, share
        )
        assert exact - 1 <= decisions.count(True) <= exact


def _advanced(api: Api, name: str = "clicks", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "accounting": "approx",
        "composition": "advanced",
        "budget": {"epsilon": 1, "delta": 1e-6},
        **fields,
    }
    return api.make_dataset(name, **body)


def _laplace(dataset: str = "clicks", epsilon: float = 0.01, **fields: Any) -> dict[str, Any]:
    return {
        "dataset": dataset,
        "partitions": fields.pop("partitions", ["p1"]),
        "release": fields.pop("release", "joint"),
        "mechanism": "laplace",
        "params": {"epsilon": epsilon, "sensitivity": 1},
        **fields,
    }


def _fits(api: Api, body: dict[str, Any]) -> int:
    reply = api.post("/v1/charges/plan", body)
    assert reply.status_code == 200, reply.get_json()
    return int(reply.get_json()["fits"])


def _charge_until_refused(api: Api, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    granted = 0
    while (
        reply := api.post("/v1/charges", {**body, "input": {"values": [1.0]}})
    ).status_code == 201:
        granted += 1
    assert reply.status_code == 409, reply.get_json()
    return granted, reply.get_json()


def test_laplace_releases_on_one_and_one_in_a_million(api: Api) -> None:
    """(1, 1e-6), Laplace of epsilon 0.01: basic composition grants 100; the advanced filter
    with all of delta as delta' grants what the theorem allows (349), checked by charging."""
    api.make_dataset("basic", accounting="approx", budget={"epsilon": 1, "delta": 1e-6})
    basic, _ = _charge_until_refused(api, _laplace("basic"))
    assert basic == 100
    _advanced(api, composition_delta=1e-6)
    exact = theorem_count(Fraction(1, 100), "1", "1e-6", "1e-6")
    assert _fits(api, _laplace()) == exact
    granted, refusal = _charge_until_refused(api, _laplace())
    assert granted == exact > 3 * basic
    assert refusal["scope"] == "dataset"
    assert unlabelled(refusal["requested"]) == {"epsilon": 0.01, "delta": 0, "rho": 5e-05}
    assert _fits(api, _laplace()) == 0


def test_all_of_delta_for_the_filter_is_at_its_limit_only_when_rho_is(api: Api) -> None:
    """With delta' = delta the releases' delta limit is 0: it admits every Laplace, so the
    dataset and its partitions are not "at limit" until rho is spent."""
    _advanced(api, partition_budget={"epsilon": 0.5, "delta": 1e-6}, composition_delta=1e-6)
    assert api.post("/v1/charges", {**_laplace(), "input": {"values": [1.0]}}).status_code == 201
    report = api.budget()
    assert report["limit"]["delta"] == 0 and report["partition_limit"]["delta"] == 0
    assert report["at_limit"] is False and report["partitions"]["at_limit"] is False
    # the release whose epsilon^2 / 2, rounded up to 10^-12, is exactly what is left
    left = Decimal(str(report["partitions"]["remaining"]["rho"]))
    with localcontext(prec=50, rounding=ROUND_FLOOR):
        epsilon = (2 * left).sqrt().quantize(Decimal("1e-30"))
    rest = json.dumps({**_laplace(), "input": {"values": [1.0]}}).replace("0.01", str(epsilon))
    assert api.post("/v1/charges", raw=rest).status_code == 201, rest
    assert api.budget()["partitions"]["at_limit"] is True


def test_laplace_releases_on_ten_and_one_in_a_million(api: Api) -> None:
    api.make_dataset("basic", accounting="approx", budget={"epsilon": 10, "delta": 1e-6})
    assert _fits(api, _laplace("basic")) == 1000
    _advanced(api, budget={"epsilon": 10, "delta": 1e-6}, composition_delta=1e-6)
    exact = theorem_count(Fraction(1, 100), "10", "1e-6", "1e-6")
    assert _fits(api, _laplace()) == exact > 27 * 1000


def test_by_default_half_of_delta_is_the_filters(api: Api) -> None:
    created = _advanced(api)
    assert created["composition"] == "advanced" and created["composition_delta"] == 5e-7
    assert created["budget"] == {"epsilon": 1, "delta": 1e-6, "rho": pytest.approx(0.0166, 0.01)}
    assert _fits(api, _laplace()) == theorem_count(Fraction(1, 100), "1", "1e-6", "5e-7")
    # the other half is for the releases' deltas: five Gaussians of delta 1e-7, no sixth
    gaussian = {
        **_laplace(),
        "mechanism": "gaussian",
        "params": {"epsilon": 0.05, "delta": 1e-7, "sensitivity": 1},
    }
    granted, refusal = _charge_until_refused(api, gaussian)
    assert granted == 5
    assert refusal["limit"]["delta"] == 5e-7 and refusal["spent"]["delta"] == 5e-7


def test_mixed_adaptive_releases_over_http_follow_the_theorem(api: Api) -> None:
    """Each request chosen from the outputs before it (its epsilon from the last noisy
    value), Laplace and Gaussian mixed: every grant and refusal is the theorem's decision."""
    _advanced(api, budget={"epsilon": 0.5, "delta": 1e-6}, composition_delta=4e-7)
    granted: list[tuple[Fraction, Fraction]] = []
    last = 0.0
    refusals = 0
    for step in range(120):
        eps = Fraction(str(Decimal(str(0.002 + (abs(last) * 997 + step) % 19 / 1000))))
        gaussian = step % 5 == 4
        dlt = Fraction(1, 10**8) if gaussian else Fraction(0)
        body = _laplace(epsilon=float(eps))
        if gaussian:
            body |= {
                "mechanism": "gaussian",
                "params": {"epsilon": float(eps), "delta": 1e-8, "sensitivity": 1},
            }
        reply = api.post("/v1/charges", {**body, "input": {"values": [100.0]}})
        trial = [*granted, (eps, dlt)]
        squares = sum((e**2 for e, _ in trial), Fraction(0))
        exact = theorem_admits(
            squares, sum((d for _, d in trial), Fraction(0)), "0.5", "1e-6", "4e-7"
        )
        assert (reply.status_code == 201) == exact, (step, trial)
        if reply.status_code == 201:
            granted = trial
            last = reply.get_json()["output"]["values"][0]
        else:
            refusals += 1
    assert len(granted) > 15 and refusals > 5
    # each release's epsilon^2 / 2 is rounded up to 10^-12, never down
    loss = api.budget()["loss"]
    with mpmath.workdps(50):
        rho = sum((mpmath.mpf(e.numerator) / e.denominator) ** 2 for e, _ in granted) / 2
        most = rho + len(granted) * mpmath.mpf("1e-12")

        def filter_epsilon(value: mpmath.mpf) -> float:
            return float(value + 2 * mpmath.sqrt(value * mpmath.log(1 / mpmath.mpf("4e-7"))))

        assert float(rho) <= loss["rho"] <= float(most)
        assert filter_epsilon(rho) <= loss["epsilon"] <= filter_epsilon(most) + 1e-9
    assert loss["delta"] == pytest.approx(sum(d for _, d in granted), rel=1e-12)


def test_partitions_compose_in_parallel_and_users_by_their_k(api: Api) -> None:
    _advanced(api, composition_delta=1e-6)
    one = _fits(api, _laplace())
    assert _fits(api, _laplace(partitions=["p1", "p2"], release="parallel")) == one
    for _ in range(10):
        assert (
            api.post(
                "/v1/charges", {**_laplace(partitions=["p1"]), "input": {"values": [1.0]}}
            ).status_code
            == 201
        )
    assert _fits(api, _laplace(partitions=["p2"])) == one
    assert _fits(api, _laplace(partitions=["p1", "p2"])) == one - 10
    _advanced(api, "people", privacy_unit="user", max_partitions_per_user=2, composition_delta=1e-6)
    # a parallel release over 3 partitions counts twice for a person in 2 of them
    assert (
        _fits(api, _laplace("people", partitions=["a", "b", "c"], release="parallel")) == one // 2
    )
    assert _fits(api, _laplace("people", partitions=["a", "b", "c"])) == one


def test_plan_solves_for_the_largest_epsilon_of_a_count(api: Api) -> None:
    _advanced(api, composition_delta=1e-6)
    body = {**_laplace(), "params": {"sensitivity": 1}, "count": 100}
    reply = api.post("/v1/charges/plan", body)
    assert reply.status_code == 200, reply.get_json()
    epsilon = reply.get_json()["params"]["epsilon"]
    # 100 releases of epsilon e: 100 e^2 / 2 <= rho*, so e = sqrt(rho* / 50) = 0.01869...
    solved = Fraction(str(epsilon))
    assert theorem_admits(100 * solved**2, Fraction(0), "1", "1e-6", "1e-6")
    larger = solved * Fraction(10**6 + 2, 10**6)
    assert not theorem_admits(100 * larger**2, Fraction(0), "1", "1e-6", "1e-6")
    assert _fits(api, _laplace(epsilon=epsilon)) == 100


def test_the_rule_is_shown_and_cannot_be_changed(api: Api) -> None:
    _advanced(
        api,
        windows=[{"period": "1d", "epsilon": 0.5}],
        partition_budget={"epsilon": 0.8, "delta": 9e-7},
    )
    api.make_dataset("basic", accounting="approx", budget={"epsilon": 1, "delta": 1e-6})
    listed = {d["name"]: d for d in api.get("/v1/datasets").get_json()["datasets"]}
    assert listed["clicks"]["composition"] == "advanced"
    assert listed["clicks"]["composition_delta"] == 5e-7
    assert listed["clicks"]["partition_budget"]["delta"] == 9e-7
    assert listed["basic"]["composition"] == "basic" and "composition_delta" not in listed["basic"]
    report = api.budget()
    assert report["composition"] == "advanced" and report["composition_delta"] == 5e-7
    assert report["limit"]["delta"] == 5e-7  # what the releases may spend: delta - delta'
    assert unlabelled(report["windows"][0]["limit"]).keys() == {"epsilon", "rho"}
    for change in ({"composition": "basic"}, {"composition_delta": 1e-7}):
        refused = api.patch("/v1/datasets/clicks", change)
        assert refused.status_code == 400, change
    raised = api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2}})
    assert raised.status_code == 200, raised.get_json()
    after = api.get("/v1/datasets/clicks").get_json()
    assert after["composition"] == "advanced" and after["composition_delta"] == 5e-7
    assert after["budget"]["delta"] == 1e-6 and after["budget"]["epsilon"] == 2
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True


def test_the_rule_is_part_of_the_terms_digest(api: Api, database_url: str) -> None:
    _advanced(api)
    api.post("/v1/charges", {**_laplace(), "input": {"values": [1.0]}})
    run_sql(database_url, "UPDATE datasets SET composition_delta = composition_delta * 2")
    assert api.get("/v1/ledger/verify").get_json()["ok"] is False


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"accounting": "zcdp", "composition": "advanced"}, "composition"),
        ({"accounting": "pure", "budget": {"epsilon": 1}, "composition": "basic"}, "composition"),
        ({"composition": "basic", "composition_delta": 1e-7}, "composition_delta"),
        ({"composition_delta": 1e-7}, "composition_delta"),
        ({"composition": "advanced", "budget": {"epsilon": 1}}, "budget.delta"),
        ({"composition": "advanced", "composition_delta": 2e-6}, "composition_delta"),
        (
            {"composition": "advanced", "partition_budget": {"epsilon": 1, "delta": 1e-7}},
            "partition_budget",
        ),
        ({"composition": "advanced", "windows": [{"period": "1d", "rho": 0.1}]}, "windows.0"),
        (
            {"composition": "advanced", "windows": [{"period": "1d", "epsilon": 1e-6}]},
            "windows.0.epsilon",
        ),
    ],
)
def test_what_creation_refuses(api: Api, fields: dict[str, Any], field: str) -> None:
    body = {
        "name": "clicks",
        "privacy_unit": "record",
        "accounting": "approx",
        "budget": {"epsilon": 1, "delta": 1e-6},
        **fields,
    }
    reply = api.post("/v1/datasets", body)
    assert reply.status_code == 400, reply.get_json()
    assert reply.get_json()["errors"][0]["field"] == field
    assert api.get("/v1/datasets").get_json()["datasets"] == []


def test_a_sub_budget_of_delta_prime_admits_releases_without_delta(api: Api) -> None:
    _advanced(api, partition_budget={"epsilon": 0.5, "delta": 5e-7})
    assert api.budget()["partition_limit"]["delta"] == 0
    gaussian = {
        **_laplace(),
        "mechanism": "gaussian",
        "params": {"epsilon": 0.05, "delta": 1e-9, "sensitivity": 1},
        "input": {"values": [1.0]},
    }
    refused = api.post("/v1/charges", gaussian)
    assert refused.status_code == 409 and refused.get_json()["scope"] == "partition"
    assert api.post("/v1/charges", {**_laplace(), "input": {"values": [1.0]}}).status_code == 201
    small = api.post(
        "/v1/datasets",
        {
            "name": "small",
            "privacy_unit": "record",
            "accounting": "approx",
            "composition": "advanced",
            "budget": {"epsilon": 1, "delta": 1e-6},
            "windows": [{"period": "1d", "epsilon": 1e-6}],
        },
    ).get_json()
    assert "state epsilon at least 0.000007619" in small["errors"][0]["message"]


def test_costs_show_the_release_and_losses_the_filter(api: Api) -> None:
    _advanced(api, composition_delta=1e-6)
    reply = api.post(
        "/v1/charges",
        {**_laplace(partitions=["a", "b"], release="parallel"), "input": {"values": [1.0, 2.0]}},
    )
    assert reply.status_code == 201, reply.get_json()
    charge = reply.get_json()
    assert unlabelled(charge["cost"]) == {"epsilon": 0.01, "delta": 0, "rho": 5e-05}
    assert unlabelled(charge["charged"]) == {"epsilon": 0.02, "delta": 0, "rho": 1e-04}
    entry = api.ledger(dataset="clicks")[-1]
    assert entry["cost"] == charge["cost"]
    # one release per partition: the max over partitions is one release's rho
    loss = entry["loss_after"]
    assert loss["rho"] == 5e-05
    with mpmath.workdps(50):
        exact = mpmath.mpf("5e-5") + 2 * mpmath.sqrt(mpmath.mpf("5e-5") * mpmath.log(10**6))
    assert float(exact) <= loss["epsilon"] <= float(exact) + 1e-9
    assert api.budget()["loss"] == loss


def test_the_dashboard_leads_with_the_filters_rho(api: Api, client: FlaskClient) -> None:
    _advanced(api, composition_delta=1e-6)
    for _ in range(3):
        api.post("/v1/charges", {**_laplace(epsilon=0.05), "input": {"values": [1.0]}})
    page = client.get("/dashboard/sign-in").get_data(as_text=True)
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token is not None
    client.post("/dashboard/sign-in", data={"api_key": ADMIN_KEY, "csrf": token.group(1)})
    html = client.get("/dashboard/datasets/clicks").get_data(as_text=True)
    budget = api.budget()
    assert "with advanced composition" in html and budget["composition_delta"] == 1e-6
    assert f'<span id="loss">{budget["loss"]["rho"]:g}</span>' in html
    assert f'<span id="loss-epsilon">{budget["loss"]["epsilon"]:.6g}</span>' in html
