"""A batch folds its items' reads in memory (services/folded_reads.py): every folded read
equals what the database would have answered, whatever the batch; and a batch whose items
repeat their partitions reads each set from the database once."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accountant.accounting.charge_inputs import ChargeReads
from accountant.services import charge_reads, folded_reads
from tests.conftest import Api


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[ChargeReads]:
    """Every folded read compared with the database's (the suite compares them all:
    tests/conftest.py sets ACCOUNTANT_CHECK_FOLDED_READS)."""
    assert folded_reads.checking()
    seen: list[ChargeReads] = []
    real = folded_reads.check

    def counted(folded: ChargeReads, read: ChargeReads) -> None:
        seen.append(folded)
        real(folded, read)

    monkeypatch.setattr(folded_reads, "check", counted)
    return seen


@pytest.fixture
def database_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The datasets of the items read from the database, in order (with the check off)."""
    monkeypatch.setenv("ACCOUNTANT_CHECK_FOLDED_READS", "0")
    read: list[str] = []
    real = charge_reads.read_unlocked

    def counted(driver: Any, request: Any, now_us: int) -> ChargeReads:
        read.append(request.dataset)
        return real(driver, request, now_us)

    monkeypatch.setattr(charge_reads, "read_unlocked", counted)
    return read


def _item(dataset: str, partitions: list[str], epsilon: float, **extra: Any) -> dict[str, Any]:
    return {
        "dataset": dataset,
        "partitions": partitions,
        "mechanism": "laplace",
        "params": {"epsilon": epsilon, "sensitivity": 1},
        "input": {"values": [10.0]},
        **extra,
    }


def _batch(api: Api, items: list[dict[str, Any]]) -> Any:
    return api.post("/v1/charges/batch", {"items": items})


def test_items_on_one_set_of_partitions_read_the_database_once(
    api: Api, database_reads: list[str]
) -> None:
    api.make_dataset(budget={"epsilon": 10.0}, partition_budget={"epsilon": 5.0})
    api.make_dataset("orders", budget={"epsilon": 10.0})
    assert api.charge(partitions=["p1", "p2"], epsilon=0.1).status_code == 201
    assert api.charge("orders", epsilon=0.1).status_code == 201
    items = [_item("clicks", ["p1", "p2"], 0.1) for _ in range(20)]
    items += [_item("orders", ["p1"], 0.1) for _ in range(10)]
    response = _batch(api, items)
    assert response.status_code == 201, response.get_json()
    assert database_reads == ["clicks", "orders"]
    assert api.budget()["loss"]["epsilon"] == pytest.approx(2.1)


def test_what_cannot_be_folded_is_read_again(api: Api, database_reads: list[str]) -> None:
    api.make_dataset(budget={"epsilon": 10.0})
    assert api.charge(partitions=["p1", "p2", "p3"], epsilon=0.1).status_code == 201
    items = [
        _item("clicks", ["p1"], 0.1),
        _item("clicks", ["p2"], 0.1),  # a disjoint set: read once
        _item("clicks", ["p1"], 0.1),  # folded: p2 is disjoint from p1
        _item("clicks", ["p1", "p2"], 0.1),  # overlaps both: read
        _item("clicks", ["p1"], 0.1),  # overlapped by the one before: read
        _item("clicks", ["p9"], 0.1),  # a new partition: read, and every fold dropped
        _item("clicks", ["p1"], 0.1),  # read
    ]
    assert _batch(api, items).status_code == 201
    assert len(database_reads) == 6


