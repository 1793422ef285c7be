"""Batches: release plans granted all together or not at all (DESIGN.md, "Release plans:
batches"; API.md, "Batches")."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from accountant.services import totals
from tests.conftest import Api


def _item(
    dataset: str = "clicks", partitions: Any = ("p1",), epsilon: Any = 0.1, **extra: Any
) -> dict[str, Any]:
    return {
        "dataset": dataset,
        "partitions": partitions if isinstance(partitions, str) else list(partitions),
        "mechanism": extra.pop("mechanism", "laplace"),
        "params": extra.pop("params", {"epsilon": epsilon, "sensitivity": 1}),
        "input": extra.pop("input", {"values": [10.0]}),
        **extra,
    }


def _batch(api: Api, items: list[dict[str, Any]], **fields: Any) -> Any:
    headers = fields.pop("headers", None)
    return api.post("/v1/charges/batch", {"items": items, **fields}, headers=headers)


def _reconciles(app: Any) -> None:
    engine = app.extensions["accountant_engine"]
    with Session(engine) as session:
        replayed, differences = totals.check(session)
    assert differences == [] and replayed > 0


def test_a_granted_batch_charges_every_item_with_its_own_output_and_receipt(
    api: Api, app: Any
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    api.make_dataset("orders", budget={"epsilon": 1.0})
    response = _batch(
        api,
        [_item(epsilon=0.25), _item("orders", epsilon=0.5), _item(partitions=["p2"], epsilon=0.25)],
    )
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    assert len(body["items"]) == 3
    assert body["cost"]["clicks"]["epsilon"] == 0.5 and body["cost"]["orders"]["epsilon"] == 0.5
    for item in body["items"]:
        assert item["batch_id"] == body["batch_id"] and len(item["output"]["values"]) == 1
        verified = api.post("/v1/receipts/verify", {"receipt": item["receipt"]}).get_json()
        assert verified["valid"] is True and verified["claims"]["charge_id"] == item["charge_id"]
        assert verified["claims"]["batch_id"] == body["batch_id"]
        assert "group" not in verified["claims"]  # priced alone: its cost is its own
    assert api.budget()["loss"]["epsilon"] == 0.25  # record unit: the max over p1, p2
    assert api.budget("orders")["loss"]["epsilon"] == 0.5
    entries = [e for e in api.ledger() if e["batch_id"] == body["batch_id"]]
    assert sorted(e["charge_id"] for e in entries) == sorted(i["charge_id"] for i in body["items"])
    assert all(e["status"] == "granted" for e in entries)
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    _reconciles(app)


def test_items_add_up_and_a_refused_batch_charges_and_releases_nothing(api: Api, app: Any) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    response = _batch(api, [_item(epsilon=0.6), _item(epsilon=0.6)])  # each fits alone
    assert response.status_code == 409, response.get_json()
    problem = response.get_json()
    [denial] = problem["denials"]
    assert denial["item"] == 1 and denial["dataset"] == "clicks" and denial["scope"] == "dataset"
    assert denial["limit"]["epsilon"] == 1.0 and denial["spent"]["epsilon"] == 0
    assert denial["requested"]["epsilon"] == 1.2
    assert "output" not in str(problem)
    assert api.budget()["loss"]["epsilon"] == 0
    entries = api.ledger()
    refusals = [e for e in entries if e["batch_id"] == problem["batch_id"]]
    assert [(e["kind"], e["status"]) for e in refusals] == [("charge", "denied")]
    assert not [e for e in entries if e["status"] == "granted" and e["kind"] == "charge"]
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    # the same two one by one: the first is granted
    assert api.charge(epsilon=0.6).status_code == 201
    assert api.charge(epsilon=0.6).status_code == 409
    _reconciles(app)


def test_a_refusal_lists_every_overflowing_scope_on_every_dataset(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0}, partition_budget={"epsilon": 0.3})
    api.make_dataset("orders", budget={"epsilon": 0.5})
    api.make_dataset("tickets", budget={"epsilon": 1.0})
    items = [
        _item(epsilon=0.2),  # 0: clicks p1 0.2
        _item("orders", epsilon=0.4),  # 1
        _item("tickets", epsilon=0.1),  # 2: fits
        _item(epsilon=0.2),  # 3: clicks p1 over its 0.3
        _item("orders", epsilon=0.4),  # 4: orders over 0.5
        _item(partitions=["p2", "p3"], epsilon=0.2),  # 5: fits p2 and p3
    ]
    response = _batch(api, items)
    assert response.status_code == 409, response.get_json()
    denials = {(d["dataset"], d["scope"]): d for d in response.get_json()["denials"]}
    assert set(denials) == {("clicks", "partition"), ("orders", "dataset")}
    assert denials["clicks", "partition"]["item"] == 3
    assert denials["clicks", "partition"]["partition"] == "p1"
    assert denials["orders", "dataset"]["item"] == 4
    assert denials["orders", "dataset"]["requested"]["epsilon"] == 0.8
    refusals = [e for e in api.ledger() if e["status"] == "denied"]
    assert sorted(e["dataset"] for e in refusals) == ["clicks", "orders", "tickets"]
    for name in ("clicks", "orders", "tickets"):
        assert api.budget(name)["loss"]["epsilon"] == 0


@pytest.mark.frozen_clock
def test_only_windows_overflowing_is_a_429_with_a_retry_after(api: Api) -> None:
    windows = [{"period": "1d", "epsilon": 1.0}, {"period": "1h", "epsilon": 1.0}]
    api.make_dataset(budget={"epsilon": 10.0}, windows=windows)
    assert api.charge(epsilon=0.5).status_code == 201
    response = _batch(api, [_item(epsilon=0.3), _item(epsilon=0.3)])
    assert response.status_code == 429, response.get_json()
    # 10:30: the hour resets at 11:00, the day at midnight, after which a retry may fit
    assert response.headers["Retry-After"] == str(int(13.5 * 3600))
    assert response.get_json()["resets_at"] == "2026-03-03T00:00:00Z"
    denials = response.get_json()["denials"]
    assert {d["scope"] for d in denials} == {"window"}
    assert {d["resets_at"] for d in denials} == {"2026-03-02T11:00:00Z", "2026-03-03T00:00:00Z"}
    # a batch that could never fit the window is a 409: waiting would not help
    response = _batch(api, [_item(epsilon=0.6), _item(epsilon=0.6), _item(epsilon=0.6)])
    assert response.status_code == 409


def test_an_invalid_item_is_a_400_naming_it(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    api.make_dataset("orders", budget={"epsilon": 1.0})
    response = _batch(api, [_item(), _item(params={"epsilon": -1, "sensitivity": 1})])
    assert response.status_code == 400
    fields = [e["field"] for e in response.get_json()["errors"]]
    assert fields == ["items[1].params.epsilon"], fields
    response = _batch(api, [_item(), _item(mechanism="nope")])
    assert [e["field"] for e in response.get_json()["errors"]] == ["items[1].mechanism"]
    response = _batch(api, [_item(), _item(partitions="*"), _item()])
    assert response.status_code == 201  # "*": the partitions the items before it charged
    assert response.get_json()["items"][1]["partitions"] == ["p1"]
    response = _batch(api, [_item("orders", partitions="*"), _item()])
    assert response.status_code == 400  # "*" resolves to none yet
    assert [e["field"] for e in response.get_json()["errors"]] == ["items[0].partitions"]
    response = _batch(api, [_item(hold="x")])
    assert [e["field"] for e in response.get_json()["errors"]] == ["items[0].hold"]
    response = api.post("/v1/charges/batch", {"items": [_item(), 5]})
    assert [e["field"] for e in response.get_json()["errors"]] == ["items[1]"]
    raw = json.dumps({"items": [_item(), _item(epsilon=0.5)]}).replace("0.5", "NaN")
    for path in ("/v1/charges/batch", "/v1/charges/plan"):
        response = api.post(path, raw=raw)
        assert response.status_code == 400
        assert [e["field"] for e in response.get_json()["errors"]] == ["items[1].params.epsilon"]
    assert _batch(api, []).status_code == 400
    assert _batch(api, [_item()] * 1001).status_code == 400
    assert api.budget()["loss"]["epsilon"] == 0.3
    assert len([e for e in api.ledger() if e["kind"] == "charge"]) == 3


def test_an_unknown_dataset_is_a_404_and_an_ungranted_one_a_403(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    api.make_dataset("orders", budget={"epsilon": 1.0})
    response = _batch(api, [_item(), _item("nope"), _item("nope")])
    assert response.status_code == 404
    assert response.get_json()["detail"].startswith("items[1]: "), response.get_json()
    key = api.make_consumer("svc", datasets=["clicks"])
    service = Api(api.client, key)
    response = _batch(service, [_item(), _item("orders")])
    assert response.status_code == 403, response.get_json()
    assert "items[1]" in response.get_json()["detail"]
    assert api.budget()["loss"]["epsilon"] == 0


def test_a_batch_is_idempotent_as_a_whole(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    items = [_item(epsilon=0.25), _item(epsilon=0.25, input={"values": [1.0, 2.0, 3.0]})]
    first = _batch(api, items, headers={"Idempotency-Key": "report-1"})
    assert first.status_code == 201
    again = _batch(api, items, headers={"Idempotency-Key": "report-1"})
    assert again.status_code == 201 and again.text == first.text
    assert api.budget()["loss"]["epsilon"] == 0.5
    other = _batch(api, items[:1], headers={"Idempotency-Key": "report-1"})
    assert other.status_code == 422
    refused = [_item(epsilon=0.3), _item(epsilon=0.3)]
    denied = _batch(api, refused, headers={"Idempotency-Key": "report-2"})
    assert denied.status_code == 409
    assert _batch(api, refused, headers={"Idempotency-Key": "report-2"}).text == denied.text
    assert len([e for e in api.ledger() if e["status"] == "denied"]) == 1


def _planned(api: Api, items: list[dict[str, Any]], **fields: Any) -> Any:
    return api.post("/v1/charges/plan", {"items": items, **fields})


def test_a_weighted_plan_splits_what_remains_and_its_answer_is_granted_as_a_batch(
    api: Api,
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    assert api.charge(epsilon=0.2).status_code == 201
    items = [
        {**_item(), "params": {"sensitivity": 1}, "weight": 1},
        {**_item(partitions=["p2"]), "params": {"sensitivity": 1}, "weight": 3},
        {**_item(), "params": {"sensitivity": 1}, "weight": 3},
    ]
    response = _planned(api, items, share=0.5)
    assert response.status_code == 200, response.get_json()
    answer = response.get_json()
    epsilons = [Decimal(str(item["params"]["epsilon"])) for item in answer["items"]]
    # p1 carries items 0 and 2 (weights 1 and 3) within half of the 0.8 left: 0.1 and 0.3
    assert epsilons == [Decimal("0.1"), Decimal("0.3"), Decimal("0.3")], epsilons
    chosen = [
        {**_item(partitions=item["partitions"]), "params": {"sensitivity": 1, **planned["params"]}}
        for item, planned in zip(items, answer["items"], strict=True)
    ]
    assert _batch(api, chosen).status_code == 201
    assert api.budget()["loss"]["epsilon"] == 0.6  # 0.2 + half of what was left
    # all of what is left now: one digit less noise on either item on p1 does not fit
    answer = _planned(api, items).get_json()
    chosen = [
        {**_item(partitions=item["partitions"]), "params": {"sensitivity": 1, **planned["params"]}}
        for item, planned in zip(items, answer["items"], strict=True)
    ]
    assert [c["params"]["epsilon"] for c in chosen] == [0.1, 0.3, 0.3]
    for i in (0, 2):
        tighter = [dict(item, params=dict(item["params"])) for item in chosen]
        tighter[i]["params"]["epsilon"] += 1e-10
        assert _batch(api, tighter).status_code == 409
    # nor one digit less on every item: the answer is the largest common scale (API.md).
    # Item 1 alone could take less (p2 has room left), but its share is set by its weight.
    tighter = [
        dict(item, params={**item["params"], "epsilon": item["params"]["epsilon"] + 1e-10})
        for item in chosen
    ]
    assert _batch(api, tighter).status_code == 409
    assert _batch(api, chosen).status_code == 201
    assert api.budget()["loss"]["epsilon"] == 1.0


def test_a_weighted_plan_finds_the_least_noise_in_every_mode(api: Api) -> None:
    api.make_dataset(accounting="zcdp", budget={"epsilon": 1.0, "delta": 1e-6})
    items = [
        {**_item(mechanism="gaussian"), "params": {"sensitivity": 1}, "weight": 1},
        {**_item(mechanism="laplace"), "params": {"sensitivity": 1}, "weight": 2},
    ]
    answer = _planned(api, items).get_json()
    sigma = Decimal(str(answer["items"][0]["params"]["sigma"]))
    epsilon = Decimal(str(answer["items"][1]["params"]["epsilon"]))
    chosen = [
        {**_item(mechanism="gaussian"), "params": {"sensitivity": 1, "sigma": float(sigma)}},
        {**_item(), "params": {"sensitivity": 1, "epsilon": float(epsilon)}},
    ]
    assert _batch(api, chosen).status_code == 201, answer
    loss = api.budget()["loss"]
    # rho of the gaussian is 1/(2 sigma^2), the laplace's epsilon^2/2: weights 1 and 2
    rho_gaussian = 1 / (2 * float(sigma) ** 2)
    assert abs(float(epsilon) ** 2 / 2 / rho_gaussian - 2) < 1e-6
    assert loss["rho"] <= api.budget()["limit"]["rho"]


def _gaussians(count: int, partitions: Any = ("p1",), sigma: float = 10) -> list[dict[str, Any]]:
    return [
        _item(
            partitions=partitions, mechanism="gaussian", params={"sigma": sigma, "sensitivity": 1}
        )
        for _ in range(count)
    ]


def _reference(laplace_epsilons: list[float], gaussian_sigmas: list[float], delta: float) -> float:
    """dp_accounting's pessimistic PLD epsilon of the continuous mechanisms, composed."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    composed = None
    for epsilon in laplace_epsilons:
        one = pld.from_laplace_mechanism(1 / epsilon, value_discretization_interval=1e-4)
        composed = one if composed is None else composed.compose(one)
    for sigma in gaussian_sigmas:
        one = pld.from_gaussian_mechanism(sigma, value_discretization_interval=1e-4)
        composed = one if composed is None else composed.compose(one)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(delta))


