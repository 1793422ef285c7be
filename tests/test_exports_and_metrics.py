"""Ledger exports (CSV and JSON Lines) round-trip; /metrics counts charges by outcome."""

from __future__ import annotations

import csv
import io
import json

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event, select

from accountant.app import prepared_app
from accountant.db import begin_write
from accountant.driver import Driver
from accountant.exact import Amount
from accountant.models import LedgerEntry
from accountant.services import datasets, ledger
from tests.conftest import ADMIN_KEY, Api


def _busy(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 1})
    api.make_dataset("other", budget={"epsilon": 1})
    for _ in range(12):
        api.charge(partitions=["p"], epsilon=0.1)  # one partition: ten granted, two denied
    api.charge(dataset="other", epsilon=0.5)


def test_exports_round_trip(api: Api) -> None:
    _busy(api)
    listed = api.ledger(dataset="clicks")
    jsonl = api.get("/v1/ledger/export?format=jsonl&dataset=clicks")
    assert jsonl.status_code == 200
    exported = [json.loads(line) for line in jsonl.text.splitlines()]
    assert "export_signature" in exported[-1]  # added to the last line (docs/ledger.md)
    assert [{k: v for k, v in e.items() if k != "export_signature"} for e in exported] == listed
    table = api.get("/v1/ledger/export?format=csv&dataset=clicks")
    rows = list(csv.DictReader(io.StringIO(table.text)))
    assert [int(r["id"]) for r in rows] == [e["id"] for e in listed]
    assert [json.loads(r["partitions"]) for r in rows] == [e["partitions"] for e in listed]
    assert [r["hash"] for r in rows] == [e["hash"] for e in listed]
    denied = api.get("/v1/ledger/export?format=jsonl&status=denied").text.splitlines()
    assert len(denied) == 2
    assert api.get("/v1/ledger/export?format=xml").status_code == 400


def test_metrics_count_charges_by_outcome(api: Api, client: FlaskClient) -> None:
    _busy(api)
    text = client.get("/metrics").get_data(as_text=True)
    assert (
        'accountant_charges_total{dataset="clicks",mechanism="laplace",outcome="granted"} 10'
        in text
    )
    assert (
        'accountant_charges_total{dataset="clicks",mechanism="laplace",outcome="denied"} 2' in text
    )
    assert (
        'accountant_charges_total{dataset="other",mechanism="laplace",outcome="granted"} 1' in text
    )
    assert "\naccountant_database_up 1\n" in text


def test_a_scrape_reads_no_ledger_entry(api: Api, app: Flask, client: FlaskClient) -> None:
    """The counts come from the charges' own counters and the gauges from the scope rows:
    every statement a scrape sends is recorded, and none reads ledger_entries."""
    _busy(api)
    api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 2}})  # a limit change too
    statements: list[str] = []
    engine = app.extensions["accountant_engine"]

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        text = client.get("/metrics").get_data(as_text=True)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert 'outcome="denied"} 2' in text and statements
    assert not [s for s in statements if "ledger_entries" in s], statements


def test_metrics_can_require_a_key(database_url: str, signing_key_file: str) -> None:
    key = "m" * 40
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
            "metrics_key": key,
        }
    )
    with app.test_client() as client:
        for headers in (
            {},
            {"Authorization": "Bearer " + "x" * 40},
            {"Authorization": f"Bearer {ADMIN_KEY}"},
        ):
            refused = client.get("/metrics", headers=headers)
            assert refused.status_code == 401, headers
            assert refused.content_type == "application/problem+json"
            assert "ACCOUNTANT_METRICS_KEY" in refused.get_json()["detail"]
        answered = client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
        assert answered.status_code == 200 and "accountant_mechanisms" in answered.text
        assert client.get("/healthz").status_code == 200  # health stays open


