"""Approvals: raising a privacy limit or making an admin takes two admins (DESIGN.md)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from accountant.app import prepared_app
from accountant.clock import FrozenClock
from tests.conftest import ADMIN_KEY, FROZEN_AT_US, Api, run_sql
from tests.test_head_seals import _seals_init

WEEK_S = 7 * 24 * 3600
BIN = Path(sys.executable).parent / "accountant"


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(FROZEN_AT_US)


@pytest.fixture
def app(database_url: str, signing_key_file: str, clock: FrozenClock) -> Flask:
    settings = {
        "database_url": database_url,
        "admin_key": ADMIN_KEY,
        "signing_key_file": signing_key_file,
        "approvals": "on",
    }
    return prepared_app(settings, clock=clock)


@pytest.fixture
def second(api: Api, database_url: str, signing_key_file: str) -> Iterator[Api]:
    """Another admin, made as the first admins are: before approvals apply to it (here by
    the same database served with approvals off)."""
    bootstrap = prepared_app(
        {"database_url": database_url, "admin_key": ADMIN_KEY, "signing_key_file": signing_key_file}
    )
    with bootstrap.test_client() as client:
        made = Api(client).post("/v1/consumers", {"name": "second", "role": "admin"})
        assert made.status_code == 201, made.get_json()
    yield api.as_key(made.get_json()["api_key"])


def _pending(response: Any) -> dict[str, Any]:
    assert response.status_code == 202, response.get_json()
    body = dict(response.get_json())
    assert body["state"] == "pending" and body["requested_by"] == "admin"
    return body


def test_raising_a_limit_waits_for_another_admin(api: Api, second: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    no_reason = api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2.0}})
    assert no_reason.status_code == 400
    assert no_reason.get_json()["errors"][0]["field"] == "reason"
    asked = _pending(
        api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2.0}, "reason": "Q4 report"})
    )
    assert asked["kind"] == "dataset_limits" and asked["change"] == {"budget": {"epsilon": 2.0}}
    # nothing changed: the limit, and the ledger
    assert api.budget()["limit"]["epsilon"] == 1.0
    assert not [e for e in api.ledger() if e["kind"] == "limit_change"]
    request_id = asked["request_id"]
    mine = api.post(f"/v1/requests/{request_id}/approve", {"reason": "fine by me"})
    assert mine.status_code == 403
    approved = second.post(f"/v1/requests/{request_id}/approve", {"reason": "budget review ok"})
    assert approved.status_code == 200, approved.get_json()
    assert approved.get_json()["state"] == "approved"
    assert approved.get_json()["decided_by"] == "second"
    assert api.budget()["limit"]["epsilon"] == 2.0
    [change] = [e for e in api.ledger() if e["kind"] == "limit_change"]
    assert change["consumer"] == "admin"
    detail = change["detail"]
    assert (detail["reason"], detail["approved_by"], detail["approval_reason"]) == (
        "Q4 report",
        "second",
        "budget review ok",
    )
    assert detail["requested_by"] == "admin" and detail["request_id"] == request_id
    again = second.post(f"/v1/requests/{request_id}/approve", {"reason": "twice"})
    assert again.status_code == 409
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True


def test_lowering_a_limit_needs_no_approval_and_removing_one_does(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0}, partition_budget={"epsilon": 0.5})
    lowered = api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 0.8}})
    assert lowered.status_code == 200 and lowered.get_json()["changed"] is True
    tighter = api.patch("/v1/datasets/clicks", {"partition_budget": {"epsilon": 0.4}})
    assert tighter.status_code == 200
    _pending(api.patch("/v1/datasets/clicks", {"partition_budget": None, "reason": "drop it"}))
    # one raise in a PATCH makes the whole of it a request
    mixed = {"budget": {"epsilon": 0.5}, "partition_budget": {"epsilon": 0.45}, "reason": "x"}
    _pending(api.patch("/v1/datasets/clicks", mixed))
    assert api.budget()["limit"]["epsilon"] == 0.8
    # windows and quotas are allocation limits: an admin changes them directly
    windows = api.patch("/v1/datasets/clicks", {"windows": [{"period": "1d", "epsilon": 0.7}]})
    assert windows.status_code == 200


@pytest.mark.parametrize(
    ("accounting", "to"),
    [
        ("zcdp", {"epsilon": 1.05, "delta": 1e-8}),  # epsilon up, the rho it allows down
        ("zcdp", {"epsilon": 0.9, "delta": 1e-5}),  # delta up
        ("rdp", {"epsilon": 1.05, "delta": 1e-8}),
        ("gdp", {"epsilon": 1.05, "delta": 1e-8}),
    ],
)
def test_any_stated_component_raised_waits_even_if_the_enforced_limit_falls(
    api: Api, accounting: str, to: dict[str, float]
) -> None:
    """DESIGN.md: a raise is any component increasing; API.md: any enforced limit higher.
    A change that either calls a raise waits for a second admin."""
    extra: dict[str, Any] = {"rdp_order": 8} if accounting == "rdp" else {}
    api.make_dataset(accounting=accounting, budget={"epsilon": 1.0, "delta": 1e-6}, **extra)
    before = api.budget()["limit"]
    _pending(api.patch("/v1/datasets/clicks", {"budget": to, "reason": "Q4"}))
    assert api.budget()["limit"] == before
    lowered = api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 0.9, "delta": 1e-7}})
    assert lowered.status_code == 200, lowered.get_json()


@pytest.mark.parametrize(
    "lower",
    [
        {"epsilon": 0.4},  # the delta left out is the dataset's, as it was
        {"rho": 1e-4},  # stated as the rho it enforces, far below
        {"epsilon": 0.4, "delta": 1e-7},
    ],
)
def test_lowering_a_zcdp_partition_limit_needs_no_approval(
    api: Api, lower: dict[str, float]
) -> None:
    api.make_dataset(
        accounting="zcdp",
        budget={"epsilon": 1.0, "delta": 1e-6},
        partition_budget={"epsilon": 0.5, "delta": 1e-6},
    )
    lowered = api.patch("/v1/datasets/clicks", {"partition_budget": lower})
    assert lowered.status_code == 200, lowered.get_json()
    raised = {"partition_budget": {"epsilon": 0.6, "delta": 1e-7}, "reason": "more"}
    assert api.patch("/v1/datasets/clicks", raised).status_code == 202


def test_a_denied_or_expired_request_changes_nothing(
    api: Api, second: Api, clock: FrozenClock
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    raise_to = {"budget": {"epsilon": 3.0}, "reason": "more"}
    denied = _pending(api.patch("/v1/datasets/clicks", raise_to))["request_id"]
    refused = second.post(f"/v1/requests/{denied}/deny", {"reason": "not this quarter"})
    assert refused.status_code == 200 and refused.get_json()["state"] == "denied"
    assert second.post(f"/v1/requests/{denied}/approve", {"reason": "y"}).status_code == 409
    late = _pending(api.patch("/v1/datasets/clicks", raise_to))
    clock.advance(WEEK_S)
    listed = api.get("/v1/requests?state=expired").get_json()["requests"]
    assert [r["request_id"] for r in listed] == [late["request_id"]]
    expired = second.post(f"/v1/requests/{late['request_id']}/approve", {"reason": "y"})
    assert expired.status_code == 409
    assert api.budget()["limit"]["epsilon"] == 1.0
    assert api.get("/v1/requests?state=bogus").status_code == 400


def test_a_request_on_a_target_that_changed_cannot_be_approved(api: Api, second: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    asked = _pending(api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2}, "reason": "r"}))
    assert second.patch("/v1/datasets/clicks", {"budget": {"epsilon": 0.9}}).status_code == 200
    stale = second.post(f"/v1/requests/{asked['request_id']}/approve", {"reason": "ok"})
    assert stale.status_code == 409 and "changed since" in stale.get_json()["detail"]
    assert api.budget()["limit"]["epsilon"] == 0.9


def test_a_new_admin_or_admin_key_waits_for_another_admin(api: Api, second: Api) -> None:
    service = api.post("/v1/consumers", {"name": "reporter", "role": "service"})
    assert service.status_code == 201  # not an admin: no approval
    asked = _pending(
        api.post("/v1/consumers", {"name": "third", "role": "admin", "reason": "on call"})
    )
    assert api.get("/v1/consumers").get_json()["consumers"][-1]["name"] != "third"
    approved = second.post(f"/v1/requests/{asked['request_id']}/approve", {"reason": "yes"})
    assert approved.status_code == 200, approved.get_json()
    third = api.as_key(approved.get_json()["result"]["api_key"])
    assert third.get("/v1/consumers/me").get_json()["role"] == "admin"
    key = _pending(api.post("/v1/consumers/second/keys", {"reason": "laptop"}))
    assert key["kind"] == "admin_key" and key["target"] == "second"
    issued = third.post(f"/v1/requests/{key['request_id']}/approve", {"reason": "ok"})
    assert issued.get_json()["result"]["consumer"] == "second"
    assert api.post("/v1/consumers/reporter/keys", {}).status_code == 201


@pytest.fixture
def admins_made(api: Api, second: Api) -> dict[str, Any]:
    """A new admin (third) and a new key of an admin (second) asked for by admin and
    approved, and a new admin denied: what each approval answered, by name."""
    asked = _pending(
        api.post("/v1/consumers", {"name": "third", "role": "admin", "reason": "on call"})
    )
    third = second.post(f"/v1/requests/{asked['request_id']}/approve", {"reason": "rota ok"})
    assert third.status_code == 200, third.get_json()
    key = _pending(api.post("/v1/consumers/second/keys", {"reason": "laptop"}))
    issued = api.as_key(third.get_json()["result"]["api_key"]).post(
        f"/v1/requests/{key['request_id']}/approve", {"reason": "old one lost"}
    )
    assert issued.status_code == 200, issued.get_json()
    refused = _pending(
        api.post("/v1/consumers", {"name": "fourth", "role": "admin", "reason": "x"})
    )
    denied = second.post(f"/v1/requests/{refused['request_id']}/deny", {"reason": "no"})
    assert denied.status_code == 200, denied.get_json()
    return {"third": third.get_json(), "key": issued.get_json(), "asked": [asked, key]}


def test_an_approved_new_admin_or_admin_key_is_ledgered_with_both_names_and_reasons(
    api: Api, admins_made: dict[str, Any]
) -> None:
    """DESIGN.md, "Approvals": the ledger records both names and both reasons. A new admin
    belongs to no dataset: its entries are the admins' chain, ``_admins``; a denial makes
    none, and no entry holds the key itself."""
    entries = api.ledger(dataset="_admins")
    assert [(e["kind"], e["seq"], e["dataset"], e["consumer"]) for e in entries] == [
        ("admin_change", 1, "_admins", "admin"),
        ("admin_change", 2, "_admins", "admin"),
    ]
    third, key = admins_made["third"], admins_made["key"]
    asked_admin, asked_key = admins_made["asked"]
    assert entries[0]["detail"] == {
        "scope": "admin_consumer",
        "role": "admin",
        "consumer": "third",
        "key_id": third["result"]["key_id"],
        "reason": "on call",
        "request_id": asked_admin["request_id"],
        "requested_by": "admin",
        "approved_by": "second",
        "approval_reason": "rota ok",
    }
    assert entries[1]["detail"] == {
        "scope": "admin_key",
        "role": "admin",
        "consumer": "second",
        "key_id": key["result"]["key_id"],
        "reason": "laptop",
        "request_id": asked_key["request_id"],
        "requested_by": "admin",
        "approved_by": "third",
        "approval_reason": "old one lost",
    }
    assert [e["reason"] for e in entries] == ["on call", "laptop"]
    everything = json.dumps(api.ledger())
    assert third["result"]["api_key"] not in everything
    assert key["result"]["api_key"] not in everything
    assert "fourth" not in everything  # denied: nothing made, nothing ledgered
    verified = api.get("/v1/ledger/verify").get_json()
    assert verified["ok"] is True and verified["seals_checked"] is True, verified
    assert verified["heads"]["_admins"] == entries[-1]["hash"]


def test_the_admins_chain_is_exported_signed_and_verifies_offline(
    api: Api, admins_made: dict[str, Any], tmp_path: Path
) -> None:
    from accountant.signing import verify

    response = api.get("/v1/ledger/export?format=jsonl&dataset=_admins")
    lines = response.text.splitlines()
    claims = verify(
        response.headers["Accountant-Export-Signature"],
        api.get("/v1/receipts/public-key").get_json()["keys"],
    )
    last = json.loads(lines[-1])
    assert claims["heads"] == {"_admins": {"seq": 2, "hash": last["hash"]}}
    path = tmp_path / "admins.jsonl"
    path.write_text(response.text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    checked = subprocess.run(
        [BIN, "ledger", "verify", "--file", path], env=env, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    edited = response.text.replace('"approval_reason":"rota ok"', '"approval_reason":"yes"')
    assert edited != response.text
    path.write_text(edited, encoding="utf-8")
    forged = subprocess.run(
        [BIN, "ledger", "verify", "--file", path], env=env, capture_output=True, text=True
    )
    assert forged.returncode != 0 and "'_admins'" in forged.stderr, forged.stderr
    # the CSV names the chain as its signed heads do (a cell led by @ would be escaped)
    rows = csv.DictReader(io.StringIO(api.get("/v1/ledger/export?format=csv").text))
    assert {row["dataset"] for row in rows} == {"_admins"}


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        (
            "UPDATE ledger_entries SET detail = REPLACE(detail, 'rota ok', 'yes') "
            "WHERE admin_chain_id IS NOT NULL",
            "does not match its hash",
        ),
        ("DELETE FROM ledger_entries WHERE admin_chain_id IS NOT NULL AND seq = 2", "seq"),
        ("UPDATE admin_chains SET head_seal = NULL", "head has no seal"),
        (
            "DELETE FROM ledger_entries WHERE admin_chain_id IS NOT NULL;DELETE FROM admin_chains",
            "has no entry in the admins' chain",
        ),
    ],
    ids=["approver's reason edited", "last entry deleted", "head seal removed", "chain deleted"],
)
def test_tampering_with_the_admins_chain_is_named(
    api: Api, admins_made: dict[str, Any], database_url: str, statement: str, reason: str
) -> None:
    if database_url.startswith("postgresql"):  # detail is json there, text on SQLite
        statement = statement.replace("REPLACE(detail,", "REPLACE(detail::text,").replace(
            "'yes')", "'yes')::json"
        )
    for one in statement.split(";"):
        run_sql(database_url, one)
    body = api.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "_admins", body
    assert reason in body["reason"], body["reason"]


def test_raising_a_population_limit_waits_for_another_admin(api: Api, second: Api) -> None:
    body = {"name": "customers", "privacy_unit": "user", "budget": {"epsilon": 1, "delta": 0}}
    assert api.post("/v1/populations", body).status_code == 201
    asked = _pending(
        api.patch("/v1/populations/customers", {"budget": {"epsilon": 2}, "reason": "merge"})
    )
    shown = api.get("/v1/populations/customers").get_json()
    assert shown["budget"]["epsilon"] == 1
    approved = second.post(f"/v1/requests/{asked['request_id']}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.get_json()
    history = api.get("/v1/populations/customers/budget").get_json()["limit_history"]
    assert [h["new"]["epsilon"] for h in history] == [1, 2]
    assert (history[-1]["by"], history[-1]["approved_by"]) == ("admin", "second")
    lowered = api.patch("/v1/populations/customers", {"budget": {"epsilon": 1.5}})
    assert lowered.status_code == 200


def test_a_service_asks_for_quota_and_an_admin_decides(api: Api, second: Api) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    key = api.make_consumer("reporter", datasets=["clicks"], quotas={"clicks": {"epsilon": 0.2}})
    service = api.as_key(key)
    body = {"kind": "quota", "dataset": "clicks", "quota": {"epsilon": 0.5}}
    assert service.post("/v1/requests", body).status_code == 400  # no reason
    asked = service.post("/v1/requests", {**body, "reason": "weekly report grew"})
    assert asked.status_code == 202, asked.get_json()
    request_id = asked.get_json()["request_id"]
    assert service.post(f"/v1/requests/{request_id}/approve", {"reason": "x"}).status_code == 403
    assert [r["request_id"] for r in service.get("/v1/requests").get_json()["requests"]] == [
        request_id
    ]
    approved = api.post(f"/v1/requests/{request_id}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.get_json()
    quota = service.get("/v1/consumers/me").get_json()["quotas"]["clicks"]
    assert quota["epsilon"] == 0.5
    other = api.make_dataset("orders")
    assert other["name"] == "orders"
    refused = service.post(
        "/v1/requests", {**body, "dataset": "orders", "reason": "not granted to me"}
    )
    assert refused.status_code == 403


def test_requests_are_filtered_by_state_before_a_page_is_cut(
    api: Api, second: Api, clock: FrozenClock
) -> None:
    """A page holds ``limit`` requests of the state asked for, however many newer requests
    of other states there are, and ``next_cursor`` leads through the rest."""
    api.make_dataset(budget={"epsilon": 1.0})
    oldest = _pending(api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2}, "reason": "a"}))
    newer = []
    for n in range(3):  # each denied: newer, and no longer pending
        clock.advance(1)
        asked = _pending(
            api.post("/v1/consumers", {"name": f"admin{n}", "role": "admin", "reason": "r"})
        )
        assert second.post(f"/v1/requests/{asked['request_id']}/deny", {"reason": "no"})
        newer.append(asked["request_id"])
    pending = api.get("/v1/requests?state=pending&limit=2").get_json()
    assert [r["request_id"] for r in pending["requests"]] == [oldest["request_id"]]
    assert pending["next_cursor"] is None
    pages, cursor = [], ""
    while cursor is not None:
        page = api.get(f"/v1/requests?limit=2{cursor and f'&cursor={cursor}'}").get_json()
        pages.append([r["request_id"] for r in page["requests"]])
        cursor = page["next_cursor"]
    assert pages == [newer[::-1][:2], [newer[0], oldest["request_id"]]]
    # made in one microsecond (the clock stands still): a page of one at a time, each once
    tied = {
        _pending(api.post("/v1/consumers", {"name": f"tied{n}", "role": "admin", "reason": "r"}))[
            "request_id"
        ]
        for n in range(4)
    }
    seen, cursor = [], ""
    while cursor is not None:
        page = api.get(f"/v1/requests?state=pending&limit=1{cursor and f'&cursor={cursor}'}")
        seen += [r["request_id"] for r in page.get_json()["requests"]]
        cursor = page.get_json()["next_cursor"]
    assert seen == [*sorted(tied, reverse=True), oldest["request_id"]]
    for bad in ("limit=0", "limit=1001", "cursor=x", "cursor=1_", f"cursor={'9' * 19}_a"):
        assert api.get(f"/v1/requests?{bad}").status_code == 400, bad


def test_seals_init_seals_the_admins_chain_and_refuses_while_its_head_carries_a_seal(
    api: Api, admins_made: dict[str, Any], database_url: str, signing_key_file: str
) -> None:
    """The record of when head seals began cleared: the admins' head still carries its
    seal, so `accountant seals init` refuses (sealing again would vouch for whatever was
    edited since). With that seal gone too it seals the chain at its head, and the ledger
    verifies, seals included."""
    run_sql(database_url, "UPDATE key_hash_secrets SET heads_sealed_at = NULL")
    refused = _seals_init(database_url, signing_key_file)
    assert refused.returncode == 1 and "1 chain heads" in refused.stderr, refused.stderr
    run_sql(database_url, "UPDATE admin_chains SET head_seal = NULL")
    sealed = _seals_init(database_url, signing_key_file)
    assert sealed.returncode == 0, sealed.stderr
    body = api.get("/v1/ledger/verify").get_json()
    assert body["ok"] is True and body["seals_checked"] is True, body


def test_the_dashboards_ledger_shows_and_filters_the_admins_chain(
    api: Api, admins_made: dict[str, Any], client: Any
) -> None:
    """The ledger page names each approved new admin with both admins and both reasons, and
    its chain filter offers the admins' chain (and a population's) beside the datasets."""
    from tests.test_dashboard import _sign_in

    body = {"name": "customers", "privacy_unit": "user", "budget": {"epsilon": 1, "delta": 0}}
    assert api.post("/v1/populations", body).status_code == 201
    assert _sign_in(client, ADMIN_KEY)[0] == 303
    page = client.get("/dashboard/ledger?dataset=_admins").get_data(as_text=True)
    assert "<option selected>_admins</option>" in page and "<option >customers</option>" in page
    rows = re.findall(r'<tr class="change"[^>]*data-kind="admin_change".*?</tr>', page, re.S)
    assert len(rows) == 2, page
    key, admin = rows  # newest first
    assert "new admin third" in admin and "reason: on call" in admin
    assert "approved by second: rota ok" in admin
    assert "new key of admin second" in key and "approved by third: old one lost" in key


def test_verify_reads_one_moment_while_an_approval_commits(
    api: Api,
    second: Api,
    database_url: str,
    signing_key_file: str,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An approval committed after verify walked the chains, before it read the requests:
    verify sees neither (one snapshot), not the request without its entry, which it would
    report as the chain deleted (found in review, on PostgreSQL)."""
    from accountant.services import verification

    asked = _pending(api.post("/v1/consumers", {"name": "third", "role": "admin", "reason": "x"}))
    walked = verification._unledgered_admin
    settings = {"database_url": database_url, "signing_key_file": signing_key_file}
    another = prepared_app({**settings, "admin_key": ADMIN_KEY, "approvals": "on"}, clock=clock)

    def approved_meanwhile(session: Any, ledgered: set[str]) -> Any:
        path = f"/v1/requests/{asked['request_id']}/approve"
        other = Api(another.test_client(), second.key)  # a request committed meanwhile
        approved = other.post(path, {"reason": "ok"})
        assert approved.status_code == 200, approved.get_json()
        return walked(session, ledgered)

    monkeypatch.setattr(verification, "_unledgered_admin", approved_meanwhile)
    body = api.get("/v1/ledger/verify").get_json()
    assert body["ok"] is True and body["heads"] == {}, body
    monkeypatch.setattr(verification, "_unledgered_admin", walked)
    assert "_admins" in api.get("/v1/ledger/verify").get_json()["heads"]
