"""Ledger exports (CSV and JSON Lines) round-trip; /metrics counts charges by outcome."""

from __future__ import annotations

import csv
import io
import json

from flask.testing import FlaskClient

from tests.conftest import Api


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
    assert [json.loads(line) for line in jsonl.text.splitlines()] == listed
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
    assert ('accountant_charges_total{dataset="clicks",mechanism="laplace",outcome="granted"} 10'
            in text)
    assert ('accountant_charges_total{dataset="clicks",mechanism="laplace",outcome="denied"} 2'
            in text)
    assert ('accountant_charges_total{dataset="other",mechanism="laplace",outcome="granted"} 1'
            in text)