@pytest.mark.frozen_clock  # the window's utilisation is read in the day of its charge
def test_metrics_report_latency_and_utilisation(api: Api, client: FlaskClient) -> None:
    api.make_dataset(
        budget={"epsilon": 1},
        partition_budget={"epsilon": 0.5},
        windows=[{"period": "1d", "epsilon": 0.8}],
    )
    text = client.get("/metrics").get_data(as_text=True)
    before = _count(text, 'accountant_charge_duration_seconds_count{outcome="granted"}')
    api.charge(partitions=["a"], epsilon=0.4)
    api.charge(partitions=["a"], epsilon=0.4)  # denied by the partition limit
    text = client.get("/metrics").get_data(as_text=True)
    assert _count(text, 'accountant_charge_duration_seconds_count{outcome="granted"}') == before + 1
    assert 'accountant_budget_utilisation{dataset="clicks",scope="dataset"} 0.4' in text
    assert 'accountant_budget_utilisation{dataset="clicks",scope="partition"} 0.8' in text
    assert 'accountant_budget_utilisation{dataset="clicks",scope="window_1d"} 0.5' in text
    assert "accountant_database_errors_total" in text
    assert "partition=" not in text and "key=" not in text  # bounded label sets


def test_metrics_say_how_long_the_transactions_of_charges_took(
    api: Api, client: FlaskClient
) -> None:
    api.make_dataset(budget={"epsilon": 1})
    series = {
        name: f'accountant_dataset_{name}_total{{dataset="clicks"}}'
        for name in ("transaction_seconds", "transactions", "transaction_units")
    }
    text = client.get("/metrics").get_data(as_text=True)
    before = {name: _count(text, line) if line in text else 0.0 for name, line in series.items()}
    api.charge(partitions=["a"], epsilon=0.4)
    api.charge(partitions=["a"], epsilon=0.7)  # denied: in a transaction too
    text = client.get("/metrics").get_data(as_text=True)
    after = {name: _count(text, line) for name, line in series.items()}
    assert after["transactions"] == before["transactions"] + 2  # one at a time: no group
    assert after["transaction_units"] == before["transaction_units"] + 2
    assert after["transaction_seconds"] > before["transaction_seconds"]
    unknown = api.charge(dataset="no-such-dataset")  # adds no label of a caller's choice
    assert unknown.status_code == 404
    assert 'dataset="no-such-dataset"' not in client.get("/metrics").get_data(as_text=True)


def _count(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_a_ten_thousand_entry_export_round_trips(api: Api, app: Flask) -> None:
    api.make_dataset(budget={"epsilon": 1000})
    sessions = app.extensions["accountant"].sessions
    hasher = app.extensions["accountant"].key_hasher  # each head sealed, as the service does
    with sessions() as session:
        begin_write(session)
        dataset = datasets.find(session, "clicks", lock=True)
        for index in range(10_000):
            ledger.append(
                Driver.of(session),
                dataset,
                None,
                kind="charge",
                status="granted",
                created_at=1_795_000_000_000_000 + index,
                charge_id=f"c-{index:05d}",
                mechanism="laplace",
                release="joint",
                partitions=[f"p{index % 97}"],
                cost=Amount(epsilon=1_000_000),
                hasher=hasher,
            )
        session.commit()
        stored = [
            (row.id, row.hash)
            for row in session.execute(
                select(LedgerEntry.id, LedgerEntry.hash).order_by(LedgerEntry.id)
            )
        ]
    lines = api.get("/v1/ledger/export?format=jsonl").text.splitlines()
    exported = [json.loads(line) for line in lines]
    assert [(e["id"], e["hash"]) for e in exported] == stored and len(stored) == 10_000
    assert exported[1234]["partitions"] == ["p70"] and exported[1234]["cost"]["epsilon"] == 0.001
    rows = list(csv.DictReader(io.StringIO(api.get("/v1/ledger/export?format=csv").text)))
    assert [(int(r["id"]), r["hash"]) for r in rows] == stored
    assert api.get("/v1/ledger/verify").get_json() == {
        "ok": True,
        "entries": 10_000,
        "heads": {"clicks": stored[-1][1]},
        "seals_checked": True,
    }
