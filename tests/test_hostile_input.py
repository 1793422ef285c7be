"""Hostile input: numbers that would cost a worker its life when made exact, digits that are
not ASCII, lone surrogates, formula cells in CSV exports, very long declarations."""

from __future__ import annotations

import pytest

from accountant.app import prepared_app
from tests.conftest import ADMIN_KEY, Api

CHARGE = (
    '{"dataset": "clicks", "partitions": ["p"], "mechanism": "laplace", '
    '"params": {"epsilon": %s, "sensitivity": 1}, "input": {"values": [1]}}'
)


@pytest.mark.parametrize(
    "number", ["1e-999999999", "1e999999999", "0e-999999", "9" * 5000, "0." + "0" * 200 + "1"]
)
@pytest.mark.parametrize("path", ["/v1/charges", "/v1/charges/preview"])
def test_an_unbounded_number_is_a_400_naming_its_field(api: Api, number: str, path: str) -> None:
    api.make_dataset()
    response = api.post(path, raw=CHARGE % number)
    assert response.status_code == 400
    assert response.content_type == "application/problem+json"
    assert response.get_json()["errors"][0]["field"] == "params.epsilon"
    assert api.ledger() == []


def test_numbers_within_the_bounds_still_parse(api: Api) -> None:
    api.make_dataset()
    assert api.post("/v1/charges", raw=CHARGE % "1e-320").status_code == 400  # too small to run
    assert api.post("/v1/charges", raw=CHARGE % "0.100000000000000000000").status_code == 201


@pytest.mark.parametrize("query", ["limit=%C2%B2", "cursor=%D9%A3", "limit=" + "9" * 5000])
def test_digits_must_be_ascii_digits(api: Api, query: str) -> None:
    api.make_dataset()
    for path in ("/v1/ledger", "/v1/datasets/clicks/partitions"):
        response = api.get(f"{path}?{query}")
        assert response.status_code == 400, (path, response.text)
        assert response.content_type == "application/problem+json"


@pytest.mark.parametrize(
    ("path", "method", "body"),
    [
        (
            "/v1/datasets",
            "POST",
            r'{"name": "x\ud800", "privacy_unit": "record", '
            r'"accounting": "pure", "budget": {"epsilon": 1}}',
        ),
        ("/v1/datasets/clicks", "PATCH", r'{"budget": {"epsilon": 2}, "reason": "a\udfffb"}'),
        ("/v1/consumers", "POST", r'{"name": "svc", "role": "service", "datasets": ["\ud800"]}'),
    ],
)
def test_a_lone_surrogate_is_a_400_and_changes_nothing(
    api: Api, path: str, method: str, body: str
) -> None:
    api.make_dataset()
    before = api.ledger()
    response = api.call(method, path, raw=body)
    assert response.status_code == 400, response.text
    assert response.content_type == "application/problem+json"
    assert "surrogate" in response.get_json()["detail"]
    assert api.ledger() == before


def test_csv_export_cells_never_start_a_formula(api: Api) -> None:
    api.make_dataset()
    assert api.charge(partitions=['=HYPERLINK("http://x")', "@SUM(1)"]).status_code == 201
    exported = api.get("/v1/ledger/export?format=csv").text
    from accountant.ledger_export import _cell

    assert _cell("=1+2") == "'=1+2" and _cell("-3") == "'-3" and _cell("ok") == "ok"
    import csv
    import io

    for row in csv.DictReader(io.StringIO(exported)):
        for value in row.values():
            assert not value.startswith(("=", "+", "-", "@")), value


@pytest.mark.slow
def test_two_hundred_thousand_partitions_in_one_declaration(
    database_url: str, signing_key_file: str
) -> None:
    # a volume test, not a stall test: generous timeouts, so a loaded machine cannot fail it
    api = Api(
        prepared_app(
            {
                "database_url": database_url,
                "admin_key": ADMIN_KEY,
                "signing_key_file": signing_key_file,
                "lock_timeout_ms": 60_000,
                "database_timeout_ms": 60_000,
            }
        ).test_client()
    )
    api.make_dataset()
    keys = [f"k{i:06d}" for i in range(200_000)]
    response = api.post("/v1/datasets/clicks/partitions", {"keys": keys})
    assert response.status_code == 201, response.text[:300]
    again = api.post("/v1/datasets/clicks/partitions", {"keys": [*keys[:100_000], "new"]})
    assert again.status_code == 201
    assert api.get("/v1/datasets/clicks/partitions?limit=1").status_code == 200
