"""/openapi.json is valid OpenAPI 3.1, lists exactly the registered routes, and states every rule
the service enforces on a request."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from accountant.api.openapi import OPERATIONS, flask_path
from accountant.app import prepared_app
from tests.conftest import Api


def test_the_document_is_valid_openapi(client: FlaskClient) -> None:
    document = client.get("/openapi.json").get_json()
    validate(document)
    assert document["openapi"] == "3.1.0"
    assert all(path.startswith("/") for path in document["paths"])


def test_the_document_matches_the_routes(app: Flask) -> None:
    routes = {
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static" and not rule.rule.startswith("/dashboard")
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}
    }
    documented = {(method, flask_path(path)) for method, path in OPERATIONS}
    assert routes == documented


_CHARGE: dict[str, Any] = {
    "dataset": "clicks",
    "partitions": ["a"],
    "mechanism": "laplace",
    "params": {"epsilon": 0.1, "sensitivity": 1},
    "input": {"values": [1.0]},
}
_PLAN = {**{k: v for k, v in _CHARGE.items() if k != "input"}, "count": 3}
_DATASET = {"name": "new", "privacy_unit": "record", "budget": {"epsilon": 1}}
_ZCDP = {**_DATASET, "accounting": "zcdp", "budget": {"epsilon": 1, "delta": 1e-6}}
_BUDGET_TEXT = '{"name": "new", "privacy_unit": "record", "budget": {"epsilon": %s}}'


@dataclass(frozen=True)
class Rule:
    """A rule the service enforces on a request beyond the JSON Schemas it validates with:
    ``body`` (or ``raw`` text, or ``headers``) breaks it alone; ``words`` is how the document
    states it in a description, or None when the document's schema refuses the body."""

    rule: str
    method: str
    path: str
    body: Any
    raw: str | None = None
    words: str | None = None
    headers: dict[str, str] | None = None


