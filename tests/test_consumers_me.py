"""GET /v1/consumers/me: a service sees its own grants, quotas and their use."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Api, charge_authenticated_before, unlabelled


def test_a_service_reads_its_quota_and_what_is_left(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    api.make_dataset("other", budget={"epsilon": 10})
    key = api.make_consumer("svc", datasets=["clicks", "other"], quotas={"clicks": {"epsilon": 1}})
    service = api.as_key(key)
    assert service.charge(epsilon=0.3).status_code == 201
    assert service.charge(partitions=["p2"], epsilon=0.2).status_code == 201
    me = service.get("/v1/consumers/me")
    assert me.status_code == 200
    body = me.get_json()
    assert body["name"] == "svc" and body["role"] == "service"
    assert body["datasets"] == ["clicks", "other"]
    clicks = body["use"]["clicks"]
    # record unit: the consumer's loss is its largest s(p), 0.3 (p1), not the sum 0.5
    assert clicks["loss"]["epsilon"] == 0.3
    assert clicks["quota"]["epsilon"] == 1
    assert clicks["remaining"]["epsilon"] == pytest.approx(0.7)
    assert body["use"].keys() == {"clicks", "other"} and body["use"]["other"].keys() == {"loss"}
    assert unlabelled(body["use"]["other"]["loss"]) == {"epsilon": 0, "delta": 0}
    assert key not in me.text  # keys are listed by id, never in clear


def test_a_quota_without_delta_states_no_delta_left(api: Api) -> None:
    """A quota that omits delta limits no delta (API.md): what is left of it has none to
    state, rather than a delta of 0 that reads as used up."""
    api.make_dataset(accounting="approx", budget={"epsilon": 10, "delta": 1e-5})
    key = api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 1}})
    service = api.as_key(key)
    params = {"epsilon": 0.1, "delta": 5e-7, "sensitivity": 1}
    assert service.charge(mechanism="gaussian", params=params).status_code == 201
    for use in (
        service.get("/v1/consumers/me").get_json()["use"]["clicks"],
        service.budget()["consumer"],
    ):
        assert unlabelled(use["remaining"]) == {"epsilon": pytest.approx(0.9)}, use
        assert unlabelled(use["loss"]) == {"epsilon": 0.1, "delta": 5e-7}


def test_any_role_reads_itself_and_nobody_else(api: Api) -> None:
    auditor = api.as_key(api.make_consumer("audit", role="auditor"))
    assert auditor.get("/v1/consumers/me").get_json()["use"] == {}
    assert api.get("/v1/consumers/me").get_json()["name"] == "admin"
    assert api.as_key("nope").get("/v1/consumers/me").status_code == 401


def test_an_admin_changes_grants_and_quotas_and_each_change_is_ledgered(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    api.make_dataset("other", budget={"epsilon": 10})
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    assert service.charge(dataset="other").status_code == 403
    changed = api.call(
        "PATCH",
        "/v1/consumers/svc",
        {
            "datasets": ["clicks", "other"],
            "quotas": {"clicks": {"epsilon": 0.5}},
            "reason": "ticket 42",
        },
    )
    assert changed.status_code == 200, changed.get_json()
    assert changed.get_json()["datasets"] == ["clicks", "other"]
    assert service.charge(dataset="other").status_code == 201
    assert service.charge(epsilon=0.4).status_code == 201
    denied = service.charge(epsilon=0.2)
    assert denied.status_code == 409 and denied.get_json()["scope"] == "consumer"
    entries = [e for e in api.ledger() if e["kind"] == "limit_change"]
    assert [(e["dataset"], e["consumer"], e["detail"]["scope"]) for e in entries] == [
        ("clicks", "admin", "consumer"),
        ("other", "admin", "consumer"),
    ]
    assert entries[0]["detail"]["old"] == {"granted": True, "quota": None}
    assert entries[0]["detail"]["new"]["quota"]["epsilon"] == "0.5"
    assert entries[0]["detail"]["reason"] == "ticket 42"
    # removing the quota, then the grant
    assert api.call("PATCH", "/v1/consumers/svc", {"quotas": {"clicks": None}}).status_code == 200
    assert service.charge(epsilon=0.2).status_code == 201
    assert api.call("PATCH", "/v1/consumers/svc", {"datasets": ["clicks"]}).status_code == 200
    assert service.charge(dataset="other").status_code == 403
    assert len([e for e in api.ledger() if e["kind"] == "limit_change"]) == 4
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    # nothing changed: nothing ledgered
    assert api.call("PATCH", "/v1/consumers/svc", {"datasets": ["clicks"]}).status_code == 200
    assert len([e for e in api.ledger() if e["kind"] == "limit_change"]) == 4


def test_patching_consumers_is_for_admins_and_checks_its_input(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    assert service.call("PATCH", "/v1/consumers/svc", {"datasets": []}).status_code == 403
    assert api.call("PATCH", "/v1/consumers/nobody", {"datasets": []}).status_code == 404
    assert api.call("PATCH", "/v1/consumers/svc", {"datasets": ["nope"]}).status_code == 404
    quota_elsewhere = api.call("PATCH", "/v1/consumers/svc", {"quotas": {"other": {"epsilon": 1}}})
    assert quota_elsewhere.status_code == 400
    assert api.call("PATCH", "/v1/consumers/svc", {}).status_code == 400
    assert len([e for e in api.ledger() if e["kind"] == "limit_change"]) == 0


def test_a_grant_removed_after_the_key_was_read_stops_the_charge(app: Any, api: Api) -> None:
    """The charge checks the grant as it stands under the dataset's lock, not as it was
    when the caller's key was read at the start of the request."""
    from accountant.errors import Forbidden

    api.make_dataset(budget={"epsilon": 10})
    key = api.make_consumer("svc", datasets=["clicks"])
    with pytest.raises(Forbidden):
        charge_authenticated_before(
            app, key, lambda: api.call("PATCH", "/v1/consumers/svc", {"datasets": []})
        )
    assert api.budget()["loss"]["epsilon"] == 0


def test_the_budget_report_shows_a_service_its_own_share(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    service = api.as_key(
        api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 2}})
    )
    assert service.charge(epsilon=0.5).status_code == 201
    mine = service.budget()["consumer"]
    assert mine["name"] == "svc" and mine["loss"]["epsilon"] == 0.5
    assert mine["quota"]["epsilon"] == 2 and mine["remaining"]["epsilon"] == 1.5
    assert "consumer" not in api.budget()  # the admin holds no grant, so no share


def test_me_is_not_a_consumer_name(api: Api) -> None:
    assert api.post("/v1/consumers", {"name": "me", "role": "auditor"}).status_code == 400
    allowed = api.client.options(
        "/v1/consumers/me", headers={"Authorization": f"Bearer {api.key}"}
    ).headers["Allow"]
    assert "PATCH" not in allowed and "GET" in allowed