def test_a_fixed_plan_of_gaussians_is_composed_tightly_on_an_approx_dataset(api: Api) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 10.0, "delta": 1e-5})
    response = _batch(api, _gaussians(100), delta=1e-6)
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    charged = body["cost"]["clicks"]
    from dp_accounting.pld import privacy_loss_distribution as pld

    reference = float(
        pld.from_gaussian_mechanism(10, value_discretization_interval=1e-4)
        .self_compose(100)
        .get_epsilon_for_delta(1e-6)
    )
    assert reference <= charged["epsilon"] <= 1.02 * reference, (charged, reference)
    assert abs(charged["epsilon"] - 4.8866) < 0.01 and charged["delta"] == 1e-6
    assert api.budget()["loss"]["epsilon"] == charged["epsilon"]  # the group's cost, split
    entries = [e for e in api.ledger() if e["batch_id"] == body["batch_id"]]
    assert len(entries) == 100 and {e["group"] for e in entries} == {0}
    total = sum(Decimal(str(e["cost"]["epsilon"])) for e in entries)
    group_cost = Decimal(entries[0]["detail"]["group_cost"]["epsilon"])
    assert total >= group_cost and entries[0]["detail"]["batch_delta"] == "0.000001"
    assert all(item["group"] == 0 for item in body["items"])
    # an item's cost is its share of the group's: its receipt and its record say so
    item = body["items"][0]
    claims = api.post("/v1/receipts/verify", {"receipt": item["receipt"]}).get_json()["claims"]
    assert (claims["batch_id"], claims["group"]) == (body["batch_id"], 0)
    assert claims["group_cost"] == {"epsilon": float(group_cost), "delta": 1e-6}
    assert claims["batch_delta"] == 1e-6 and claims["cost"]["epsilon"] * 100 >= group_cost
    record = api.get(f"/v1/charges/{item['charge_id']}").get_json()
    assert (record["batch_id"], record["group"], record["group_cost"]) == (
        body["batch_id"],
        0,
        claims["group_cost"],
    )
    exported = api.get("/v1/ledger/export?format=csv&dataset=clicks").text
    rows = [r for r in csv.DictReader(io.StringIO(exported)) if r["batch_id"] == body["batch_id"]]
    assert len(rows) == 100 and {r["group"] for r in rows} == {"0"}


