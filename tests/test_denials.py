"""Each denial scope: status, problem body, ledger entry, and nothing else changed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Api, unlabelled


def _problem(response: Any) -> dict[str, Any]:
    assert response.content_type == "application/problem+json"
    problem: dict[str, Any] = response.get_json()
    return problem


def test_dataset_scope_is_409_and_changes_nothing(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    assert api.charge(epsilon=0.7).status_code == 201
    before = api.budget()
    response = api.charge(partitions=["p1", "p2"], epsilon=0.5)
    assert response.status_code == 409
    body = _problem(response)
    assert body["scope"] == "dataset"
    assert unlabelled(body["limit"]) == {"epsilon": 1, "delta": 0}
    assert body["spent"]["epsilon"] == 0.7
    assert body["requested"]["epsilon"] == 0.5
    assert "0.7" in body["detail"] and "0.5" in body["detail"]
    assert api.budget()["loss"] == before["loss"]
    assert api.budget()["partitions"]["count"] == 1  # p2 was not created by the denial
    entries = api.ledger()
    assert [e["status"] for e in entries] == ["granted", "denied"]
    assert entries[1]["charge_id"] == body["charge_id"]
    record = api.get(f"/v1/charges/{body['charge_id']}").get_json()
    assert record["status"] == "denied"
    assert set(record) == {
        "charge_id",
        "dataset",
        "consumer",
        "status",
        "mechanism",
        "release",
        "partitions",
        "params",
        "cost",
        "multiplicity",
        "charged",
        "hold_id",
        "denial",
        "created_at",
    }
    assert record["charged"]["epsilon"] == 0 and record["hold_id"] is None  # nothing charged
    assert record["denial"] == {"scope": "dataset"} and unlabelled(record["cost"]) == {
        "epsilon": 0.5,
        "delta": 0,
    }
    assert record["partitions"] == ["p1", "p2"] and record["consumer"] == "admin"
    assert record["params"] == {"epsilon": 0.5, "sensitivity": 1}  # numbers, as sent
    granted = api.get(f"/v1/charges/{entries[0]['charge_id']}").get_json()
    assert granted["denial"] is None and granted["created_at"] == entries[0]["created_at"]
    assert entries[1]["params"] == {"epsilon": "0.5", "sensitivity": 1}  # as hashed


def test_partition_scope_names_the_partition(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10}, partition_budget={"epsilon": 1})
    assert api.charge(partitions=["a"], epsilon=0.8).status_code == 201
    response = api.charge(partitions=["b", "a"], epsilon=0.3)
    assert response.status_code == 409
    body = _problem(response)
    assert body["scope"] == "partition"
    assert body["partition"] == "a"
    assert body["spent"]["epsilon"] == 0.8
    assert unlabelled(body["limit"]) == {"epsilon": 1, "delta": 0}
    assert api.charge(partitions=["b"], epsilon=0.3).status_code == 201


def test_consumer_quota_is_409(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    key = api.make_consumer("ads", datasets=["clicks"], quotas={"clicks": {"epsilon": 0.5}})
    service = api.as_key(key)
    assert service.charge(epsilon=0.4).status_code == 201
    response = service.charge(epsilon=0.2)
    assert response.status_code == 409
    assert _problem(response)["scope"] == "consumer"
    # the quota is the consumer's, not the dataset's: the admin may still charge
    assert api.charge(epsilon=0.2).status_code == 201


@pytest.mark.frozen_clock  # 10:30 UTC: half an hour before the hour window resets
def test_window_scope_is_429_with_retry_after(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10}, windows=[{"period": "1h", "epsilon": 0.5}])
    assert api.charge(epsilon=0.4).status_code == 201
    response = api.charge(epsilon=0.2)
    assert response.status_code == 429
    body = _problem(response)
    assert body["scope"] == "window"
    assert "exceed the current 1h window budget" in body["detail"]  # which window, by name
    assert response.headers["Retry-After"] == "1800"
    assert body["resets_at"] == "2026-03-02T11:00:00Z"
    window = api.budget()["windows"][0]
    assert window["period"] == "1h" and window["loss"]["epsilon"] == 0.4
    assert window["end"] == body["resets_at"]


@pytest.mark.frozen_clock  # 10:30 UTC on 2 March: the hour resets at 11:00, the day at 24:00
@pytest.mark.parametrize("order", ["hour first", "day first"])
def test_full_windows_name_the_one_that_resets_last(api: Api, clock: Any, order: str) -> None:
    """A retry is refused until every window it breaks has reset: Retry-After and resets_at
    say when the last of them does, whatever order the windows were set in."""
    windows = [{"period": "1h", "epsilon": 0.5}, {"period": "1d", "epsilon": 0.5}]
    api.make_dataset(budget={"epsilon": 10}, windows=windows[:: 1 if order == "hour first" else -1])
    assert api.charge(epsilon=0.5).status_code == 201
    response = api.charge(epsilon=0.1)
    assert response.status_code == 429
    body = _problem(response)
    assert body["scope"] == "window"
    assert body["resets_at"] == "2026-03-03T00:00:00Z"
    assert response.headers["Retry-After"] == str(int(13.5 * 3600))
    clock.advance(1800)  # the hour has reset; the day has not
    assert api.charge(epsilon=0.1).status_code == 429
    clock.advance(13 * 3600)  # both have
    assert api.charge(epsilon=0.1).status_code == 201


@pytest.mark.frozen_clock
@pytest.mark.parametrize("order", ["hour first", "day first"])
def test_a_window_the_charge_can_never_fit_is_named_before_one_that_resets_later(
    api: Api, order: str
) -> None:
    """Waiting for the day to reset would not help a charge above the hour's limit: a 409
    naming the hour, with no Retry-After."""
    windows = [{"period": "1h", "epsilon": 0.05}, {"period": "1d", "epsilon": 0.5}]
    api.make_dataset(budget={"epsilon": 10}, windows=windows[:: 1 if order == "hour first" else -1])
    assert api.charge(epsilon=0.05).status_code == 201
    response = api.charge(epsilon=0.5)  # breaks the hour (never) and the day (until 24:00)
    assert response.status_code == 409, response.get_json()
    assert "Retry-After" not in response.headers
    assert _problem(response)["resets_at"] == "2026-03-02T11:00:00Z"
    plan = api.post(
        "/v1/charges/plan",
        {
            "dataset": "clicks",
            "partitions": ["p1"],
            "mechanism": "laplace",
            "params": {"epsilon": 0.5, "sensitivity": 1},
            "input": {"values": [1]},
        },
    ).get_json()
    assert plan["fits"] == 0 and plan["limited_by"]["resets_at"] == "2026-03-02T11:00:00Z", plan


def test_window_and_lifetime_together_is_409_naming_the_dataset(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 0.5}, windows=[{"period": "1d", "epsilon": 0.5}])
    assert api.charge(epsilon=0.4).status_code == 201
    response = api.charge(epsilon=0.2)
    assert response.status_code == 409
    assert _problem(response)["scope"] == "dataset"


def test_cost_alone_above_a_window_limit_is_409(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10}, windows=[{"period": "1d", "epsilon": 0.5}])
    response = api.charge(epsilon=0.6)
    assert response.status_code == 409
    body = _problem(response)
    assert body["scope"] == "window" and "resets_at" in body


@pytest.mark.frozen_clock
def test_cost_alone_above_a_window_limit_is_409_on_a_user_dataset_with_bounded_k(
    api: Api,
) -> None:
    """A user scope's top-k rule on a fresh window: a joint charge of 0.6 costs
    min(T, top-2 s(p)) = min(0.6, 0.6) = 0.6 > 0.5 whatever the window holds, so waiting
    would not help; a parallel charge on 2 partitions at 0.3 costs 0.6 too."""
    api.make_dataset(
        privacy_unit="user",
        max_partitions_per_user=2,
        budget={"epsilon": 10},
        windows=[{"period": "1d", "epsilon": 0.5}],
    )
    joint = api.charge(partitions=["a", "b"], epsilon=0.6)
    parallel = api.charge(
        partitions=["a", "b", "c"], epsilon=0.3, release="parallel", input={"values": [1, 2, 3]}
    )
    for response in (joint, parallel):
        assert response.status_code == 409, response.get_json()
        assert "Retry-After" not in response.headers
        assert _problem(response)["scope"] == "window"
    # the parallel charge's 0.3 per release is counted twice: its denial says so
    denied = _problem(parallel)
    assert denied["requested"]["epsilon"] == 0.3 and denied["multiplicity"] == 2
    assert "per release, 2 releases counted" in denied["detail"]
    assert "by itself it would exceed the window limit" in denied["detail"]
    assert _problem(joint)["multiplicity"] == 1
    assert "releases counted" not in _problem(joint)["detail"]
    # one that fits a fresh window but not this one is still a 429
    assert api.charge(partitions=["a"], epsilon=0.4).status_code == 201
    assert api.charge(partitions=["a"], epsilon=0.2).status_code == 429


def test_lowered_limit_blocks_without_refund(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 2})
    assert api.charge(epsilon=1).status_code == 201
    response = api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 0.5}, "reason": "audit"})
    assert response.status_code == 200
    assert api.budget()["remaining"]["epsilon"] == 0
    assert api.charge(epsilon=0.1).status_code == 409
    raised = api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 3}})
    assert raised.status_code == 200
    history = api.budget()["limit_history"]
    assert [(h["old"]["epsilon"], h["new"]["epsilon"]) for h in history] == [
        (2, 0.5),
        (0.5, 3),
    ]
    assert [h["by"] for h in history] == ["admin", "admin"]  # who, when, old and new
    changes = [e for e in api.ledger() if e["kind"] == "limit_change"]
    assert len(changes) == 2 and changes[0]["consumer"] == "admin"


def test_preview_prices_without_charging(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    body: dict[str, Any] = {
        "dataset": "clicks",
        "partitions": ["a"],
        "mechanism": "laplace",
        "params": {"epsilon": 0.4, "sensitivity": 1},
    }
    ok = api.post("/v1/charges/preview", body).get_json()
    assert ok["granted"] is True and ok["remaining_after"]["epsilon"] == 0.6
    body["params"]["epsilon"] = 1.5
    refused = api.post("/v1/charges/preview", body).get_json()
    assert refused["granted"] is False and refused["scope"] == "dataset"
    assert api.ledger() == [] and api.budget()["loss"]["epsilon"] == 0


@pytest.mark.frozen_clock
def test_a_window_budget_added_mid_window_counts_earlier_charges(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    assert api.charge(partitions=["a", "b"], epsilon=0.3).status_code == 201
    assert api.charge(partitions=["a"], epsilon=0.2).status_code == 201
    response = api.patch("/v1/datasets/clicks", {"windows": [{"period": "1d", "epsilon": 0.6}]})
    assert response.status_code == 200
    # s(a) = 0.5 in today's window already: a further 0.2 on a breaks 0.6, on b it fits
    assert api.budget()["windows"][0]["loss"]["epsilon"] == 0.5
    assert api.charge(partitions=["a"], epsilon=0.2).status_code == 429
    assert api.charge(partitions=["b"], epsilon=0.2).status_code == 201
    assert api.budget()["windows"][0]["loss"]["epsilon"] == 0.5


def test_patching_windows_may_repeat_an_existing_period(api: Api) -> None:
    api.make_dataset(windows=[{"period": "1d", "epsilon": 0.5}])
    response = api.patch(
        "/v1/datasets/clicks",
        {"windows": [{"period": "1d", "epsilon": 0.7}, {"period": "1h", "epsilon": 0.2}]},
    )
    assert response.status_code == 200, response.get_json()
    assert [w["period"] for w in api.budget()["windows"]] == ["1h", "1d"]


@pytest.mark.frozen_clock
def test_every_scope_of_the_budget_report_says_what_is_left(api: Api) -> None:
    """Lifetime, the most spent partition, each window and the caller's quota each state
    what is left, in the dataset's mode and, on zcdp, in epsilon at the dataset's delta."""
    api.make_dataset(
        accounting="zcdp",
        budget={"epsilon": 2, "delta": 1e-6},
        partition_budget={"epsilon": 1},
        windows=[{"period": "1d", "epsilon": 1.5}],
    )
    key = api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 1.2}})
    service = api.as_key(key)
    gaussian: dict[str, Any] = {"mechanism": "gaussian", "params": {"sigma": 10, "sensitivity": 1}}
    assert service.charge(partitions=["a"], **gaussian).status_code == 201
    assert service.charge(partitions=["a"], **gaussian).status_code == 201
    assert service.charge(partitions=["b"], **gaussian).status_code == 201
    report = service.budget()
    left = {
        "lifetime": report["remaining"],
        "partition": report["partitions"]["remaining"],
        "window": report["windows"][0]["remaining"],
        "quota": report["consumer"]["remaining"],
    }
    limits = {
        "lifetime": report["limit"],
        "partition": report["partition_limit"],
        "window": report["windows"][0]["limit"],
        "quota": report["consumer"]["quota"],
    }
    spent = {"lifetime": 0.01, "partition": 0.01, "window": 0.01, "quota": 0.01}  # rho
    for scope, amount in left.items():
        assert set(amount) >= {"rho", "epsilon", "delta"}, scope
        expected = float(limits[scope]["rho"]) - spent[scope]
        assert abs(amount["rho"] - expected) < 1e-9, scope
        assert amount["epsilon"] > 0, scope


def test_limit_history_states_numbers_and_names_the_consumer(api: Api) -> None:
    """Every amount of the limit history is a JSON number, like every other amount, and a
    quota change names the consumer whose quota it is."""
    api.make_dataset(windows=[{"period": "1d", "epsilon": 0.5}])
    api.patch("/v1/datasets/clicks", {"windows": [{"period": "1d", "epsilon": 0.3}]})
    api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 0.5}})
    api.patch("/v1/consumers/svc", {"quotas": {"clicks": {"epsilon": 0.25}}})
    window, *consumer = api.budget()["limit_history"]
    assert (window["old"][0]["epsilon"], window["new"][0]["epsilon"]) == (0.5, 0.3)
    quota = consumer[-1]
    assert quota["scope"] == "consumer" and quota["consumer"] == "svc"
    assert (quota["old"]["quota"]["epsilon"], quota["new"]["quota"]["epsilon"]) == (0.5, 0.25)


def test_a_service_sees_only_its_own_quota_changes(api: Api) -> None:
    """Another consumer's quota, its name and the admin's reason are not a service's to read:
    the limit history a service sees holds the dataset's changes and its own quota's."""
    api.make_dataset()
    keys = {
        name: api.make_consumer(name, datasets=["clicks"], quotas={"clicks": {"epsilon": 0.5}})
        for name in ("svc", "rival")
    }
    api.patch("/v1/consumers/rival", {"quotas": {"clicks": {"epsilon": 0.25}}, "reason": "trial"})
    api.patch("/v1/consumers/svc", {"quotas": {"clicks": {"epsilon": 0.4}}})
    api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2}, "reason": "more"})
    seen = api.as_key(keys["svc"]).budget()["limit_history"]
    assert [(h["scope"], h.get("consumer")) for h in seen] == [
        ("consumer", "svc"),
        ("dataset", None),
    ]
    assert seen[0]["reason"] == "no reason given"
    everything = api.budget()["limit_history"]
    assert {h.get("consumer") for h in everything} == {"svc", "rival", None}


@pytest.mark.parametrize("accounting", ["rdp", "gdp"])
def test_limit_history_states_every_measure_as_a_number(api: Api, accounting: str) -> None:
    """rdp and gdp limits are ledgered with their own measure (rdp, mu): numbers
    too, like epsilon and delta beside them."""
    api.make_dataset(accounting=accounting, budget={"epsilon": 1, "delta": 1e-6})
    api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2}, "reason": "more"})
    (change,) = api.budget()["limit_history"]
    measures = {"rdp": ("rdp",), "gdp": ("mu",)}[accounting]
    for terms in (change["old"], change["new"]):
        assert all(isinstance(terms[name], float) for name in (*measures, "epsilon")), terms


def test_a_cost_past_what_is_recorded_is_said_to_be_larger(api: Api) -> None:
    """A cost is recorded up to 2^62 units (saturating, beyond every limit): a denial of a
    larger one says the figure it names is not the whole cost (rho of sigma 1e-10 is
    5e19, recorded as 4,611,686.018...)."""
    api.make_dataset(accounting="zcdp", budget={"epsilon": 1000, "delta": 1e-6})
    huge = api.charge(mechanism="gaussian", params={"sigma": 1e-10, "sensitivity": 1})
    assert huge.status_code == 409
    assert huge.get_json()["requested"]["rho"] == pytest.approx(2**62 / 1e12)
    assert "the cost requested is larger still" in huge.get_json()["detail"]
    large = api.charge(mechanism="gaussian", params={"sigma": 1e-3, "sensitivity": 1})
    assert large.status_code == 409 and "larger still" not in large.get_json()["detail"]