_TWICE = [{"period": "1d", "epsilon": 0.5}, {"period": "1d", "epsilon": 0.4}]
_SERVICE_ONLY = "Only consumers of role service take datasets"
_QUOTA = "Each quota is for one of the consumer's datasets"
RULES = [
    Rule("a charge names a partition twice", "POST", "/v1/charges",
         {**_CHARGE, "partitions": ["a", "a"]}),
    Rule("a preview names a partition twice", "POST", "/v1/charges/preview",
         {**_CHARGE, "partitions": ["a", "a"]}),
    Rule("a charge names more partitions than allowed", "POST", "/v1/charges",
         {**_CHARGE, "partitions": [f"p{i}" for i in range(10_001)]}),
    Rule("a partition key '*' in a list", "POST", "/v1/charges",
         {**_CHARGE, "partitions": ["*"]}, words="never '*'"),
    Rule("a partition key with a control character", "POST", "/v1/charges",
         {**_CHARGE, "partitions": ["a\u0007"]}, words="Printable characters only"),
    Rule("a vector longer than allowed", "POST", "/v1/charges",
         {**_CHARGE, "input": {"values": [1.0] * 100_001}}),
    Rule("an output size larger than allowed", "POST", "/v1/charges",
         {**_CHARGE, "input": {"size": 100_001}}),
    Rule("a sensitivity unit other than record", "POST", "/v1/charges",
         {**_CHARGE, "params": {**_CHARGE["params"], "sensitivity_unit": "user"}}),
    Rule("an idempotency key with a line break", "POST", "/v1/charges",
         {**_CHARGE, "idempotency_key": "a\nb"}, words="Printable characters only"),
    Rule("an idempotency key unlike the header's", "POST", "/v1/charges",
         {**_CHARGE, "idempotency_key": "a"}, headers={"Idempotency-Key": "b"},
         words="the same value"),
    Rule("a plan that names the parameter it solves for", "POST", "/v1/charges/plan",
         _PLAN, words="leave out the mechanism's noise parameter"),
    Rule("a window period twice", "POST", "/v1/datasets",
         {**_DATASET, "windows": _TWICE}, words="Each period at most once"),
    Rule("a contribution bound on a record dataset", "POST", "/v1/datasets",
         {**_DATASET, "max_partitions_per_user": 3}, words="Only with privacy_unit user"),
    Rule("a records bound on a partition dataset", "POST", "/v1/datasets",
         {**_DATASET, "privacy_unit": "partition", "max_records_per_user": 3},
         words="Only with privacy_unit user"),
    Rule("an rdp order on a zcdp dataset", "POST", "/v1/datasets",
         {**_ZCDP, "rdp_order": 4}, words="Only with accounting rdp"),
    Rule("a delta on a pure dataset", "POST", "/v1/datasets",
         {**_DATASET, "accounting": "pure", "budget": {"epsilon": 1, "delta": 1e-6}},
         words="A pure dataset's delta is 0"),
    Rule("a zcdp budget without delta", "POST", "/v1/datasets",
         {**_ZCDP, "budget": {"epsilon": 1}}, words="has a delta of at least 1e-18"),
    Rule("a zcdp window without epsilon", "POST", "/v1/datasets",
         {**_ZCDP, "windows": [{"period": "1d", "delta": 1e-7}]},
         words="On zcdp, rdp and gdp datasets a limit states epsilon"),
    Rule("a delta on a pure dataset's new budget", "PATCH", "/v1/datasets/clicks",
         {"budget": {"epsilon": 2, "delta": 1e-6}}, words="A pure dataset's delta is 0"),
    Rule("a window period twice in a change", "PATCH", "/v1/datasets/clicks",
         {"windows": _TWICE}, words="Each period at most once"),
    Rule("a declared partition twice", "POST", "/v1/datasets/clicks/partitions",
         {"keys": ["a", "a"]}),
    Rule("a declared partition '*'", "POST", "/v1/datasets/clicks/partitions",
         {"keys": ["*"]}, words="never '*'"),
    Rule("a consumer named me", "POST", "/v1/consumers",
         {"name": "me", "role": "auditor"}, words="'me' is reserved"),
    Rule("datasets granted to an auditor", "POST", "/v1/consumers",
         {"name": "aud", "role": "auditor", "datasets": ["clicks"]}, words=_SERVICE_ONLY),
    Rule("datasets granted to an auditor later", "PATCH", "/v1/consumers/reader",
         {"datasets": ["clicks"]}, words=_SERVICE_ONLY),
    Rule("a quota for a dataset not granted", "POST", "/v1/consumers",
         {"name": "svc2", "role": "service", "quotas": {"clicks": {"epsilon": 1}}},
         words=_QUOTA),
    Rule("a quota for a dataset taken away", "PATCH", "/v1/consumers/svc",
         {"datasets": [], "quotas": {"clicks": {"epsilon": 1}}}, words=_QUOTA),
    Rule("a number of more than 100 characters", "POST", "/v1/datasets", _DATASET,
         raw=_BUDGET_TEXT % ("0." + "1" * 99), words="a number of more than 100 characters"),
    Rule("a decimal exponent beyond 400", "POST", "/v1/datasets", _DATASET,
         raw=_BUDGET_TEXT % "1e-401", words="decimal exponent beyond ±400"),
    Rule("an object with a duplicate key", "POST", "/v1/datasets", _DATASET,
         raw='{"name": "x", ' + _BUDGET_TEXT[1:] % "1", words="a duplicate key"),
    Rule("a lone surrogate", "POST", "/v1/datasets", {**_DATASET, "description": "x"},
         raw=_BUDGET_TEXT[:-1] % "1" + ', "description": "\\ud800"}',
         words="lone UTF-16 surrogate"),
]  # fmt: skip


