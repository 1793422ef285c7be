"""POST /v1/charges/plan: how many more identical charges fit, checked by charging them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import Api, unlabelled

# (dataset fields, charge fields, charges made first)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], int]] = {
    "lifetime": ({"budget": {"epsilon": 1}}, {"epsilon": 0.1}, 3),
    "partition": (
        {"budget": {"epsilon": 10}, "partition_budget": {"epsilon": 1}},
        {"epsilon": 0.3, "partitions": ["p1", "p2"]},
        1,
    ),
    "window": (
        {"budget": {"epsilon": 10}, "windows": [{"period": "1d", "epsilon": 0.5}]},
        {"epsilon": 0.2},
        0,
    ),
    "user top-k": (
        {"privacy_unit": "user", "max_partitions_per_user": 2, "budget": {"epsilon": 1}},
        {"epsilon": 0.1, "partitions": ["a", "b", "c"], "release": "parallel"},
        1,
    ),
    "approx delta": (
        {"accounting": "approx", "budget": {"epsilon": 100, "delta": 1e-6}},
        {"mechanism": "gaussian", "params": {"epsilon": 0.5, "delta": 3e-7, "sensitivity": 1}},
        0,
    ),
    "zcdp": (
        {"accounting": "zcdp", "budget": {"epsilon": 1, "delta": 1e-6}},
        {"mechanism": "gaussian", "params": {"sigma": 100, "sensitivity": 1}},
        7,
    ),
}


def _body(charge: dict[str, Any]) -> dict[str, Any]:
    return {
        "dataset": "clicks",
        "partitions": charge.get("partitions", ["p1"]),
        "release": charge.get("release", "joint"),
        "mechanism": charge.get("mechanism", "laplace"),
        "params": charge.get("params", {"epsilon": charge.get("epsilon"), "sensitivity": 1}),
    }


@pytest.mark.frozen_clock  # the window case's charges all fall in one day
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plan_equals_what_charging_grants(api: Api, case: str) -> None:
    dataset, charge, before = CASES[case]
    api.make_dataset(**dataset)
    body = _body(charge)
    for _ in range(before):
        assert api.post("/v1/charges", {**body, "input": {"values": [1.0]}}).status_code == 201
    entries = len(api.ledger())
    planned = api.post("/v1/charges/plan", body)
    assert planned.status_code == 200, planned.get_json()
    plan = planned.get_json()
    assert len(api.ledger()) == entries  # nothing charged, nothing ledgered
    granted = 0
    while (
        reply := api.post("/v1/charges", {**body, "input": {"values": [1.0]}})
    ).status_code == 201:
        granted += 1
        assert granted <= plan["fits"]
    assert granted == plan["fits"] > 0
    refusal = reply.get_json()
    assert plan["limited_by"]["scope"] == refusal["scope"]
    assert plan["limited_by"]["partition"] == refusal.get("partition")
    if refusal["scope"] == "window":
        assert plan["limited_by"]["resets_at"] == refusal["resets_at"]
    again = api.post("/v1/charges/plan", body).get_json()
    assert again["fits"] == 0 and again["limited_by"]["scope"] == refusal["scope"]


def test_the_lifetime_plan_counts_and_names_the_scope(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    plan = api.post("/v1/charges/plan", _body({"epsilon": 0.1})).get_json()
    assert plan["fits"] == 10
    assert plan["limited_by"] == {"scope": "dataset", "partition": None}
    assert unlabelled(plan["cost"]) == {"epsilon": 0.1, "delta": 0}


def test_auditors_may_plan_and_services_only_their_datasets(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    api.make_dataset("other", budget={"epsilon": 1})
    auditor = api.as_key(api.make_consumer("audit", role="auditor"))
    assert auditor.post("/v1/charges/plan", _body({"epsilon": 0.5})).get_json()["fits"] == 2
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    assert service.post("/v1/charges/plan", _body({"epsilon": 0.5})).status_code == 200
    other = service.post("/v1/charges/plan", {**_body({"epsilon": 0.5}), "dataset": "other"})
    assert other.status_code == 403


def _plan(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    reply = api.post("/v1/charges/plan", body)
    assert reply.status_code == 200, reply.get_json()
    return dict(reply.get_json())


def test_count_solves_for_the_least_noise_sigma(api: Api) -> None:
    api.make_dataset(accounting="zcdp", budget={"epsilon": 1, "delta": 1e-6})
    body = {**_body({"mechanism": "gaussian", "params": {"sensitivity": 1}}), "count": 100}
    sigma = _plan(api, body)["params"]["sigma"]
    assert 40 < sigma < 50  # rho* / 100 = 2.4e-4 each: sigma = sqrt(1 / (2 rho)) = 45.3
    plain = _body({"mechanism": "gaussian", "params": {"sigma": sigma, "sensitivity": 1}})
    assert _plan(api, plain)["fits"] >= 100
    less = _body(
        {"mechanism": "gaussian", "params": {"sigma": sigma * (1 - 1e-6), "sensitivity": 1}}
    )
    assert _plan(api, less)["fits"] < 100


def test_count_on_approx_tells_how_to_solve_a_gaussian_for_epsilon(api: Api) -> None:
    """Left without sigma or epsilon, a gaussian is solved for sigma, which an approx
    dataset does not price: the refusal says to state delta; with it, epsilon is solved."""
    api.make_dataset(accounting="approx", budget={"epsilon": 1, "delta": 1e-6})
    body = {**_body({"mechanism": "gaussian", "params": {"sensitivity": 1}}), "count": 4}
    refused = api.post("/v1/charges/plan", body)
    assert refused.status_code == 400
    assert "state delta, and the plan solves for epsilon" in refused.get_json()["detail"]
    stated = {**body, "params": {"sensitivity": 1, "delta": 1e-7}}
    assert _plan(api, stated)["params"] == {"epsilon": 0.25}


def test_count_and_weights_solve_a_record_level_sensitivity(api: Api) -> None:
    """API.md: any built-in may add ``"sensitivity_unit": "record"`` on a user dataset, and a
    plan takes a charge body. r = 2 rows per person: randomized response then costs 2 epsilon
    per release, so 4 of a unit budget leave epsilon 0.125 each, granted 4 times and refused
    a fifth; a laplace's sensitivity is doubled instead, so its epsilon stays 0.25."""
    api.make_dataset(privacy_unit="user", max_records_per_user=2, max_partitions_per_user=1)
    record = {"sensitivity_unit": "record"}
    response = {"mechanism": "randomized_response", "params": record, "release": "parallel"}
    assert _plan(api, {**_body(response), "count": 4})["params"] == {"epsilon": 0.125}
    laplace = {"params": {"sensitivity": 1, **record}, "release": "parallel"}
    assert _plan(api, {**_body(laplace), "count": 4})["params"] == {"epsilon": 0.25}
    weighted = {"items": [{**_body(response), "weight": 1}, {**_body(laplace), "weight": 1}]}
    assert [item["params"] for item in _plan(api, weighted)["items"]] == [
        {"epsilon": 0.25},
        {"epsilon": 0.5},
    ]
    for _ in range(4):
        reply = api.charge(
            mechanism="randomized_response",
            params={"epsilon": 0.125, **record},
            release="parallel",
            input={"values": [True, False]},
        )
        assert reply.status_code == 201, reply.get_json()
    assert api.charge(params={"epsilon": 1e-6, "sensitivity": 1}).status_code == 409


