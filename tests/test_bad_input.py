"""Every bad input gets a 4xx problem+json and changes nothing."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from flask.testing import FlaskClient

from accountant.config import ConfigError, load_settings
from tests.conftest import ADMIN_KEY, Api

VALID = {
    "dataset": "clicks",
    "partitions": ["p1"],
    "mechanism": "laplace",
    "params": {"epsilon": 0.1, "sensitivity": 1},
    "input": {"values": [1.0]},
}


def _with(path: str, value: Any) -> str:
    body = json.loads(json.dumps(VALID))
    *parents, last = path.split(".")
    target = body
    for part in parents:
        target = target[part]
    if value is _DROP:
        del target[last]
    else:
        target[last] = value
    return json.dumps(body)


_DROP = object()

BAD_CHARGES = {
    "malformed json": '{"dataset": "clicks",',
    "not an object": "[1, 2, 3]",
    "empty body": "",
    "nan epsilon": _with("params.epsilon", 1).replace('"epsilon": 1', '"epsilon": NaN'),
    "infinite epsilon": _with("params.epsilon", 1).replace('"epsilon": 1', '"epsilon": Infinity'),
    "huge epsilon": _with("params.epsilon", 1).replace('"epsilon": 1', '"epsilon": 1e999'),
    "zero epsilon": _with("params.epsilon", 0),
    "negative epsilon": _with("params.epsilon", -0.1),
    "epsilon as string": _with("params.epsilon", "0.1"),
    "epsilon as boolean": _with("params.epsilon", True),
    "zero sensitivity": _with("params.sensitivity", 0),
    "negative sensitivity": _with("params.sensitivity", -1),
    "missing epsilon": _with("params.epsilon", _DROP),
    "unknown param": _with("params.scale", 3),
    "unknown field": _with("priority", "high"),
    "empty partitions": _with("partitions", []),
    "duplicate partitions": _with("partitions", ["a", "a"]),
    "star as a key": _with("partitions", ["*"]),
    "non-printable key": _with("partitions", ["a\u0000b"]),
    "long key": _with("partitions", ["k" * 129]),
    "partitions as number": _with("partitions", 3),
    "unknown release": _with("release", "sequential"),
    "unknown mechanism": _with("mechanism", "magic"),
    "missing input": _with("input", _DROP),
    "input values and size": _with("input", {"values": [1], "size": 2}),
    "non-numeric value": _with("input", {"values": ["x"]}),
    "huge value": _with("input", {"values": [1e308]}).replace("1e+308", "1e999"),
    "size zero": _with("input", {"size": 0}),
    "size too large": _with("input", {"size": 100_001}),
    "duplicate json key": '{"dataset": "clicks", "dataset": "other"}',
    "sensitivity unit on a record dataset": _with("params.sensitivity_unit", "record"),
    "bad sensitivity unit": _with("params.sensitivity_unit", "person"),
    "gaussian on a pure dataset": json.dumps(
        {
            **VALID,
            "mechanism": "gaussian",
            "params": {"epsilon": 0.1, "delta": 1e-6, "sensitivity": 1},
        }
    ),
}


@pytest.fixture
def ready(api: Api) -> Api:
    api.make_dataset(budget={"epsilon": 1})
    assert api.charge(partitions=["p0"]).status_code == 201
    return api


@pytest.mark.parametrize("case", sorted(BAD_CHARGES))
def test_bad_charge_is_400_and_changes_nothing(ready: Api, case: str) -> None:
    before = (ready.budget(), ready.ledger())
    response = ready.post("/v1/charges", raw=BAD_CHARGES[case])
    assert response.status_code == 400, response.text
    assert response.content_type == "application/problem+json"
    body = response.get_json()
    assert body["status"] == 400 and body["detail"] and body["type"].endswith("/validation")
    assert isinstance(body["errors"], list) and body["errors"]
    assert (ready.budget(), ready.ledger()) == before


def test_errors_name_the_field(ready: Api) -> None:
    body = ready.post("/v1/charges", raw=BAD_CHARGES["zero epsilon"]).get_json()
    assert body["errors"][0]["field"] == "params.epsilon"
    body = ready.post("/v1/charges", raw=BAD_CHARGES["unknown field"]).get_json()
    assert body["errors"][0]["field"] == "priority"
    for case in ("nan epsilon", "infinite epsilon"):
        body = ready.post("/v1/charges", raw=BAD_CHARGES[case]).get_json()
        assert body["errors"][0]["field"] == "params.epsilon", body


def test_unknown_dataset_is_404(ready: Api) -> None:
    response = ready.charge(dataset="nope")
    assert response.status_code == 404
    assert response.content_type == "application/problem+json"


@pytest.mark.parametrize(
    "request_of",
    [
        lambda api: api.charge(dataset="clicks\u0000"),
        lambda api: api.charge(partitions=["p\u0000"]),
        lambda api: api.get("/v1/ledger?dataset=clicks%00"),
        lambda api: api.get("/v1/datasets/clicks%00/budget"),
    ],
    ids=["charge dataset", "charge partition", "ledger filter", "dataset path"],
)
def test_a_nul_character_is_a_client_error_and_changes_nothing(ready: Api, request_of: Any) -> None:
    """PostgreSQL cannot store or compare NUL in text; SQLite can. Either way it is the
    request's fault: a 4xx problem, never a 500, and nothing written."""
    before = (ready.budget(), ready.ledger())
    response = request_of(ready)
    assert 400 <= response.status_code < 500, response.text
    assert response.content_type == "application/problem+json"
    assert (ready.budget(), ready.ledger()) == before