def _descriptions(node: Any) -> str:
    """Every description in ``node``, one per line."""
    if isinstance(node, dict):
        found = [node["description"]] if isinstance(node.get("description"), str) else []
        return "\n".join(found + [_descriptions(value) for value in node.values()])
    if isinstance(node, list):
        return "\n".join(_descriptions(value) for value in node)
    return ""


def test_every_rule_the_service_enforces_is_in_the_document(api: Api) -> None:
    """Each request below breaks one rule the service checks in code: the service refuses
    it with a 400, and /openapi.json states the rule, by a schema that refuses the body or
    in the words of a description, so a client can learn every rule from the document."""
    api.make_dataset()
    api.make_consumer("svc", datasets=["clicks"])
    api.make_consumer("reader", role="auditor")
    paths = api.get("/openapi.json").get_json()["paths"]
    unstated = []
    for case in RULES:
        answer = api.call(case.method, case.path, case.body, raw=case.raw, headers=case.headers)
        assert answer.status_code == 400, (case.rule, answer.get_json())
        assert answer.content_type == "application/problem+json", case.rule
        template = next(p for p in paths if re.fullmatch(re.sub(r"{\w+}", "[^/]+", p), case.path))
        operation = paths[template][case.method.lower()]
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        refused = not Draft202012Validator(schema).is_valid(json.loads(json.dumps(case.body)))
        where = f"{case.rule}: {case.method} {template}"
        if case.words is None and not refused:
            unstated.append(f"{where}: its schema accepts the body")
        if case.words is not None and (refused or case.words not in _descriptions(operation)):
            unstated.append(f"{where}: does not say {case.words!r}")
    assert unstated == []


def test_every_operation_documents_the_requests_refused_whole(client: FlaskClient) -> None:
    """414 and 431 (the HTTP server's limits) on every operation, 413 on every one that reads
    a body, each as problem+json with the limit in its description."""
    paths = client.get("/openapi.json").get_json()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            statuses = {"414": "4094 bytes", "431": "8190 bytes"}
            if "requestBody" in operation:
                statuses["413"] = f"{4 * 1024 * 1024} bytes"
            for status, limit in statuses.items():
                answer = operation["responses"].get(status)
                assert answer is not None, (method, path, status)
                assert set(answer["content"]) == {"application/problem+json"}, (method, path)
                assert limit in answer["description"], (method, path, status)


def test_the_document_states_the_deployments_own_limits(
    database_url: str, signing_key_file: str
) -> None:
    settings = {"max_partitions_per_charge": 7, "max_vector_length": 9, "max_body_bytes": 1000}
    app = prepared_app(
        {"database_url": database_url, "signing_key_file": signing_key_file, **settings}
    )
    charge = app.test_client().get("/openapi.json").get_json()["paths"]["/v1/charges"]["post"]
    body = charge["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert body["partitions"]["anyOf"][0]["maxItems"] == 7
    assert body["input"]["additionalProperties"]["maxItems"] == 9
    assert body["input"]["properties"]["size"]["maximum"] == 9
    assert "larger than 1000 bytes" in charge["responses"]["413"]["description"]


def test_the_default_accounting_and_the_quotas_shape_are_stated(api: Api) -> None:
    """The document states the mode a dataset gets when none is named, and that is the mode
    it gets; the quotas' shape is described, with an example."""
    paths = api.get("/openapi.json").get_json()["paths"]
    create = paths["/v1/datasets"]["post"]["requestBody"]["content"]["application/json"]
    accounting = create["schema"]["properties"]["accounting"]
    assert "approx" in accounting["description"]
    made = api.post(
        "/v1/datasets", {"name": "d", "privacy_unit": "record", "budget": {"epsilon": 1}}
    )
    assert made.get_json()["accounting"] == accounting["default"]
    consumer = paths["/v1/consumers"]["post"]["requestBody"]["content"]["application/json"]
    assert "keyed by dataset name" in consumer["schema"]["properties"]["quotas"]["description"]