def test_count_solves_for_the_largest_epsilon(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    body = {**_body({"params": {"sensitivity": 1}}), "count": 4}
    assert _plan(api, body)["params"] == {"epsilon": 0.25}
    for _ in range(4):
        assert api.charge(epsilon=0.25).status_code == 201
    assert api.charge(epsilon=1e-6).status_code == 409
    refused = api.post("/v1/charges/plan", body)
    assert refused.status_code == 400 and refused.get_json()["errors"][0]["field"] == "count"


PURE: dict[str, Any] = {"budget": {"epsilon": 1}}
# (dataset, charge without the solved parameter, count, the parameter, the least-noise value
# at 9 significant digits, worked out by hand)
LEAST_NOISE: dict[str, tuple[dict[str, Any], dict[str, Any], int, str, float]] = {
    # 20 epsilon <= 1: 1/20, exactly
    "pure laplace, exact": (PURE, {"params": {"sensitivity": 1}}, 20, "epsilon", 0.05),
    # 3 epsilon <= 1: 1/3 is no 9-digit number, so 0.333333333, toward more noise
    "pure laplace, rounded": (PURE, {"params": {"sensitivity": 1}}, 3, "epsilon", 0.333333333),
    # (epsilon, 1e-7) ten times within (1, 1e-6): 1/10, exactly
    "approx gaussian, exact": (
        {"accounting": "approx", "budget": {"epsilon": 1, "delta": 1e-6}},
        {"mechanism": "gaussian", "params": {"delta": 1e-7, "sensitivity": 1}},
        10,
        "epsilon",
        0.1,
    ),
    # rho = epsilon^2 / 2 four times within rho 0.02: epsilon = 1/10, exactly
    "zcdp laplace, exact": (
        {"accounting": "zcdp", "budget": {"epsilon": 1, "delta": 1e-6, "rho": 0.02}},
        {"params": {"sensitivity": 1}},
        4,
        "epsilon",
        0.1,
    ),
    # rho = 1 / (2 sigma^2) four times within rho 0.08: sigma = 5, exactly
    "zcdp gaussian sigma, exact": (
        {"accounting": "zcdp", "budget": {"epsilon": 1, "delta": 1e-6, "rho": 0.08}},
        {"mechanism": "gaussian", "params": {"sensitivity": 1}},
        4,
        "sigma",
        5.0,
    ),
    # twice within rho 0.5: sigma = sqrt(2) = 1.414213562..., up to 1.41421357
    "zcdp gaussian sigma, rounded": (
        {"accounting": "zcdp", "budget": {"epsilon": 1, "delta": 1e-6, "rho": 0.5}},
        {"mechanism": "gaussian", "params": {"sensitivity": 1}},
        2,
        "sigma",
        1.41421357,
    ),
}


@pytest.mark.parametrize("case", sorted(LEAST_NOISE))
def test_count_answers_the_least_noise_that_fits_exactly(api: Api, case: str) -> None:
    """The answer is the least-noise 9-digit value: an exact fit when there is one, else the
    next value toward more noise; count charges at it are granted and one more is not, and
    one unit of the 9th digit less noise lets fewer than count fit."""
    dataset, charge, count, name, expected = LEAST_NOISE[case]
    api.make_dataset(**dataset)
    assert _plan(api, {**_body(charge), "count": count})["params"] == {name: expected}
    step = Decimal(1).scaleb(Decimal(repr(expected)).adjusted() - 8)
    less_noise = Decimal(repr(expected)) + (step if name != "sigma" else -step)
    closer = _body({**charge, "params": {**charge["params"], name: float(less_noise)}})
    assert _plan(api, closer)["fits"] < count
    body = {
        **_body({**charge, "params": {**charge["params"], name: expected}}),
        "input": {"values": [1.0]},
    }
    for _ in range(count):
        assert api.post("/v1/charges", body).status_code == 201
    refused = api.post("/v1/charges", body)
    assert refused.status_code == 409, refused.get_json()