def test_a_per_partition_limit_reads_each_partitions_own_spend_folded(
    api: Api, compared: list[ChargeReads]
) -> None:
    api.make_dataset(budget={"epsilon": 10.0}, partition_budget={"epsilon": 1.0})
    assert api.charge(partitions=["p1", "p2"], epsilon=0.1).status_code == 201
    items = [_item("clicks", ["p1", "p2"], 0.2) for _ in range(4)]
    items.append(_item("clicks", ["p1", "p2"], 0.2))  # p1 and p2 at 1.1: over the limit
    response = _batch(api, items)
    assert response.status_code == 409
    denials = response.get_json()["denials"]
    assert [(d["partition"], d["item"]) for d in denials] == [("p1", 4), ("p2", 4)]
    assert all(d["spent"]["epsilon"] == 0.1 for d in denials)
    assert len(compared) == 4


def test_a_population_charged_through_another_member_is_read_again(
    api: Api, database_reads: list[str]
) -> None:
    people = {"name": "people", "privacy_unit": "user", "accounting": "pure"}
    assert api.post("/v1/populations", {**people, "budget": {"epsilon": 1.0}}).status_code == 201
    for name in ("orders", "visits"):
        api.make_dataset(name, privacy_unit="user", population="people", budget={"epsilon": 1})
        assert api.charge(name, epsilon=0.1).status_code == 201
    items = [_item(name, ["p1"], 0.1) for name in ("orders", "visits", "orders", "orders")]
    response = _batch(api, items)
    assert response.status_code == 201, response.get_json()
    # the third item reads again (the population moved through visits); the fourth is folded
    assert database_reads == ["orders", "visits", "orders"]
    assert api.get("/v1/populations/people/budget").get_json()["loss"]["epsilon"] == 0.6


_names = iter(range(10**6))


@pytest.mark.frozen_clock
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sets=st.lists(
        st.sampled_from([["p1"], ["p2"], ["p1", "p2"], ["p3"], ["p2", "p3"], ["p1", "p2", "p3"]]),
        min_size=1,
        max_size=10,
    ),
    epsilons=st.lists(st.sampled_from([0.05, 0.1, 0.25, 0.4]), min_size=12, max_size=12),
    releases=st.lists(st.sampled_from(["joint", "parallel"]), min_size=12, max_size=12),
    terms=st.sampled_from(["record", "partition limit", "user", "window", "population"]),
    service=st.booleans(),
    new_partition=st.booleans(),
)
def test_every_folded_read_equals_the_databases(
    api: Api,
    compared: list[ChargeReads],
    sets: list[list[str]],
    epsilons: list[float],
    releases: list[str],
    terms: str,
    service: bool,
    new_partition: bool,
) -> None:
    name = f"d{next(_names)}"
    fields: dict[str, Any] = {"budget": {"epsilon": 2.0}}
    if terms == "partition limit":
        fields["partition_budget"] = {"epsilon": 1.0}
    elif terms == "user":
        fields["privacy_unit"] = "user"
    elif terms == "window":
        fields["windows"] = [{"period": "1d", "epsilon": 1.5}]
    elif terms == "population":
        population = f"{name}_people"
        created = api.post(
            "/v1/populations",
            {
                "name": population,
                "privacy_unit": "user",
                "accounting": "pure",
                "budget": {"epsilon": 1.5},
            },
        )
        assert created.status_code == 201, created.get_json()
        fields.update(privacy_unit="user", population=population)
    api.make_dataset(name, **fields)
    caller = api
    if service:
        key = api.make_consumer(f"{name}_svc", datasets=[name], quotas={name: {"epsilon": 1.2}})
        caller = Api(api.client, key)
    assert caller.charge(name, partitions=["p1", "p2", "p3"], epsilon=0.05).status_code == 201
    sets = ([["p4"]] if new_partition else []) + sets
    sets.append(sets[-1])  # the same set as the item before: folded, whatever came before
    items = [
        _item(name, keys, epsilon, release=release)
        for keys, epsilon, release in zip(sets, epsilons, releases, strict=False)
    ]
    before = len(compared)
    response = _batch(caller, items)
    assert response.status_code in (201, 409, 429), response.get_json()
    if sets[-1] != ["p4"]:
        assert len(compared) > before
