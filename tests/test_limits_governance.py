"""Limit changes are governance events: each is ledgered with its reason (none given is
accepted, and shown as "no reason given" on the dashboard, the ledger page and the export),
a change to the same limit is not ledgered and the answer says so, and a limit below what is
spent, or a window or partition limit above the lifetime limit, is answered with notes."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.conftest import ADMIN_KEY, Api
from tests.test_dashboard import _sign_in

NO_REASON = "no reason given"


def _changes(api: Api) -> list[dict[str, Any]]:
    return [entry for entry in api.ledger() if entry["kind"] == "limit_change"]


def _patch(api: Api, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.patch(path, body)
    assert response.status_code == 200, response.get_json()
    return dict(response.get_json())


def _unstated(notes: list[str]) -> bool:
    return any(note.startswith(NO_REASON) for note in notes)


def test_a_change_without_a_reason_is_ledgered_and_shown_as_no_reason_given(
    api: Api, client: FlaskClient
) -> None:
    api.make_dataset()
    api.make_consumer("svc", datasets=["clicks"])
    lifetime = _patch(api, "/v1/datasets/clicks", {"budget": {"epsilon": 2}})
    quota = _patch(api, "/v1/consumers/svc", {"quotas": {"clicks": {"epsilon": 0.5}}})
    windows = _patch(
        api,
        "/v1/datasets/clicks",
        {"windows": [{"period": "1d", "epsilon": 0.5}], "reason": "=spread over days"},
    )
    assert lifetime["changed"] and quota["changed"] and windows["changed"]
    assert _unstated(lifetime["notes"]) and _unstated(quota["notes"])
    assert windows["notes"] == [] and lifetime["budget"]["epsilon"] == 2
    changes = _changes(api)
    assert [(c["detail"]["scope"], c["detail"]["reason"]) for c in changes] == [
        ("dataset", None),  # the ledger keeps what was stated
        ("consumer", None),
        ("window", "=spread over days"),
    ]
    shown = [NO_REASON, NO_REASON, "=spread over days"]
    assert [c["reason"] for c in changes] == shown
    assert all(e["reason"] is None for e in api.ledger() if e["kind"] == "charge")

    jsonl = api.get("/v1/ledger/export?format=jsonl").text.splitlines()
    assert [json.loads(line)["reason"] for line in jsonl] == shown
    rows = list(csv.DictReader(io.StringIO(api.get("/v1/ledger/export?format=csv").text)))
    assert [row["reason"] for row in rows] == [NO_REASON, NO_REASON, "'=spread over days"]

    _sign_in(client, ADMIN_KEY)
    page = client.get("/dashboard/datasets/clicks").get_data(as_text=True)
    table = re.search(r'<table id="limit-changes">.*?</table>', page, re.S)
    assert table is not None, page
    reasons = re.findall(r'<td class="reason">(.*?)</td>', table.group(0))
    assert reasons == ["=spread over days", NO_REASON, NO_REASON]  # newest first
    assert "quota of svc" in table.group(0) and "admin" in table.group(0)
    ledger_page = client.get("/dashboard/ledger?dataset=clicks").get_data(as_text=True)
    assert re.findall(r'<small class="reason">reason: (.*?)</small>', ledger_page) == [
        "=spread over days",
        NO_REASON,
        NO_REASON,
    ]


def test_a_change_to_the_limit_in_force_is_not_ledgered_and_says_so(api: Api) -> None:
    api.make_dataset(
        accounting="approx",
        budget={"epsilon": 1, "delta": 1e-6},
        partition_budget={"epsilon": 0.5},
        windows=[{"period": "1d", "epsilon": 0.5}, {"period": "7d", "epsilon": 0.8}],
    )
    api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 0.4}})
    before = api.get("/v1/datasets/clicks").get_json()
    for body in (
        {"budget": {"epsilon": 1}, "reason": "restated"},
        {"budget": {"epsilon": 1, "delta": 1e-6}},
        {"partition_budget": {"epsilon": 0.5}},
        {"windows": [{"period": "7d", "epsilon": 0.8}, {"period": "1d", "epsilon": 0.5}]},
    ):
        answer = _patch(api, "/v1/datasets/clicks", body)
        assert answer["changed"] is False, body
        assert answer["notes"] == [
            "nothing changed: every limit given equals the current one, so nothing was ledgered"
        ]
        assert {k: v for k, v in answer.items() if k in before} == before
    restated: list[dict[str, Any]] = [{"quotas": {"clicks": {"epsilon": 0.4}}}]
    for consumer_body in [*restated, {"datasets": ["clicks"]}]:
        answer = _patch(api, "/v1/consumers/svc", consumer_body)
        assert answer["changed"] is False and answer["notes"][0].startswith("nothing changed")
    assert _changes(api) == []

    answer = _patch(
        api,
        "/v1/datasets/clicks",
        {"budget": {"epsilon": 1}, "partition_budget": {"epsilon": 0.3}, "reason": "tighter"},
    )
    assert answer["changed"] is True and answer["partition_budget"]["epsilon"] == 0.3
    assert answer["notes"] == [
        "the lifetime limit unchanged: the new limit equals the current one, so nothing was "
        "ledgered"
    ]
    assert [c["detail"]["scope"] for c in _changes(api)] == ["partition"]
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True


#: Per mode: the charge to spend with, and how its measure is named in a note.
MODES = {
    "pure": ({"epsilon": 0.5, "sensitivity": 1}, "laplace", "epsilon"),
    "approx": ({"epsilon": 0.5, "sensitivity": 1}, "laplace", "epsilon"),
    "zcdp": ({"sigma": 3, "sensitivity": 1}, "gaussian", "rho"),
    "rdp": ({"sigma": 3, "sensitivity": 1}, "gaussian", "rdp"),
    "gdp": ({"sigma": 3, "sensitivity": 1}, "gaussian", "mu"),
}


@pytest.mark.parametrize("accounting", sorted(MODES))
def test_a_lifetime_limit_below_what_is_spent_is_accepted_with_a_note(
    api: Api, accounting: str
) -> None:
    params, mechanism, measure = MODES[accounting]
    delta = {} if accounting == "pure" else {"delta": 1e-6}
    api.make_dataset(accounting=accounting, budget={"epsilon": 5, **delta})
    assert api.charge(mechanism=mechanism, params=params).status_code == 201
    answer = _patch(api, "/v1/datasets/clicks", {"budget": {"epsilon": 0.01}, "reason": "audit"})
    assert answer["changed"] is True and len(answer["notes"]) == 1, answer["notes"]
    note = answer["notes"][0]
    assert note.startswith("the lifetime limit is now below what is already spent (")
    assert f"< spent {measure} " in note and "nothing spent is refunded" in note
    assert api.charge(mechanism=mechanism, params=params).status_code == 409  # as the note says
    raised = _patch(api, "/v1/datasets/clicks", {"budget": {"epsilon": 5}, "reason": "restore"})
    assert raised["changed"] is True and raised["notes"] == []


@pytest.mark.frozen_clock  # the window's note is made in the day of its charges
def test_partition_window_and_quota_limits_below_spent_or_above_the_lifetime_get_notes(
    api: Api,
) -> None:
    api.make_dataset(
        budget={"epsilon": 10},
        partition_budget={"epsilon": 2},
        windows=[{"period": "1d", "epsilon": 3}],
    )
    service = api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 2}})
    for _ in range(2):
        assert api.as_key(service).charge(epsilon=0.5).status_code == 201  # p1, 1d and svc: 1

    def notes(path: str, body: dict[str, Any]) -> list[str]:
        answer = _patch(api, path, {**body, "reason": "test"})
        assert answer["changed"] is True
        return list(answer["notes"])

    assert notes("/v1/datasets/clicks", {"partition_budget": {"epsilon": 0.5}}) == [
        "the partition limit is now below what is already spent (epsilon 0.5 < spent "
        "epsilon 1): charges on the partitions that spent more are denied; nothing spent is "
        "refunded"
    ]
    window = notes("/v1/datasets/clicks", {"windows": [{"period": "1d", "epsilon": 0.75}]})
    assert len(window) == 1 and window[0].startswith(
        "the 1d window's limit is now below what is already spent (epsilon 0.75 < spent "
        "epsilon 1): charges are denied until the window resets at 2026-03-03T00:00:00Z"
    )
    assert notes("/v1/consumers/svc", {"quotas": {"clicks": {"epsilon": 0.25}}}) == [
        "the quota of svc on clicks is now below what is already spent (epsilon 0.25 < "
        "spent epsilon 1): its charges there are denied; nothing spent is refunded"
    ]
    assert notes("/v1/consumers/svc", {"quotas": {"clicks": {"epsilon": 3}}}) == []

    above = "is above the lifetime limit (epsilon 10): the lifetime limit binds first, so the "
    assert notes("/v1/datasets/clicks", {"partition_budget": {"epsilon": 12}}) == [
        f"the partition limit (epsilon 12) {above}excess can never be spent"
    ]
    assert notes("/v1/datasets/clicks", {"windows": [{"period": "1d", "epsilon": 11}]}) == [
        f"the 1d window's limit (epsilon 11) {above}excess can never be spent"
    ]
    lowered = notes("/v1/datasets/clicks", {"budget": {"epsilon": 5}})  # below both, above spent
    assert [note.split(" (")[0] for note in lowered] == [
        "the partition limit",
        "the 1d window's limit",
    ]
    assert all("is above the lifetime limit (epsilon 5)" in note for note in lowered)
    assert notes("/v1/datasets/clicks", {"budget": {"epsilon": 20}}) == []
    assert len(_changes(api)) == 8  # every change ledgered, notes or none