def test_groups_are_joint_releases_over_the_same_partitions(api: Api) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 100.0, "delta": 1e-5})
    items = [
        *_gaussians(2, ("p1", "p2")),
        *_gaussians(1, ("p2", "p1")),  # the same set: the same group
        *_gaussians(2, ("p3",)),
        {**_gaussians(1, ("p4", "p5"))[0], "release": "parallel"},  # a group of its own
        _item(partitions=["p3"], epsilon=0.5),  # laplace, composed with p3's gaussians
    ]
    body = _batch(api, items, delta=1e-6).get_json()
    assert [item["group"] for item in body["items"]] == [0, 0, 0, 1, 1, 2, 1]


def test_without_delta_every_item_is_priced_alone(api: Api) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 10.0, "delta": 1e-5})
    response = _batch(api, _gaussians(2))
    assert response.status_code == 400  # a gaussian stated by sigma needs a batch delta
    assert [e["field"] for e in response.get_json()["errors"]] == ["items[0].params"]
    item = _item(mechanism="gaussian", params={"epsilon": 0.5, "delta": 1e-7, "sensitivity": 1})
    body = _batch(api, [item, item]).get_json()
    assert body["cost"]["clicks"]["epsilon"] == 1.0 and "group" not in body["items"][0]


@pytest.mark.parametrize("laplaces,gaussians", [(50, 50)])
def test_a_mixed_plan_is_never_charged_below_the_reference(
    api: Api, laplaces: int, gaussians: int
) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 100.0, "delta": 1e-5})
    items = [_item(epsilon=0.1) for _ in range(laplaces)] + _gaussians(gaussians)
    charged = _batch(api, items, delta=1e-6).get_json()["cost"]["clicks"]["epsilon"]
    reference = _reference([0.1] * laplaces, [10.0] * gaussians, 1e-6)
    print(f"mixed plan: charged {charged}, dp_accounting {reference}, basic 5 + more")
    assert reference <= charged <= 1.02 * reference


