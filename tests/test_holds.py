"""Holds: budget charged at once for a job that runs elsewhere (DESIGN.md, holds)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from accountant.clock import FrozenClock
from accountant.services import totals
from accountant_plugins._sampled_gaussian import rdp_cost
from tests.conftest import ADMIN_KEY, Api
from tests.test_dashboard import _shown, _sign_in
from tests.test_ledger_export import _verifiers


def _hold(api: Api, **fields: Any) -> Any:
    headers = fields.pop("headers", None)
    body = {
        "dataset": "clicks",
        "partitions": ["p1"],
        "expires_in": 600,
        **fields,
    }
    if "mechanism" not in body and "amount" not in body:
        body["amount"] = {"epsilon": 0.4}
    return api.post("/v1/holds", body, headers=headers)


def _reconciles(app: Any) -> None:
    """The running totals equal the ledger replayed, and the chains verify."""
    engine = app.extensions["accountant_engine"]
    with Session(engine) as session:
        replayed, differences = totals.check(session)
    assert differences == []
    assert replayed > 0


def test_held_is_what_the_open_holds_add_to_the_loss(api: Api) -> None:
    """On a record dataset the loss is the max over partitions: two holds of 0.5 on two
    partitions add 0.5 to it, not 1.0, and held is part of the loss (found in review)."""
    api.make_dataset(budget={"epsilon": 1.0})
    for partition in ("a", "b"):
        made = _hold(api, partitions=[partition], amount={"epsilon": 0.5})
        assert made.status_code == 201, made.get_json()
    budget = api.budget()
    assert (budget["loss"]["epsilon"], budget["held"]["epsilon"]) == (0.5, 0.5)
    assert budget["spent"]["epsilon"] == 0 and budget["remaining"]["epsilon"] == 0.5
    assert api.charge(partitions=["c"], epsilon=0.25).status_code == 201
    budget = api.budget()  # a release elsewhere below the holds' max adds nothing spent
    assert (budget["loss"]["epsilon"], budget["held"]["epsilon"]) == (0.5, 0.25)
    assert budget["spent"]["epsilon"] == 0.25


def test_a_hold_is_charged_at_once_and_shown_apart_as_held(api: Api, app: Any) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    response = _hold(api, purpose="nightly report")
    assert response.status_code == 201, response.get_json()
    hold = response.get_json()
    assert hold["state"] == "open" and hold["release"] == "joint"
    assert hold["amount"]["epsilon"] == 0.4 and hold["drawn"]["epsilon"] == 0
    assert hold["remaining"]["epsilon"] == 0.6 and hold["purpose"] == "nightly report"
    budget = api.budget()
    assert budget["loss"]["epsilon"] == 0.4 and budget["held"]["epsilon"] == 0.4
    # what the hold charged is gone for everyone: 0.7 more does not fit
    assert api.charge(epsilon=0.7).status_code == 409
    assert api.charge(epsilon=0.6).status_code == 201
    [entry] = [e for e in api.ledger() if e["kind"] == "hold"]
    assert entry["hold_id"] == hold["hold_id"] and entry["status"] == "granted"
    assert entry["charged"]["epsilon"] == 0.4 and entry["charge_id"] is None
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    _reconciles(app)


def test_a_window_added_after_a_hold_is_given_back_what_it_counted_of_it(
    api: Api, app: Any
) -> None:
    """A window added while a hold is open counts the hold (its draws will charge nothing
    there); the hold's release gives the unused amount back to that window too, as the
    ledger replayed does (found in review: the window kept 0.8 against 0.3 in the ledger,
    refused charges that fit, and rebuild-totals called it edited)."""
    api.make_dataset(budget={"epsilon": 10.0})
    hold = _hold(api, partitions=["a"], amount={"epsilon": 0.5})
    assert hold.status_code == 201, hold.get_json()
    windows = {"windows": [{"period": "1h", "epsilon": 1.0}]}
    assert api.patch("/v1/datasets/clicks", windows).status_code == 200
    assert api.budget()["windows"][0]["loss"]["epsilon"] == 0.5
    assert api.charge(partitions=["a"], epsilon=0.3).status_code == 201
    released = api.post(f"/v1/holds/{hold.get_json()['hold_id']}/release")
    assert released.status_code == 200, released.get_json()
    assert api.budget()["windows"][0]["loss"]["epsilon"] == 0.3
    assert api.charge(partitions=["a"], epsilon=0.6).status_code == 201
    _reconciles(app)


def test_a_removed_window_leaves_no_total_behind_to_disagree_with_the_ledger(
    api: Api, app: Any
) -> None:
    """A window budget removed stops being kept up to date, so its running total goes with
    it: rebuild-totals --check found it behind the ledger forever after (found in review);
    added again, the window counts its charges afresh."""
    api.make_dataset(budget={"epsilon": 10.0})
    windows = {"windows": [{"period": "1h", "epsilon": 1.0}]}
    assert api.patch("/v1/datasets/clicks", windows).status_code == 200
    assert api.charge(partitions=["a"], epsilon=0.1).status_code == 201
    assert api.patch("/v1/datasets/clicks", {"windows": []}).status_code == 200
    assert api.charge(partitions=["a"], epsilon=0.2).status_code == 201
    _reconciles(app)
    assert api.patch("/v1/datasets/clicks", windows).status_code == 200
    assert api.budget()["windows"][0]["loss"]["epsilon"] == 0.3
    _reconciles(app)


def test_a_hold_receipt_says_hold_and_is_in_the_ledger(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold = _hold(api).get_json()
    verified = api.post("/v1/receipts/verify", {"receipt": hold["receipt"]}).get_json()
    assert verified["valid"] is True and verified["in_ledger"] is True
    claims = verified["claims"]
    assert claims["kind"] == "hold" and claims["hold_id"] == hold["hold_id"]
    assert claims["amount"]["epsilon"] == 0.4 and "output_sha256" not in claims
    charge = api.charge(epsilon=0.1).get_json()
    claims = api.post("/v1/receipts/verify", {"receipt": charge["receipt"]}).get_json()["claims"]
    assert claims["kind"] == "charge"


def test_a_parallel_hold_charges_amount_times_multiplicity(api: Api) -> None:
    api.make_dataset(privacy_unit="user", max_partitions_per_user=2, budget={"epsilon": 1.0})
    response = _hold(api, partitions=["a", "b", "c"], release="parallel")
    assert response.status_code == 201, response.get_json()
    hold = response.get_json()
    assert hold["multiplicity"] == 2 and hold["charged"]["epsilon"] == 0.8
    assert api.budget()["loss"]["epsilon"] == 0.8


def test_a_hold_that_does_not_fit_is_denied_like_a_charge_and_ledgered(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    assert api.charge(epsilon=0.8).status_code == 201
    response = _hold(api)
    assert response.status_code == 409
    body = response.get_json()
    assert body["scope"] == "dataset" and body["requested"]["epsilon"] == 0.4
    assert body["spent"]["epsilon"] == 0.8 and "this hold would exceed" in body["detail"]
    denied = [e for e in api.ledger() if e["kind"] == "hold"]
    assert [e["status"] for e in denied] == ["denied"]
    assert api.budget()["loss"]["epsilon"] == 0.8 and api.budget()["held"]["epsilon"] == 0


@pytest.mark.frozen_clock  # 10:30 UTC: the hour window ends at 11:00
def test_a_hold_over_a_window_is_429_and_may_not_outlast_the_shortest_window(
    api: Api,
) -> None:
    api.make_dataset(
        budget={"epsilon": 10},
        windows=[{"period": "1h", "epsilon": 0.5}, {"period": "1d", "epsilon": 1}],
    )
    response = _hold(api, amount={"epsilon": 0.6})
    assert response.status_code == 409  # its cost alone exceeds the hour's limit
    detail = response.get_json()["detail"]
    assert "this hold would exceed" in detail and "this charge" not in detail
    assert "by itself it would exceed the window limit" in detail
    assert _hold(api, amount={"epsilon": 0.3}, expires_in=1800).status_code == 201
    response = _hold(api, amount={"epsilon": 0.3}, expires_in=1800)
    assert response.status_code == 429 and response.headers["Retry-After"] == "1800"
    response = _hold(api, amount={"epsilon": 0.1}, expires_in=1801)
    assert response.status_code == 400
    [error] = response.get_json()["errors"]
    assert error["field"] == "expires_in"
    assert "2026-03-02T11:00:00Z" in error["message"] and "1800" in error["message"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"expires_in": 0}, "expires_in"),
        ({"expires_in": 604801}, "expires_in"),
        ({"amount": {"rho": 0.1}}, "amount.rho"),
        ({"amount": {"epsilon": -1}}, "amount.epsilon"),
        ({"amount": {"epsilon": 0.1, "delta": 1e-9}}, "amount.delta"),
        ({"amount": {}}, "amount"),
        ({"mechanism": "nonesuch", "params": {}}, "mechanism"),
        ({"mechanism": "laplace", "params": {"epsilon": 0}}, "params.epsilon"),
        ({"partitions": []}, "partitions"),
    ],
)
def test_bad_holds_are_400_naming_the_field_and_change_nothing(
    api: Api, fields: dict[str, Any], field: str
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    response = _hold(api, **fields)
    assert response.status_code == 400, response.get_json()
    assert field in {error["field"] for error in response.get_json()["errors"]}
    assert api.ledger() == [] and api.budget()["loss"]["epsilon"] == 0


def test_a_hold_is_idempotent_under_its_key(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    first = _hold(api, headers={"Idempotency-Key": "job-7"})
    again = _hold(api, headers={"Idempotency-Key": "job-7"})
    assert first.status_code == again.status_code == 201
    assert first.text == again.text
    assert api.budget()["loss"]["epsilon"] == 0.4
    other = _hold(api, amount={"epsilon": 0.2}, headers={"Idempotency-Key": "job-7"})
    assert other.status_code == 422


def test_a_hold_priced_by_the_subsampled_gaussian_on_rdp(api: Api) -> None:
    api.make_dataset(accounting="rdp", rdp_order=8, budget={"epsilon": 10, "delta": 1e-6})
    params = {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 1000, "sensitivity": 1}
    response = _hold(api, mechanism="subsampled_gaussian", params=params)
    assert response.status_code == 201, response.get_json()
    hold = response.get_json()
    expected = rdp_cost(
        sampling_rate=Fraction(1, 100),
        noise_multiplier=Fraction(11, 10),
        steps=1000,
        order=Fraction(8),
    )
    # rounded up to the stored resolution of 10^-12
    assert 0 <= hold["amount"]["rdp"] - float(expected) <= 2e-12
    assert hold["mechanism"] == "subsampled_gaussian"
    assert abs(hold["amount"]["rdp"] - 0.584070335521) < 1e-11


def test_an_accounting_only_mechanism_takes_no_record_level_sensitivity(api: Api) -> None:
    """The job adds the noise for the clipping norm it states: the accountant cannot scale
    it by the contribution bounds as it does for a mechanism it runs."""
    api.make_dataset(
        privacy_unit="user",
        max_partitions_per_user=2,
        max_records_per_user=3,
        accounting="rdp",
        rdp_order=8,
        budget={"epsilon": 10, "delta": 1e-6},
    )
    params = {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 10, "sensitivity": 1}
    response = _hold(
        api, mechanism="subsampled_gaussian", params={**params, "sensitivity_unit": "record"}
    )
    assert response.status_code == 400, response.get_json()
    [error] = response.get_json()["errors"]
    assert error["field"] == "params.sensitivity_unit" and "accounting-only" in error["message"]
    assert _hold(api, mechanism="subsampled_gaussian", params=params).status_code == 201


def test_a_hold_priced_by_the_subsampled_gaussian_on_approx_needs_a_delta(api: Api) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 10, "delta": 1e-5})
    params = {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 1000}
    response = _hold(api, mechanism="subsampled_gaussian", params=params)
    assert response.status_code == 400
    assert "delta" in response.get_json()["detail"]
    response = _hold(api, mechanism="subsampled_gaussian", params={**params, "delta": 1e-6})
    assert response.status_code == 201, response.get_json()
    amount = response.get_json()["amount"]
    assert amount["delta"] == 1e-6 and 1.75 < amount["epsilon"] < 1.76


@pytest.mark.frozen_clock
def test_an_expired_hold_reads_expired_everywhere_and_keeps_its_charge(
    api: Api, clock: FrozenClock
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold = _hold(api, expires_in=60).get_json()
    path = f"/v1/holds/{hold['hold_id']}"
    assert api.get(path).get_json()["state"] == "open"
    clock.advance(59.999)
    assert api.get(path).get_json()["state"] == "open"
    clock.advance(0.001)  # expired from expires_at inclusive
    assert api.get(path).get_json()["state"] == "expired"
    assert [h["hold_id"] for h in api.get("/v1/holds?state=expired").get_json()["holds"]] == [
        hold["hold_id"]
    ]
    assert api.get("/v1/holds?state=open").get_json()["holds"] == []
    budget = api.budget()
    assert budget["loss"]["epsilon"] == 0.4 and budget["held"]["epsilon"] == 0


def test_who_may_hold_and_read_holds(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    service = api.make_consumer("svc", datasets=["clicks"])
    other = api.make_consumer("other", datasets=["clicks"])
    auditor = api.make_consumer("audit", role="auditor")
    hold = _hold(api, headers={"Authorization": f"Bearer {service}"}).get_json()
    assert _hold(api, headers={"Authorization": f"Bearer {auditor}"}).status_code == 403
    path = f"/v1/holds/{hold['hold_id']}"
    assert api.get(path, headers={"Authorization": f"Bearer {other}"}).status_code == 403
    assert api.get(path, headers={"Authorization": f"Bearer {auditor}"}).status_code == 200
    listed = api.get("/v1/holds", headers={"Authorization": f"Bearer {other}"}).get_json()
    assert listed["holds"] == []
    mine = api.get("/v1/holds?dataset=clicks", headers={"Authorization": f"Bearer {service}"})
    assert [h["hold_id"] for h in mine.get_json()["holds"]] == [hold["hold_id"]]
    assert api.get("/v1/holds/00000000-0000-4000-8000-000000000000").status_code == 404
    assert api.get("/v1/holds?state=nonesuch").status_code == 400
    api.make_dataset("orders", budget={"epsilon": 1.0})
    ungranted = api.get("/v1/holds?dataset=orders", headers={"Authorization": f"Bearer {service}"})
    assert ungranted.status_code == 403, ungranted.get_json()
    assert api.get("/v1/holds?dataset=nope").status_code == 404
    audited = api.get("/v1/holds?dataset=clicks", headers={"Authorization": f"Bearer {auditor}"})
    assert [h["hold_id"] for h in audited.get_json()["holds"]] == [hold["hold_id"]]
    foreign = api.get(path, headers={"Authorization": f"Bearer {other}"}).get_json()
    assert "only its own holds" in foreign["detail"]
    # its own hold, once the dataset is no longer granted: 403, saying why
    assert api.patch("/v1/consumers/svc", {"datasets": ["orders"]}).status_code == 200
    own = api.get(path, headers={"Authorization": f"Bearer {service}"})
    assert own.status_code == 403 and "'clicks' is not granted to 'svc'" in own.get_json()["detail"]


def test_an_export_with_holds_verifies_offline_and_an_edited_hold_id_shows(
    api: Api, tmp_path: Path
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    assert api.charge(epsilon=0.1).status_code == 201
    assert _hold(api).status_code == 201
    assert _hold(api, amount={"epsilon": 0.9}).status_code == 409
    lines = [line for line in api.get("/v1/ledger/export?format=jsonl").text.splitlines() if line]
    assert [json.loads(line)["kind"] for line in lines] == ["charge", "hold", "hold"]
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name, verify in _verifiers(tmp_path).items():
        result = verify(path)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
    edited = json.loads(lines[1])
    edited["hold_id"] = "00000000-0000-4000-8000-000000000000"
    path.write_text("\n".join([lines[0], json.dumps(edited), lines[2]]) + "\n", encoding="utf-8")
    for name, verify in _verifiers(tmp_path).items():
        assert verify(path).returncode != 0, name


def _draw(api: Api, hold_id: str, **fields: Any) -> Any:
    return api.charge(hold=hold_id, **fields)


def test_a_draw_runs_its_mechanism_and_takes_its_cost_from_the_hold_alone(
    api: Api, app: Any
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold = _hold(api, amount={"epsilon": 0.5}).get_json()
    assert api.charge(epsilon=0.5).status_code == 201  # the lifetime is now full
    assert api.charge(epsilon=0.1).status_code == 409
    response = _draw(api, hold["hold_id"], epsilon=0.2)
    assert response.status_code == 201, response.get_json()
    drawn = response.get_json()
    assert drawn["hold_id"] == hold["hold_id"] and len(drawn["output"]["values"]) == 1
    assert drawn["cost"]["epsilon"] == 0.2 and drawn["charged"]["epsilon"] == 0
    assert api.budget()["loss"]["epsilon"] == 1.0  # nothing charged twice
    shown = api.get(f"/v1/holds/{hold['hold_id']}").get_json()
    assert shown["drawn"]["epsilon"] == 0.2 and shown["amount"]["epsilon"] == 0.5
    entry = api.ledger()[-1]
    assert entry["kind"] == "charge" and entry["hold_id"] == hold["hold_id"]
    assert entry["charged"]["epsilon"] == 0 and entry["cost"]["epsilon"] == 0.2
    record = api.get(f"/v1/charges/{drawn['charge_id']}").get_json()  # as recorded
    assert record["hold_id"] == hold["hold_id"] and record["charged"]["epsilon"] == 0
    verified = api.post("/v1/receipts/verify", {"receipt": drawn["receipt"]}).get_json()
    assert verified["in_ledger"] is True and verified["claims"]["hold_id"] == hold["hold_id"]
    assert verified["claims"]["charged"]["epsilon"] == 0
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    _reconciles(app)


def test_a_draw_over_the_remainder_is_409_naming_the_hold(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold_id = _hold(api, amount={"epsilon": 0.5}).get_json()["hold_id"]
    assert _draw(api, hold_id, epsilon=0.2).status_code == 201
    assert _draw(api, hold_id, epsilon=0.2).status_code == 201
    response = _draw(api, hold_id, epsilon=0.2)
    assert response.status_code == 409
    body = response.get_json()
    assert body["scope"] == "hold" and body["limit"]["epsilon"] == 0.5
    assert body["spent"]["epsilon"] == 0.4 and body["requested"]["epsilon"] == 0.2
    assert _draw(api, hold_id, epsilon=0.1).status_code == 201  # exactly the remainder
    denied = [e for e in api.ledger() if e["status"] == "denied"]
    assert [(e["hold_id"], e["detail"]["scope"]) for e in denied] == [(hold_id, "hold")]
    assert api.budget()["loss"]["epsilon"] == 0.5


def test_a_parallel_draw_over_the_remainder_counts_its_cost_once(api: Api) -> None:
    """A hold's remainder is per release, as its amount is: the denial states the draw's
    multiplicity without saying it counts there."""
    api.make_dataset(privacy_unit="user", max_partitions_per_user=2, budget={"epsilon": 10})
    three = {"partitions": ["a", "b", "c"], "release": "parallel"}
    hold_id = _hold(api, amount={"epsilon": 0.3}, **three).get_json()["hold_id"]
    values = {"input": {"values": [1, 2, 3]}}
    assert _draw(api, hold_id, epsilon=0.2, **three, **values).status_code == 201
    response = _draw(api, hold_id, epsilon=0.2, **three, **values)
    assert response.status_code == 409
    body = response.get_json()
    assert body["scope"] == "hold" and body["multiplicity"] == 2
    assert "releases counted" not in body["detail"]


@pytest.mark.frozen_clock
def test_an_expired_hold_cannot_be_drawn_on(api: Api, clock: FrozenClock) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold_id = _hold(api, expires_in=60).get_json()["hold_id"]
    clock.advance(60)
    response = _draw(api, hold_id, epsilon=0.1)
    assert response.status_code == 409
    assert response.get_json()["scope"] == "hold" and "expired" in response.get_json()["detail"]


def test_a_draw_names_its_holds_partitions_and_release(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold_id = _hold(api, partitions=["a", "b"]).get_json()["hold_id"]
    for fields, field in (
        ({"partitions": ["a"]}, "partitions"),
        ({"partitions": ["a", "b"], "release": "parallel"}, "release"),
    ):
        response = _draw(api, hold_id, epsilon=0.1, **fields)
        assert response.status_code == 400, response.get_json()
        assert response.get_json()["errors"][0]["field"] == field
    assert _draw(api, hold_id, partitions=["b", "a"], epsilon=0.1).status_code == 201
    response = _draw(api, hold_id, partitions="*", epsilon=0.1)
    assert response.status_code == 201 and response.get_json()["partitions"] == ["a", "b"]
    missing = "00000000-0000-4000-8000-000000000000"
    assert _draw(api, missing, partitions=["a", "b"]).status_code == 404
    assert [e["status"] for e in api.ledger() if e["kind"] == "charge"] == ["granted"] * 2


def test_only_its_holder_or_an_admin_draws_on_a_hold(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    holder = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    other = api.as_key(api.make_consumer("other", datasets=["clicks"]))
    hold_id = _hold(holder).get_json()["hold_id"]
    assert _draw(other, hold_id).status_code == 403
    assert _draw(holder, hold_id).status_code == 201
    assert _draw(api, hold_id).status_code == 201  # an admin may draw on any


def test_preview_and_plan_check_a_draw_against_its_hold(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold_id = _hold(api, amount={"epsilon": 0.5}).get_json()["hold_id"]
    body = {
        "dataset": "clicks",
        "partitions": ["p1"],
        "mechanism": "laplace",
        "params": {"epsilon": 0.2, "sensitivity": 1},
        "hold": hold_id,
    }
    preview = api.post("/v1/charges/preview", body).get_json()
    assert preview["granted"] is True
    planned = api.post("/v1/charges/plan", body).get_json()
    assert planned["fits"] == 2 and planned["limited_by"]["scope"] == "hold"
    too_much = {**body, "params": {"epsilon": 0.6, "sensitivity": 1}}
    refused = api.post("/v1/charges/preview", too_much).get_json()
    assert refused["granted"] is False and refused["scope"] == "hold"


def test_a_draw_is_idempotent_under_its_key(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold_id = _hold(api).get_json()["hold_id"]
    first = _draw(api, hold_id, epsilon=0.1, headers={"Idempotency-Key": "d1"})
    again = _draw(api, hold_id, epsilon=0.1, headers={"Idempotency-Key": "d1"})
    assert first.status_code == again.status_code == 201 and first.text == again.text
    assert api.get(f"/v1/holds/{hold_id}").get_json()["drawn"]["epsilon"] == 0.1


def _settle(api: Api, hold_id: str, body: Any, **kw: Any) -> Any:
    return api.post(f"/v1/holds/{hold_id}/settle", body, **kw)


def test_a_settle_returns_what_the_job_did_not_use_to_every_scope(api: Api, app: Any) -> None:
    api.make_dataset(budget={"epsilon": 1.0}, partition_budget={"epsilon": 0.6})
    hold = _hold(api, amount={"epsilon": 0.5}).get_json()
    assert _draw(api, hold["hold_id"], epsilon=0.1).status_code == 201
    assert api.charge(epsilon=0.2).status_code == 409  # p1: 0.5 of 0.6 spent
    response = _settle(api, hold["hold_id"], {"used": {"epsilon": 0.3}})
    assert response.status_code == 200, response.get_json()
    settled = response.get_json()
    assert settled["state"] == "settled" and settled["used"]["epsilon"] == 0.3
    assert settled["returned"]["epsilon"] == 0.2 and settled["drawn"]["epsilon"] == 0.1
    budget = api.budget()
    assert budget["loss"]["epsilon"] == 0.3 and budget["held"]["epsilon"] == 0
    assert budget["partitions"]["max_spent"]["epsilon"] == 0.3
    assert api.charge(epsilon=0.3).status_code == 201  # p1: 0.6 of 0.6
    [entry] = [e for e in api.ledger() if e["kind"] == "settle"]
    assert entry["charged"]["epsilon"] == -0.2 and entry["hold_id"] == hold["hold_id"]
    verified = api.post("/v1/receipts/verify", {"receipt": settled["receipt"]}).get_json()
    assert verified["valid"] is True and verified["in_ledger"] is True
    assert verified["claims"]["kind"] == "settle" and verified["claims"]["used"]["epsilon"] == 0.3
    shown = api.get(f"/v1/holds/{hold['hold_id']}").get_json()
    assert shown["state"] == "settled" and shown["returned"]["epsilon"] == 0.2
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    _reconciles(app)
    # settled once: neither a second settle nor a draw
    assert _settle(api, hold["hold_id"], {"used": {"epsilon": 0.3}}).status_code == 409
    response = _draw(api, hold["hold_id"], epsilon=0.1)
    assert response.status_code == 409 and "settled" in response.get_json()["detail"]


def test_a_release_settles_at_what_charges_drew(api: Api, app: Any) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold_id = _hold(api, amount={"epsilon": 0.5}).get_json()["hold_id"]
    assert _draw(api, hold_id, epsilon=0.15).status_code == 201
    response = api.post(f"/v1/holds/{hold_id}/release")
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["used"]["epsilon"] == 0.15
    assert response.get_json()["returned"]["epsilon"] == 0.35
    assert api.budget()["loss"]["epsilon"] == 0.15
    assert api.post(f"/v1/holds/{hold_id}/release").status_code == 409
    _reconciles(app)


@pytest.mark.parametrize(
    ("used", "field", "says"),
    [
        ({"epsilon": 0.05}, "used", "what its charges drew (epsilon 0.1)"),
        ({"epsilon": 0.6}, "used", "the hold's amount (epsilon 0.5)"),
        ({"rho": 0.1}, "used.rho", "rho"),
        ({"epsilon": -0.1}, "used.epsilon", "epsilon"),
    ],
)
def test_a_settle_outside_drawn_and_amount_is_400_and_changes_nothing(
    api: Api, used: dict[str, Any], field: str, says: str
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold_id = _hold(api, amount={"epsilon": 0.5}).get_json()["hold_id"]
    assert _draw(api, hold_id, epsilon=0.1).status_code == 201
    response = _settle(api, hold_id, {"used": used})
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["errors"][0]["field"] == field
    assert says in response.get_json()["errors"][0]["message"], response.get_json()
    assert api.budget()["loss"]["epsilon"] == 0.5
    assert api.get(f"/v1/holds/{hold_id}").get_json()["state"] == "open"


@pytest.mark.parametrize(
    ("dataset", "measure"),
    [({"accounting": "rdp", "rdp_order": 8}, "rdp"), ({"accounting": "gdp"}, "mu")],
)
def test_a_settle_above_the_amount_states_it_as_the_amount_was_stated(
    api: Api, dataset: dict[str, Any], measure: str
) -> None:
    api.make_dataset(budget={"epsilon": 10, "delta": 1e-6}, **dataset)
    hold_id = _hold(api, amount={measure: 0.5}).get_json()["hold_id"]
    response = _settle(api, hold_id, {"used": {measure: 0.75}})
    assert response.status_code == 400, response.get_json()
    message = response.get_json()["errors"][0]["message"]
    assert f"the hold's amount ({measure} 0.5)" in message, message


def test_a_job_on_rdp_that_stopped_early_settles_at_the_steps_it_ran(api: Api, app: Any) -> None:
    api.make_dataset(accounting="rdp", rdp_order=8, budget={"epsilon": 10, "delta": 1e-6})
    params = {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 1000}
    hold = _hold(api, mechanism="subsampled_gaussian", params=params).get_json()
    response = _settle(api, hold["hold_id"], {"params": {"steps": 600}})
    assert response.status_code == 200, response.get_json()
    ran = rdp_cost(
        sampling_rate=Fraction(1, 100),
        noise_multiplier=Fraction(11, 10),
        steps=600,
        order=Fraction(8),
    )
    used = response.get_json()["used"]["rdp"]
    assert 0 <= used - float(ran) <= 2e-12
    assert api.budget()["loss"]["rdp"] == used
    _reconciles(app)


def test_a_settle_with_fractional_params_ledgers_them_as_their_exact_text(
    api: Api, app: Any
) -> None:
    api.make_dataset(budget={"epsilon": 2.0})
    params = {"epsilon": 1, "sensitivity": 1}
    hold = _hold(api, mechanism="laplace", params=params).get_json()
    response = _settle(api, hold["hold_id"], {"params": {"epsilon": 0.3}})
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["used"]["epsilon"] == 0.3
    assert response.get_json()["returned"]["epsilon"] == 0.7
    assert api.budget()["loss"]["epsilon"] == 0.3
    entries = api.get("/v1/ledger?dataset=clicks").get_json()["entries"]
    assert entries[-1]["kind"] == "settle"
    assert entries[-1]["params"] == {"epsilon": "0.3"}
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    _reconciles(app)


def test_a_plan_composed_tightly_on_approx_settles_whole_or_is_released(api: Api) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 10, "delta": 1e-5})
    params = {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 1000, "delta": 1e-6}
    first = _hold(api, mechanism="subsampled_gaussian", params=params).get_json()["hold_id"]
    response = _settle(api, first, {"params": {"steps": 600}})
    assert response.status_code == 400
    assert response.get_json()["errors"][0]["field"] == "params"
    response = _settle(api, first, {"used": {"epsilon": 1.0, "delta": 1e-6}})
    assert response.status_code == 400
    response = _settle(api, first, {"params": {"steps": 1000}})
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["returned"]["epsilon"] == 0
    second = _hold(api, mechanism="subsampled_gaussian", params=params).get_json()["hold_id"]
    assert api.post(f"/v1/holds/{second}/release").status_code == 200


@pytest.mark.frozen_clock
def test_a_settle_gives_back_to_the_window_the_hold_was_charged_to(
    api: Api, app: Any, clock: FrozenClock
) -> None:
    api.make_dataset(budget={"epsilon": 10}, windows=[{"period": "1d", "epsilon": 0.5}])
    hold_id = _hold(api, amount={"epsilon": 0.4}).get_json()["hold_id"]
    assert api.charge(epsilon=0.2).status_code == 429
    assert _settle(api, hold_id, {"used": {"epsilon": 0.1}}).status_code == 200
    assert api.budget()["windows"][0]["loss"]["epsilon"] == 0.1
    assert api.charge(epsilon=0.2).status_code == 201
    _reconciles(app)


def test_a_parallel_hold_on_a_user_dataset_settles_exactly(api: Api, app: Any) -> None:
    api.make_dataset(privacy_unit="user", max_partitions_per_user=2, budget={"epsilon": 2.0})
    assert api.charge(partitions=["a"], epsilon=0.3).status_code == 201
    hold = _hold(api, partitions=["a", "b", "c"], release="parallel").get_json()
    assert api.budget()["loss"]["epsilon"] == 1.1  # min(T 0.3 + 0.8, top-2 0.7 + 0.4)
    response = _settle(api, hold["hold_id"], {"used": {"epsilon": 0.1}})
    assert response.status_code == 200, response.get_json()
    assert api.budget()["loss"]["epsilon"] == 0.5  # min(0.3 + 0.2, 0.4 + 0.1)
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    _reconciles(app)


@pytest.mark.frozen_clock
def test_an_expired_hold_cannot_be_settled_and_keeps_its_charge(
    api: Api, clock: FrozenClock
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hold_id = _hold(api, expires_in=60).get_json()["hold_id"]
    clock.advance(60)
    assert _settle(api, hold_id, {"used": {"epsilon": 0.1}}).status_code == 409
    assert api.post(f"/v1/holds/{hold_id}/release").status_code == 409
    assert api.budget()["loss"]["epsilon"] == 0.4


def test_who_may_settle_and_a_settle_is_idempotent(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    holder = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    other = api.as_key(api.make_consumer("other", datasets=["clicks"]))
    hold_id = _hold(holder).get_json()["hold_id"]
    assert _settle(other, hold_id, {"used": {"epsilon": 0.1}}).status_code == 403
    key = {"Idempotency-Key": "settle-1"}
    first = _settle(holder, hold_id, {"used": {"epsilon": 0.1}}, headers=key)
    again = _settle(holder, hold_id, {"used": {"epsilon": 0.1}}, headers=key)
    assert first.status_code == again.status_code == 200 and first.text == again.text
    assert _settle(holder, hold_id, {"used": {"epsilon": 0.2}}, headers=key).status_code == 422
    admin_held = _hold(api).get_json()["hold_id"]
    assert api.post(f"/v1/holds/{admin_held}/release", headers=key).status_code == 200
    missing = "00000000-0000-4000-8000-000000000000"
    assert _settle(api, missing, {"used": {"epsilon": 0.1}}).status_code == 404


#: (dataset terms, charges and holds as (partitions, release, epsilon, is_hold)).
_SPLITS: dict[str, tuple[dict[str, Any], list[tuple[list[str], str, float, bool]]]] = {
    # a hold outside the k largest adds to T only: the loss is the k largest
    "user, hold outside the k largest": (
        {"privacy_unit": "user", "max_partitions_per_user": 1},
        [(["a"], "joint", 1.0, False), (["d"], "joint", 0.3, True)],
    ),
    "user k=2, holds inside and outside": (
        {"privacy_unit": "user", "max_partitions_per_user": 2},
        [
            (["a"], "joint", 1.0, False),
            (["b"], "joint", 0.8, False),
            (["c"], "joint", 0.5, False),
            (["c"], "joint", 0.3, True),
            (["b"], "joint", 0.3, True),
            (["a", "b", "c"], "parallel", 0.2, True),
        ],
    ),
    "user unbounded, parallel": (
        {"privacy_unit": "user"},
        [(["a", "b"], "parallel", 0.4, False), (["b", "c"], "parallel", 0.25, True)],
    ),
    # parallel composition: a hold on another partition than the most spent one
    "record, disjoint": (
        {"privacy_unit": "record"},
        [(["a"], "joint", 1.0, False), (["d"], "joint", 0.3, True), (["a"], "joint", 0.1, True)],
    ),
}


@pytest.mark.parametrize("case", sorted(_SPLITS))
def test_spent_is_the_loss_of_the_same_releases_without_the_open_holds(
    api: Api, client: Any, case: str
) -> None:
    """The budget report's spent is the loss the dataset would have without its open holds:
    the loss of a twin dataset given the same charges and no holds. The dashboard's held is
    the loss less spent (what the holds add to the loss), and the two add up to it. It read
    the holds' amounts and loss less held, which the k largest or the max do not allow."""
    terms, steps = _SPLITS[case]
    for name in ("clicks", "twin"):
        api.make_dataset(name, accounting="pure", budget={"epsilon": 10}, **terms)
    for partitions, release, epsilon, is_hold in steps:
        if is_hold:
            held = _hold(api, partitions=partitions, release=release, amount={"epsilon": epsilon})
            assert held.status_code == 201, held.get_json()
        else:
            for name in ("clicks", "twin"):
                charged = api.charge(name, partitions, epsilon, release)
                assert charged.status_code == 201, charged.get_json()
    report, twin = api.budget(), api.budget("twin")
    assert report["spent"]["epsilon"] == twin["loss"]["epsilon"], (report, twin)
    assert twin["spent"] == twin["loss"]  # no hold: spent is the loss
    held = round(report["loss"]["epsilon"] - report["spent"]["epsilon"], 9)
    _sign_in(client, ADMIN_KEY)
    page = client.get("/dashboard/datasets/clicks").get_data(as_text=True)
    assert f'<span id="spent">{_shown(report["spent"]["epsilon"])}</span>' in page
    assert f'<span id="held">{_shown(held)}</span>' in page


def test_spent_with_a_hold_on_every_partition_reads_without_naming_them(api: Api) -> None:
    """A hold on "*" stores every partition: the split reads them without binding each
    key (a statement takes a bounded number of parameters: 65,535 on PostgreSQL)."""
    api.make_dataset(accounting="pure", budget={"epsilon": 10})
    keys = [f"k{i:04d}" for i in range(700)]
    assert api.post("/v1/datasets/clicks/partitions", {"keys": keys}).status_code == 201
    assert api.charge(partitions=["k0001"], epsilon=1.0).status_code == 201
    held = _hold(api, partitions="*", amount={"epsilon": 0.25})
    assert held.status_code == 201, held.get_json()
    report = api.budget()
    assert report["loss"]["epsilon"] == 1.25 and report["spent"]["epsilon"] == 1.0
