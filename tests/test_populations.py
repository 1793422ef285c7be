"""Populations: one lifetime budget over several datasets of the same people (DESIGN.md)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from accountant.driver import Driver
from accountant.services import batches
from tests.conftest import POSTGRES_URL, Api


def _population(api: Api, name: str = "customers", **fields: Any) -> dict[str, Any]:
    body = {"name": name, "privacy_unit": "user", "accounting": "pure", "budget": {"epsilon": 1}}
    response = api.post("/v1/populations", {**body, **fields})
    assert response.status_code == 201, response.get_json()
    return dict(response.get_json())


def _member(api: Api, name: str, population: str = "customers", **fields: Any) -> None:
    body = {"privacy_unit": "user", "accounting": "pure", "budget": {"epsilon": 10}}
    api.make_dataset(name, population=population, **{**body, **fields})


def test_a_population_bounds_the_sum_of_its_datasets_losses(api: Api) -> None:
    created = _population(api)
    assert created["datasets"] == [] and "person-level id" in created["identity"]
    _member(api, "orders")
    _member(api, "clicks")
    for dataset in ("orders", "clicks", "orders"):
        assert api.charge(dataset, epsilon=0.3).status_code == 201
    refused = api.charge("clicks", epsilon=0.2)
    assert refused.status_code == 409
    denial = refused.get_json()
    assert denial["scope"] == "population" and denial["population"] == "customers"
    assert "population 'customers'" in denial["detail"]
    assert api.charge("clicks", epsilon=0.1).status_code == 201  # exactly 1.0 in all
    budget = api.get("/v1/populations/customers/budget").get_json()
    assert budget["loss"]["epsilon"] == 1.0 and budget["remaining"]["epsilon"] == 0
    assert budget["at_limit"] is True
    assert budget["datasets"]["orders"]["epsilon"] == 0.6
    assert budget["datasets"]["clicks"]["epsilon"] == 0.4
    shown = api.get("/v1/populations/customers").get_json()
    assert shown["datasets"] == ["clicks", "orders"]
    assert api.get("/v1/datasets/orders").get_json()["population"] == "customers"
    # the refusal is in the dataset's chain, naming the population
    [denied] = [e for e in api.ledger(dataset="clicks") if e["status"] == "denied"]
    assert denied["detail"]["scope"] == "population"
    assert denied["detail"]["population"] == "customers"
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True


def test_a_dataset_outside_the_population_is_not_counted(api: Api) -> None:
    _population(api)
    _member(api, "orders")
    api.make_dataset("weather", privacy_unit="user", budget={"epsilon": 10})
    assert api.charge("weather", epsilon=5).status_code == 201
    assert api.charge("orders", epsilon=1).status_code == 201


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"privacy_unit": "record"}, "population"),
        ({"accounting": "zcdp", "budget": {"epsilon": 1, "delta": 1e-6}}, "population"),
        ({"population": "nobody"}, "population"),
    ],
)
def test_a_dataset_joins_only_with_the_populations_unit_and_mode(
    api: Api, fields: dict[str, Any], field: str
) -> None:
    _population(api)
    body = {
        "name": "orders",
        "privacy_unit": "user",
        "accounting": "pure",
        "budget": {"epsilon": 1},
        "population": "customers",
        **fields,
    }
    response = api.post("/v1/datasets", body)
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["errors"][0]["field"] == field
    assert api.get("/v1/datasets/orders").status_code == 404  # nothing was created


def test_advanced_composition_and_other_units_cannot_join_or_be_a_population(api: Api) -> None:
    refused = api.post(
        "/v1/populations",
        {"name": "rows", "privacy_unit": "record", "budget": {"epsilon": 1}},
    )
    assert refused.status_code == 400
    assert refused.get_json()["errors"][0]["field"] == "privacy_unit"
    _population(api, accounting="approx", budget={"epsilon": 1, "delta": 1e-6})
    advanced = api.post(
        "/v1/datasets",
        {
            "name": "orders",
            "privacy_unit": "user",
            "accounting": "approx",
            "composition": "advanced",
            "budget": {"epsilon": 1, "delta": 1e-6},
            "population": "customers",
        },
    )
    assert advanced.status_code == 400
    assert "advanced composition" in advanced.get_json()["detail"]


def test_rdp_members_use_the_populations_order(api: Api) -> None:
    budget = {"epsilon": 1, "delta": 1e-6}
    created = _population(api, accounting="rdp", rdp_order=8, budget=budget)
    assert created["rdp_order"] == 8
    other = api.post(
        "/v1/datasets",
        {
            "name": "orders",
            "privacy_unit": "user",
            "accounting": "rdp",
            "rdp_order": 16,
            "budget": budget,
            "population": "customers",
        },
    )
    assert other.status_code == 400 and other.get_json()["errors"][0]["field"] == "rdp_order"
    _member(api, "orders", accounting="rdp", rdp_order=8, budget=budget)


def test_populations_and_datasets_share_one_namespace(api: Api) -> None:
    api.make_dataset("orders")
    clash = api.post(
        "/v1/populations", {"name": "orders", "privacy_unit": "user", "budget": {"epsilon": 1}}
    )
    assert clash.status_code == 409
    _population(api)
    assert (
        api.post(
            "/v1/datasets", {"name": "customers", "privacy_unit": "user", "budget": {"epsilon": 1}}
        ).status_code
        == 409
    )


def test_a_limit_change_is_ledgered_in_the_populations_own_chain(api: Api) -> None:
    _population(api)
    _member(api, "orders")
    assert api.charge("orders", epsilon=0.8).status_code == 201
    lowered = api.patch(
        "/v1/populations/customers", {"budget": {"epsilon": 0.5}, "reason": "audit"}
    )
    assert lowered.status_code == 200, lowered.get_json()
    assert lowered.get_json()["changed"] is True
    assert any("spent" in note for note in lowered.get_json()["notes"])
    assert api.charge("orders", epsilon=0.1).get_json()["scope"] == "population"
    budget = api.get("/v1/populations/customers/budget").get_json()
    history = budget["limit_history"]
    assert [c["new"]["epsilon"] for c in history] == [1, 0.5]
    assert history[0]["old"] is None and history[1]["old"]["epsilon"] == 1
    assert budget["limit_history"][1]["reason"] == "audit"
    chain = [e for e in api.ledger() if e["dataset"] == "customers"]
    assert [e["seq"] for e in chain] == [1, 2]
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True


def test_only_admins_write_and_admins_and_auditors_read_populations(api: Api) -> None:
    _population(api)
    service = api.as_key(api.make_consumer("reporter"))
    auditor = api.as_key(api.make_consumer("compliance", role="auditor"))
    body = {"name": "other", "privacy_unit": "user", "budget": {"epsilon": 1}}
    assert service.post("/v1/populations", body).status_code == 403
    assert service.get("/v1/populations").status_code == 403
    assert auditor.get("/v1/populations/customers/budget").status_code == 200
    assert auditor.patch("/v1/populations/customers", {"budget": {"epsilon": 2}}).status_code == 403
    assert api.get("/v1/populations/nobody").status_code == 404


def _batch_item(dataset: str, epsilon: float) -> dict[str, Any]:
    return {
        "dataset": dataset,
        "partitions": ["p1"],
        "mechanism": "laplace",
        "params": {"epsilon": epsilon, "sensitivity": 1},
        "input": {"values": [1.0]},
    }


def test_a_batch_adds_up_across_the_populations_datasets_and_lists_its_denial(
    api: Api,
) -> None:
    _population(api)
    _member(api, "orders")
    _member(api, "clicks")
    items = [_batch_item("orders", 0.4), _batch_item("clicks", 0.4), _batch_item("orders", 0.4)]
    refused = api.post("/v1/charges/batch", {"items": items})
    assert refused.status_code == 409, refused.get_json()
    [denial] = refused.get_json()["denials"]
    assert denial["scope"] == "population" and denial["population"] == "customers"
    assert denial["item"] == 2 and denial["limit"]["epsilon"] == 1
    assert denial["spent"]["epsilon"] == 0 and denial["requested"]["epsilon"] == 1.2
    budget = api.get("/v1/populations/customers/budget").get_json()
    assert budget["loss"]["epsilon"] == 0  # nothing was charged
    granted = api.post("/v1/charges/batch", {"items": items[:2]})
    assert granted.status_code == 201, granted.get_json()
    budget = api.get("/v1/populations/customers/budget").get_json()
    assert budget["loss"]["epsilon"] == 0.8


def test_a_hold_charges_the_population_and_its_settle_gives_back(api: Api) -> None:
    _population(api)
    _member(api, "orders")
    _member(api, "clicks")
    hold = api.post(
        "/v1/holds",
        {
            "dataset": "orders",
            "partitions": ["p1"],
            "expires_in": 600,
            "amount": {"epsilon": 0.7},
        },
    )
    assert hold.status_code == 201, hold.get_json()
    assert api.charge("clicks", epsilon=0.4).get_json()["scope"] == "population"
    settled = api.post(f"/v1/holds/{hold.get_json()['hold_id']}/settle", {"used": {"epsilon": 0.2}})
    assert settled.status_code == 200, settled.get_json()
    budget = api.get("/v1/populations/customers/budget").get_json()
    assert budget["loss"]["epsilon"] == 0.2 and budget["datasets"]["orders"]["epsilon"] == 0.2
    assert api.charge("clicks", epsilon=0.8).status_code == 201
    assert api.charge("clicks", epsilon=0.1).get_json()["scope"] == "population"
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True


def test_a_preview_and_a_plan_name_the_population_that_limits(api: Api) -> None:
    _population(api)
    _member(api, "orders")
    _member(api, "clicks")
    assert api.charge("orders", epsilon=0.7).status_code == 201
    body = _batch_item("clicks", 0.1)
    preview = api.post(
        "/v1/charges/preview", {**body, "params": {"epsilon": 0.5, "sensitivity": 1}}
    )
    assert preview.get_json()["granted"] is False
    assert preview.get_json()["population"] == "customers"
    plan = api.post("/v1/charges/plan", body).get_json()
    assert plan["fits"] == 3
    assert plan["limited_by"] == {
        "scope": "population",
        "partition": None,
        "population": "customers",
    }


def test_a_weighted_plan_shares_one_scale_across_the_populations_datasets(api: Api) -> None:
    """The members' items split what the population has left by their weights, as one
    batch: each dataset alone has room for every item at its largest (found in review: each
    was given the whole population)."""
    _population(api)
    _member(api, "orders")
    _member(api, "clicks")
    api.make_dataset("outside", budget={"epsilon": 2})
    assert api.charge("orders", epsilon=0.2).status_code == 201
    items = [
        {**_batch_item("orders", 0), "weight": 1},
        {**_batch_item("clicks", 0), "weight": 3},
        {**_batch_item("outside", 0), "weight": 1},
    ]
    for item in items:
        item["params"] = {"sensitivity": 1}
    answer = api.post("/v1/charges/plan", {"items": items})
    assert answer.status_code == 200, answer.get_json()
    epsilons = [planned["params"]["epsilon"] for planned in answer.get_json()["items"]]
    assert epsilons == [0.2, 0.6, 2.0]  # 0.8 left in the population, 1 : 3
    chosen = [
        _batch_item(item["dataset"], epsilon) for item, epsilon in zip(items, epsilons, strict=True)
    ]
    for i in (0, 1):  # less noise on either member's item does not fit
        tighter = [dict(item, params=dict(item["params"])) for item in chosen]
        tighter[i]["params"]["epsilon"] += 1e-9
        refused = api.post("/v1/charges/batch", {"items": tighter})
        assert refused.status_code == 409 and refused.get_json()["denials"][0]["scope"] == (
            "population"
        )
    assert api.post("/v1/charges/batch", {"items": chosen}).status_code == 201
    budget = api.get("/v1/populations/customers/budget").get_json()
    assert budget["loss"]["epsilon"] == 1.0
    refused = api.post("/v1/charges/plan", {"items": items[:2]})
    assert refused.status_code == 400
    assert "and population 'customers' have left" in refused.get_json()["detail"]
    alone = api.post("/v1/charges/plan", {"items": items[:1]}).get_json()["detail"]
    assert "dataset 'orders' and population 'customers' have left" in alone


@dataclass(frozen=True)
class _Caller:
    consumer_id: int = 1
    name: str = "admin"
    key_id: str = "none"


@pytest.mark.parametrize("database_url", ["postgresql"] if POSTGRES_URL else [], indirect=True)
def test_a_batch_locks_every_population_before_any_dataset(api: Api, app: Any) -> None:
    """A batch over alpha (population west) and beta (east), waiting for alpha's lock, holds
    both populations already: a charge on beta, which locks east first, waits behind it,
    and no batch over beta and a west dataset can hold east while waiting for west."""
    for name in ("west", "east"):
        _population(api, name)
    _member(api, "alpha", population="west")
    _member(api, "beta", population="east")
    engine = app.extensions["accountant_engine"]
    with engine.connect() as holder, engine.connect() as probe:
        holder.execute(text("SELECT id FROM datasets WHERE name = 'alpha' FOR UPDATE"))
        batch = Driver.checkout(engine)

        def lock_both() -> None:
            batch.begin_write()
            try:
                with batch.pipeline():
                    batches.lock(batch, ["alpha", "beta"], _Caller())
            except Exception:  # the made-up key is refused once the locks are granted
                pass
            finally:
                batch.rollback()

        waiting = threading.Thread(target=lock_both)
        waiting.start()
        waiting.join(timeout=2)  # blocked on alpha
        assert waiting.is_alive()
        probe.execute(text("SET lock_timeout = '200ms'"))
        with pytest.raises(OperationalError, match="lock timeout"):
            probe.execute(text("SELECT id FROM populations WHERE name = 'east' FOR UPDATE"))
        probe.rollback()
        holder.rollback()
        waiting.join(timeout=30)
        batch.close()
