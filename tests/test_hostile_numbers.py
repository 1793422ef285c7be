"""Numbers that would cost a worker its life when made exact are refused at parsing, naming
their field; so are digits that are not ASCII digits."""

from __future__ import annotations

import pytest

from tests.conftest import Api

CHARGE = ('{"dataset": "clicks", "partitions": ["p"], "mechanism": "laplace", '
          '"params": {"epsilon": %s, "sensitivity": 1}, "input": {"values": [1]}}')


@pytest.mark.parametrize("number", ["1e-999999999", "1e999999999", "0e-999999",
                                    "9" * 5000, "0." + "0" * 200 + "1"])
@pytest.mark.parametrize("path", ["/v1/charges", "/v1/charges/preview"])
def test_an_unbounded_number_is_a_400_naming_its_field(api: Api, number: str,
                                                       path: str) -> None:
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


@pytest.mark.parametrize(("path", "method", "body"), [
    ("/v1/datasets", "POST", r'{"name": "x\ud800", "privacy_unit": "record", '
                             r'"accounting": "pure", "budget": {"epsilon": 1}}'),
    ("/v1/datasets/clicks", "PATCH", r'{"budget": {"epsilon": 2}, "reason": "a\udfffb"}'),
    ("/v1/consumers", "POST", r'{"name": "svc", "role": "service", "datasets": ["\ud800"]}'),
])
def test_a_lone_surrogate_is_a_400_and_changes_nothing(api: Api, path: str, method: str,
                                                      body: str) -> None:
    api.make_dataset()
    before = api.ledger()
    response = api.call(method, path, raw=body)
    assert response.status_code == 400, response.text
    assert response.content_type == "application/problem+json"
    assert "surrogate" in response.get_json()["detail"]
    assert api.ledger() == before