_plans_made = iter(range(10**6))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    laplace=st.lists(st.sampled_from([0.05, 0.1, 0.3, 1.0]), max_size=6),
    gaussian=st.lists(st.sampled_from([1.0, 3.0, 10.0, 30.0]), max_size=6),
    delta=st.sampled_from([1e-9, 1e-6, 1e-3]),
)
def test_a_random_plan_is_never_charged_below_dp_accountings_pld(
    api: Api, laplace: list[float], gaussian: list[float], delta: float
) -> None:
    if not laplace and not gaussian:
        return
    name = f"plan{next(_plans_made)}"
    api.make_dataset(name, accounting="approx", budget={"epsilon": 1000.0, "delta": 0.5})
    items = [_item(name, epsilon=e) for e in laplace] + [
        _item(name, mechanism="gaussian", params={"sigma": s, "sensitivity": 1}) for s in gaussian
    ]
    response = _batch(api, items, delta=delta)
    assert response.status_code == 201, response.get_json()
    charged = response.get_json()["cost"][name]
    assert charged["epsilon"] >= _reference(laplace, gaussian, delta)
    assert delta <= charged["delta"] <= delta * (1 + 1e-6)  # each item's share rounded up


def test_advanced_composition_datasets_price_every_item_alone(api: Api) -> None:
    api.make_dataset(
        accounting="approx",
        composition="advanced",
        composition_delta=1e-6,
        budget={"epsilon": 3.0, "delta": 1e-5},
    )
    response = _batch(api, _gaussians(100), delta=1e-6)
    assert response.status_code == 400  # a gaussian by sigma cannot be priced alone
    item = _item(mechanism="gaussian", params={"epsilon": 0.2, "delta": 1e-8, "sensitivity": 1})
    body = _batch(api, [item, item], delta=1e-6).get_json()
    assert "group" not in body["items"][0]  # the filter needs each release's own cost
    assert body["items"][0]["cost"]["epsilon"] == 0.2