def test_oversized_body_is_413(ready: Api) -> None:
    huge = json.dumps({**VALID, "input": {"values": [1.0] * 900_000}})
    response = ready.post("/v1/charges", raw=huge)
    assert response.status_code == 413
    assert response.content_type == "application/problem+json"
    assert ready.budget()["loss"]["epsilon"] == 0.1


BAD_DATASETS = {
    "bad name": {"name": "Bad Name", "privacy_unit": "record", "budget": {"epsilon": 1}},
    "name ending in a newline": {
        "name": "nl\n",
        "privacy_unit": "record",
        "budget": {"epsilon": 1},
    },
    "unknown unit": {"name": "d", "privacy_unit": "row", "budget": {"epsilon": 1}},
    "no budget": {"name": "d", "privacy_unit": "record"},
    "zero budget": {"name": "d", "privacy_unit": "record", "budget": {"epsilon": 0}},
    "delta one": {
        "name": "d",
        "privacy_unit": "record",
        "accounting": "approx",
        "budget": {"epsilon": 1, "delta": 1},
    },
    "pure with delta": {
        "name": "d",
        "privacy_unit": "record",
        "accounting": "pure",
        "budget": {"epsilon": 1, "delta": 1e-6},
    },
    "zcdp without delta": {
        "name": "d",
        "privacy_unit": "record",
        "accounting": "zcdp",
        "budget": {"epsilon": 1},
    },
    "bounds on record": {
        "name": "d",
        "privacy_unit": "record",
        "max_partitions_per_user": 3,
        "budget": {"epsilon": 1},
    },
    "bad window": {
        "name": "d",
        "privacy_unit": "record",
        "budget": {"epsilon": 1},
        "windows": [{"period": "2d", "epsilon": 1}],
    },
    "repeated window": {
        "name": "d",
        "privacy_unit": "record",
        "budget": {"epsilon": 1},
        "windows": [{"period": "1d", "epsilon": 1}, {"period": "1d", "epsilon": 2}],
    },
    "k zero": {
        "name": "d",
        "privacy_unit": "user",
        "max_partitions_per_user": 0,
        "budget": {"epsilon": 1},
    },
}


#: A limit stated as rho where the mode does not enforce rho would bind nothing if dropped.
for _mode, _budget in (("pure", {"epsilon": 1}), ("approx", {"epsilon": 1, "delta": 1e-6})):
    BAD_DATASETS.update(
        {
            f"rho partition limit on {_mode}": {
                "name": "d",
                "privacy_unit": "record",
                "accounting": _mode,
                "budget": _budget,
                "partition_budget": {"rho": 0.5},
            },
            f"rho window on {_mode}": {
                "name": "d",
                "privacy_unit": "record",
                "accounting": _mode,
                "budget": _budget,
                "windows": [{"period": "1d", "rho": 0.01}],
            },
            f"rho lifetime on {_mode}": {
                "name": "d",
                "privacy_unit": "record",
                "accounting": _mode,
                "budget": {**_budget, "rho": 2},
            },
        }
    )
