"""Every reported amount names the field that adds up (docs/accounting.md, "Which figures add
up"): in it, loss + remaining = limit exactly, costs sum to the loss, and plan's count of
charges fits in what remains; an epsilon that does not add is repeated as epsilon_alone."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest

from accountant.exact import positional
from tests.conftest import Api

#: Per mode: the dataset's fields, one charge's mechanism and params, the measure, the fields
#: that add up, and whether epsilon is a conversion that does not add.
MODES: dict[str, tuple[dict[str, Any], str, dict[str, Any], str, list[str]]] = {
    "pure": ({"accounting": "pure"}, "laplace", {"epsilon": 0.05}, "epsilon", ["epsilon", "delta"]),
    "approx": (
        {"accounting": "approx"},
        "gaussian",
        {"epsilon": 0.05, "delta": 1e-8},
        "epsilon",
        ["epsilon", "delta"],
    ),
    "advanced": (
        {"accounting": "approx", "composition": "advanced"},
        "laplace",
        {"epsilon": 0.05},
        "rho",
        ["rho", "delta"],
    ),
    "zcdp": ({"accounting": "zcdp"}, "laplace", {"epsilon": 0.05}, "rho", ["rho"]),
    "rdp": ({"accounting": "rdp"}, "laplace", {"epsilon": 0.05}, "rdp", ["rdp"]),
    "gdp": ({"accounting": "gdp"}, "gaussian", {"sigma": 10}, "mu2", ["mu2"]),
}


def _json(reply: Any) -> Any:
    """The answer with its numbers as the exact decimals of their text."""
    assert reply.status_code in (200, 201), reply.text
    return json.loads(reply.text, parse_float=Decimal)


def _labelled(amount: dict[str, Any], measure: str, additive: list[str]) -> None:
    """``amount`` names its measure and the fields that add; where epsilon does not add,
    it is repeated as epsilon_alone, and on gdp mu^2 stands beside mu."""
    assert amount["measure"] == measure, amount
    assert amount["additive"] == [name for name in additive if name in amount], amount
    assert measure in amount, amount
    if measure == "epsilon":
        assert "epsilon_alone" not in amount, amount
    else:
        assert amount["epsilon_alone"] == amount["epsilon"], amount
    if measure == "mu2":
        assert float(amount["mu"]) ** 2 == pytest.approx(float(amount["mu2"]), rel=1e-9), amount


def _adds_up(loss: dict[str, Any], remaining: dict[str, Any], limit: dict[str, Any]) -> None:
    for name in limit["additive"]:
        assert loss[name] + remaining[name] == limit[name], (name, loss, remaining, limit)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_loss_and_remaining_add_up_to_the_limit_in_the_measure(api: Api, mode: str) -> None:
    fields, mechanism, params, measure, additive = MODES[mode]
    budget = {"epsilon": 3} if mode == "pure" else {"epsilon": 3, "delta": 1e-6}
    api.make_dataset(
        budget=budget,
        partition_budget=budget,
        windows=[{"period": "1d", **budget}],
        **fields,
    )
    quota = {"epsilon": 2} if mode != "approx" else {"epsilon": 2, "delta": 1e-7}
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": quota}))
    body: dict[str, Any] = {"mechanism": mechanism, "params": {**params, "sensitivity": 1}}
    charges = [_json(service.charge(**body)) for _ in range(3)]
    for charge in charges:
        for name in ("cost", "charged", "remaining"):
            _labelled(charge[name], measure, additive)
    report = _json(api.get("/v1/datasets/clicks/budget"))
    # one partition, joint releases: the loss is the sum of what the charges charged
    assert report["loss"][measure] == sum(c["charged"][measure] for c in charges)
    assert charges[-1]["remaining"] == report["remaining"]
    for name in ("loss", "limit", "remaining", "partition_limit"):
        _labelled(report[name], measure, additive)
    _adds_up(report["loss"], report["remaining"], report["limit"])
    partitions = report["partitions"]
    _adds_up(partitions["max_spent"], partitions["remaining"], report["partition_limit"])
    window = report["windows"][0]
    for name in ("loss", "limit", "remaining"):
        _labelled(window[name], measure, additive)
    _adds_up(window["loss"], window["remaining"], window["limit"])
    # /metrics' utilisation is the share of the limit used in the measure
    metrics = api.get("/metrics").text
    found = re.search(
        r'accountant_budget_utilisation\{dataset="clicks",scope="dataset"\} (\S+)', metrics
    )
    assert found, metrics
    share = report["loss"][measure] / report["limit"][measure]
    assert float(found.group(1)) == pytest.approx(float(share), rel=1e-5)
    use = _json(service.get("/v1/consumers/me"))["use"]["clicks"]
    for name in ("loss", "quota", "remaining"):
        _labelled(use[name], measure, additive)
    _adds_up(use["loss"], use["remaining"], use["quota"])
    for entry in api.ledger(dataset="clicks"):
        for name in ("cost", "charged", "loss_after"):
            _labelled(entry[name], measure, additive)
    # a preview takes one cost off what remains, in the measure
    charge = {"dataset": "clicks", "partitions": ["p1"], **body}
    preview = _json(api.post("/v1/charges/preview", charge))
    _labelled(preview["cost"], measure, additive)
    _labelled(preview["remaining_after"], measure, additive)
    after = preview["remaining_after"][measure]
    assert after == report["remaining"][measure] - preview["cost"][measure]
    # plan: fits charges of that cost fit in what remains, one more does not (the quota binds)
    plan = _json(service.post("/v1/charges/plan", charge))
    _labelled(plan["cost"], measure, additive)
    fits, each = plan["fits"], plan["cost"]
    left = {
        n: min(report["remaining"][n], use["remaining"].get(n, report["remaining"][n]))
        for n in additive
    }
    assert all(fits * each[n] <= left[n] for n in additive)
    assert any(left[n] < (fits + 1) * each[n] for n in additive)


def test_the_issues_example_epsilons_do_not_add_rdp_does(api: Api) -> None:
    """docs/accounting.md, "Which figures add up": on rdp (3, 1e-6), a Laplace release of
    epsilon 0.05 is epsilon 1.359 by itself; after three of them the epsilon of the loss and
    the epsilon of what remains add up to 4.35 against a limit of 3, while in rdp the loss
    and what remains add up to the limit exactly, and 149 more releases fit."""
    api.make_dataset(accounting="rdp", budget={"epsilon": 3, "delta": 1e-6})
    body: dict[str, Any] = {"mechanism": "laplace", "params": {"epsilon": 0.05, "sensitivity": 1}}
    charges = [_json(api.charge(**body)) for _ in range(3)]
    cost = charges[0]["cost"]
    assert cost["rdp"] == Decimal("0.010841152263") and cost["order"] == Decimal("8.926")
    assert cost["epsilon_alone"] == Decimal("1.358907755")
    report = _json(api.get("/v1/datasets/clicks/budget"))
    loss, remaining, limit = report["loss"], report["remaining"], report["limit"]
    assert (loss["epsilon"], remaining["epsilon"], limit["epsilon"]) == (
        Decimal("1.38059006"),
        Decimal("2.967476544"),
        Decimal("3.0"),
    )
    assert loss["epsilon"] + remaining["epsilon"] > limit["epsilon"]
    assert (loss["rdp"], remaining["rdp"], limit["rdp"]) == (
        Decimal("0.032523456789"),
        Decimal("1.619409940797"),
        Decimal("1.651933397586"),
    )
    assert loss["rdp"] + remaining["rdp"] == limit["rdp"]
    charge = {"dataset": "clicks", "partitions": ["p1"], **body}
    plan = _json(api.post("/v1/charges/plan", charge))
    assert plan["fits"] == 149 and 149 * cost["rdp"] <= remaining["rdp"] < 150 * cost["rdp"]


@pytest.mark.parametrize("mode", ["rdp", "gdp"])
def test_a_denial_states_the_measure_and_the_epsilon_beside_it(api: Api, mode: str) -> None:
    """The denial's amounts are labelled, and its detail states the figures that add up,
    with the epsilon of the limit and of the spend beside them and the request's own."""
    fields, mechanism, params, measure, additive = MODES[mode]
    api.make_dataset(budget={"epsilon": 1, "delta": 1e-6}, **fields)
    body: dict[str, Any] = {"mechanism": mechanism, "params": {**params, "sensitivity": 1}}
    while (reply := api.charge(**body)).status_code == 201:
        pass
    assert reply.status_code == 409
    problem = json.loads(reply.text, parse_float=Decimal)
    for name in ("limit", "spent", "requested"):
        _labelled(problem[name], measure, additive)
    limit, spent, requested = problem["limit"], problem["spent"], problem["requested"]
    assert spent[measure] <= limit[measure] < spent[measure] + requested[measure]
    words = [
        f"limit {measure} {positional(limit[measure])} (epsilon {positional(limit['epsilon'])})",
        f"spent {measure} {positional(spent[measure])} (epsilon {positional(spent['epsilon'])})",
        f"requested {measure} {positional(requested[measure])} "
        f"(epsilon {positional(requested['epsilon'])} by itself)",
    ]
    assert ", ".join(words) in problem["detail"], problem["detail"]