def test_a_star_item_must_charge_the_partitions_its_group_was_priced_for(api: Api) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 100.0, "delta": 1e-5})
    assert api.charge(partitions=["a"], epsilon=0.1).status_code == 201
    items = [_item(partitions=["b"], epsilon=0.1), *_gaussians(3, ("a",))]
    items.append({**_gaussians(1, "*")[0]})  # priced with {a}, would charge {a, b}
    response = _batch(api, items, delta=1e-6)
    assert response.status_code == 400, response.get_json()
    assert [e["field"] for e in response.get_json()["errors"]] == ["items[4].partitions"]


def test_a_partition_denial_states_the_partitions_own_figures(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10.0}, partition_budget={"epsilon": 1.0})
    assert api.charge(partitions=["p2"], epsilon=0.6).status_code == 201
    response = _batch(api, [_item(partitions=["p1", "p2"], epsilon=0.1), _item(epsilon=0.95)])
    assert response.status_code == 409
    [denial] = response.get_json()["denials"]
    assert denial["scope"] == "partition" and denial["partition"] == "p1"
    assert denial["spent"]["epsilon"] == 0 and denial["requested"]["epsilon"] == 1.05
    assert denial["item"] == 1


def test_every_partition_a_batch_takes_over_its_limit_is_listed(api: Api) -> None:
    """A charge names the first partition over its limit; a refused batch lists each one,
    with its own figures and the first item that takes it over."""
    api.make_dataset(budget={"epsilon": 10.0}, partition_budget={"epsilon": 1.0})
    assert api.charge(partitions=["p2"], epsilon=0.5).status_code == 201
    items = [
        _item(partitions=["p1", "p2", "p3"], epsilon=0.4),
        _item(partitions=["p3", "p1", "p2"], epsilon=0.7),  # p3 1.1, p1 1.1, p2 1.6
    ]
    response = _batch(api, items)
    assert response.status_code == 409
    denials = response.get_json()["denials"]
    assert [(d["scope"], d["partition"], d["item"]) for d in denials] == [
        ("partition", "p3", 1),
        ("partition", "p1", 1),
        ("partition", "p2", 1),
    ]
    figures = {d["partition"]: (d["spent"]["epsilon"], d["requested"]["epsilon"]) for d in denials}
    assert figures == {"p1": (0, 1.1), "p2": (0.5, 1.1), "p3": (0, 1.1)}
    assert api.budget()["loss"]["epsilon"] == 0.5


def test_a_plan_of_gaussians_on_approx_without_a_delta_is_told_to_state_one(
    api: Api,
) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 10, "delta": 1e-5})
    item = {**_item(mechanism="gaussian"), "params": {"sensitivity": 1}, "weight": 1}
    response = _planned(api, [item])
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["errors"][0]["field"].startswith("items[0]")
    assert "delta" in response.get_json()["errors"][0]["message"], response.get_json()
    response = _planned(api, [item], delta=1e-6)
    assert response.status_code == 200, response.get_json()


def test_an_auditor_may_plan_a_weighted_list(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    auditor = Api(api.client, api.make_consumer("compliance", role="auditor"))
    item = {**_item(), "params": {"sensitivity": 1}, "weight": 1}
    response = _planned(auditor, [item, item])
    assert response.status_code == 200, response.get_json()
    assert [i["params"]["epsilon"] for i in response.get_json()["items"]] == [0.5, 0.5]