BAD_DATASETS["rho partition limit on rdp"] = {
    "name": "d",
    "privacy_unit": "record",
    "accounting": "rdp",
    "rdp_order": 8,
    "budget": {"epsilon": 10, "delta": 1e-6},
    "partition_budget": {"epsilon": 5, "rho": 0.5},
}


def test_a_quota_stated_as_rho_on_an_approx_dataset_is_refused(api: Api) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 1, "delta": 1e-6})
    body = {
        "name": "svc",
        "role": "service",
        "datasets": ["clicks"],
        "quotas": {"clicks": {"rho": 1}},
    }
    response = api.post("/v1/consumers", body)
    assert response.status_code == 400, response.get_json()
    assert "rho is not a limit in approx accounting" in response.get_json()["detail"]
    assert "svc" not in {c["name"] for c in api.get("/v1/consumers").get_json()["consumers"]}


@pytest.mark.parametrize("case", sorted(BAD_DATASETS))
def test_bad_dataset_is_400(api: Api, case: str) -> None:
    response = api.post("/v1/datasets", BAD_DATASETS[case])
    assert response.status_code == 400, response.text
    assert response.content_type == "application/problem+json"
    assert api.get("/v1/datasets").get_json()["datasets"] == []


def test_authentication_and_roles(api: Api, client: FlaskClient) -> None:
    api.make_dataset()
    api.make_dataset("other")
    assert client.get("/v1/datasets").status_code == 401
    assert api.as_key("wrong-key").get("/v1/datasets").status_code == 401
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    auditor = api.as_key(api.make_consumer("aud", role="auditor"))
    assert [d["name"] for d in service.get("/v1/datasets").get_json()["datasets"]] == ["clicks"]
    assert service.get("/v1/datasets/other").status_code == 403
    assert service.charge(dataset="other").status_code == 403
    assert service.charge().status_code == 201
    assert service.get("/v1/ledger").status_code == 403
    assert (
        service.post(
            "/v1/datasets", {"name": "x", "privacy_unit": "record", "budget": {"epsilon": 1}}
        ).status_code
        == 403
    )
    assert auditor.charge().status_code == 403
    assert auditor.get("/v1/ledger").status_code == 200
    assert auditor.get("/v1/consumers").status_code == 200
    assert "api_key" not in json.dumps(auditor.get("/v1/consumers").get_json())
    assert api.as_key(ADMIN_KEY).get("/v1/datasets/other/budget").status_code == 200


def test_revoked_key_is_refused_at_once(api: Api) -> None:
    api.make_dataset()
    key = api.make_consumer("svc", datasets=["clicks"])
    new = api.post("/v1/consumers/svc/keys").get_json()
    assert api.as_key(new["api_key"]).get("/v1/datasets").status_code == 200
    assert api.call("DELETE", f"/v1/keys/{new['id']}").status_code == 204
    assert api.as_key(new["api_key"]).get("/v1/datasets").status_code == 401
    assert api.as_key(key).get("/v1/datasets").status_code == 200


def test_a_zcdp_delta_below_the_resolution_is_refused(api: Api) -> None:
    response = api.post(
        "/v1/datasets",
        {
            "name": "z",
            "privacy_unit": "record",
            "accounting": "zcdp",
            "budget": {"epsilon": 1, "delta": 1e-300},
        },
    )
    assert response.status_code == 400
    assert response.get_json()["errors"][0]["field"] == "budget.delta"


def test_each_schema_is_compiled_once_and_never_confused(ready: Api) -> None:
    from accountant.api import schemas

    compiled = None
    for _ in range(20):
        assert ready.charge(partitions=["p9"], epsilon=0.01).status_code == 201
        bad = ready.charge(partitions=["p9"], params={"epsilon": 0.01, "sigma": 1})
        fields = {e["field"] for e in bad.get_json()["errors"]}
        assert bad.status_code == 400 and "params.sigma" in fields
        # after the first round, no request compiles a schema again (no copy per request),
        # whatever other tests of this process compiled before
        compiled = compiled if compiled is not None else len(schemas._VALIDATORS)
        assert len(schemas._VALIDATORS) == compiled
    cached = [entry[0] for entry in schemas._VALIDATORS.values()]
    assert len(cached) == len({id(s) for s in cached})


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/nothing-here"),
        ("GET", "/v2/datasets"),
        ("DELETE", "/v1/datasets/clicks"),
        ("GET", "/v1//datasets"),
        ("POST", "/v1//charges"),
        ("GET", "/v1/datasets//clicks"),
    ],
)
def test_an_unknown_path_or_method_is_our_own_problem(ready: Api, method: str, path: str) -> None:
    """Not Werkzeug's page text: the detail names what was asked for and where to look."""
    response = ready.call(method, path)
    assert response.status_code in (404, 405)
    assert response.content_type == "application/problem+json"
    detail = response.get_json()["detail"]
    assert path in detail and "/openapi.json" in detail
    assert "requested URL" not in detail and "spelling" not in detail


def test_a_revoked_key_answers_204_with_no_content_type(api: Api) -> None:
    api.make_consumer("svc")
    new = api.post("/v1/consumers/svc/keys").get_json()
    response = api.call("DELETE", f"/v1/keys/{new['id']}")
    assert response.status_code == 204 and response.text == ""
    assert "Content-Type" not in response.headers


@pytest.mark.parametrize("setting", ["admin_key", "metrics_key"])
@pytest.mark.parametrize(
    "key",
    ["s" * 31, "schlüssel-" + "k" * 30, "tab\t" + "k" * 30, "k" * 32 + " ", " " + "k" * 32],
)
def test_a_key_no_client_could_send_is_refused_with_the_settings(setting: str, key: str) -> None:
    """A key shorter than 32 characters, with a character outside printable ASCII (which
    a client sends in its Authorization header as UTF-8 and the server reads as Latin-1, so
    that it never matches), or with a space at either end (trimmed from a header's value),
    stops the start, naming the setting, never the key."""
    with pytest.raises(ConfigError) as refused:
        load_settings({setting: key})
    assert str(refused.value).startswith(f"ACCOUNTANT_{setting.upper()} must be at least 32")
    assert key not in str(refused.value)
    load_settings({setting: "k" * 32})  # printable ASCII is accepted


def test_a_postgresql_url_without_its_driver_says_which_extra_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg fails, as if absent
    with pytest.raises(ConfigError) as refused:
        load_settings({"database_url": "postgresql+psycopg://postgres@127.0.0.1:1/x"})
    assert "needs the psycopg driver, which is not installed" in str(refused.value)
    assert "pip install -e '.[postgres]'" in str(refused.value)


@pytest.mark.parametrize(
    ("method", "path", "words"),
    [
        ("GET", "/v1/charges/not-a-uuid", "no charge with id 'not-a-uuid'"),
        ("GET", "/v1/holds/42", "no hold with id '42'"),
        ("POST", "/v1/holds/abc/settle", "no hold with id 'abc'"),
        ("POST", "/v1/holds/abc/release", "no hold with id 'abc'"),
    ],
)
def test_an_id_that_cannot_be_one_is_an_unknown_charge_or_hold(
    ready: Api, method: str, path: str, words: str
) -> None:
    """Not "nothing is served" at a path the API has: the charge or hold is unknown (found
    in review)."""
    response = ready.call(method, path)
    assert response.status_code == 404
    assert response.content_type == "application/problem+json"
    detail = response.get_json()["detail"]
    assert words in detail and "UUID" in detail, detail
    # a charge has no settle: a path the API does not have, whatever the id
    made = ready.charge().get_json()["charge_id"]
    settle = ready.call("POST", f"/v1/charges/{made}/settle").get_json()["detail"]
    assert "nothing is served at" in settle, settle
