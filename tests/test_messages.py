"""Every rule of every request schema, broken in turn: the 400 names the field, what it
expects and what came, in plain words (no Python repr, regular expression or validator
phrasing)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from accountant.api import schemas
from accountant.plugins import MechanismRegistry
from tests.conftest import Api

_DROP = object()
#: Keywords broken only from a valid value at their place.
_NEED_A_VALUE = {"minItems", "maxItems", "uniqueItems", "required", "minProperties", "items"}
_NEED_A_VALUE |= {"additionalProperties"}
#: What a schema may say that no value can break.
_ANNOTATIONS = {"description", "default", "$comment"}
#: Phrasing that must never reach a person: the validator's sentences, Python reprs, regexes.
_RAW = re.compile(
    r"is not of type|is not one of|does not match|is a required property|should be non-empty"
    r"|is too (long|short)|non-unique|(less|greater) than or equal to the|is not valid under"
    r"|valid under each of|enough properties|too many properties|Additional properties"
    r"|were unexpected|should not be valid|is not a multiple of|Decimal\(|\bTrue\b|\bFalse\b"
    r"|\bNone\b|'|\^|\$|\\[dws]|\{\d+,\d*\}|\[a-z"
)
_AMOUNT = {"epsilon": 1, "delta": 1e-7, "rho": 1}
_CHARGE = {
    "dataset": "clicks",
    "partitions": ["p1"],
    "release": "joint",
    "mechanism": "laplace",
    "params": {"epsilon": 0.1, "sensitivity": 1},
    "input": {"values": [1.0]},
    "idempotency_key": "k-1",
}
_LIMITS = {
    "budget": _AMOUNT,
    "partition_budget": _AMOUNT,
    "windows": [{"period": "1d", **_AMOUNT}],
}
#: (method, path, schema, a body valid under it with every field it knows)
OPERATIONS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    (
        "POST",
        "/v1/datasets",
        schemas.DATASET_CREATE,
        {
            "name": "other",
            "privacy_unit": "user",
            "max_partitions_per_user": 2,
            "max_records_per_user": 3,
            "accounting": "approx",
            "rdp_order": 2,
            "composition": "basic",
            "composition_delta": 1e-7,
            **_LIMITS,
            "description": "about it",
        },
    ),
    ("PATCH", "/v1/datasets/clicks", schemas.DATASET_PATCH, {**_LIMITS, "reason": "why"}),
    ("POST", "/v1/datasets/clicks/partitions", schemas.PARTITIONS_DECLARE, {"keys": ["a"]}),
    (
        "POST",
        "/v1/consumers",
        schemas.CONSUMER_CREATE,
        {"name": "svc2", "role": "service", "datasets": ["clicks"], "quotas": {"clicks": _AMOUNT}},
    ),
    (
        "PATCH",
        "/v1/consumers/svc",
        schemas.CONSUMER_PATCH,
        {"datasets": ["clicks"], "quotas": {"clicks": _AMOUNT}, "reason": "why"},
    ),
    ("POST", "/v1/consumers/svc/keys", schemas.KEY_CREATE, {}),
    ("POST", "/v1/charges", schemas.CHARGE, _CHARGE),
    ("POST", "/v1/charges/preview", schemas.PREVIEW, _CHARGE),
    ("POST", "/v1/charges/plan", schemas.PLAN, {**_CHARGE, "count": 3}),
    ("POST", "/v1/charges/batch", schemas.BATCH, {"items": [_CHARGE], "delta": 1e-6}),
]
#: A valid charge of each built-in mechanism, whose own schemas are walked as well.
MECHANISMS = {
    "laplace": ({"epsilon": 0.1, "sensitivity": 1}, {"values": [1.0]}),
    "discrete_laplace": ({"epsilon": 0.1, "sensitivity": 1}, {"values": [1]}),
    "gaussian": ({"epsilon": 0.1, "delta": 1e-7, "sensitivity": 1}, {"values": [1.0]}),
    "discrete_gaussian": ({"sigma": 2, "sensitivity": 1}, {"size": 2}),
    "exponential": ({"epsilon": 0.1, "sensitivity": 1}, {"utilities": [1.0, 2.0]}),
    "randomized_response": (
        {"epsilon": 0.1},
        {"values": ["a", None], "categories": ["a", "b"]},
    ),
}


def _other_type(types: str | list[str]) -> Any:
    allowed = {types} if isinstance(types, str) else set(types)
    kinds = [("string", "text"), ("number", 1.5), ("boolean", True), ("null", None)]
    kinds += [("array", []), ("object", {})]
    return next(value for kind, value in kinds if kind not in allowed)


def _breaks(
    schema: Any, valid: Any, where: tuple[Any, ...]
) -> Iterator[tuple[str, tuple[Any, ...], Any]]:
    """(keyword, where, value) for each value at ``where`` that breaks one keyword of
    ``schema``, given a ``valid`` value there (``_DROP`` when none is known)."""
    if not isinstance(schema, dict):
        return
    present = valid is not _DROP
    for keyword, rule in schema.items():
        if keyword in _ANNOTATIONS or keyword in ("if", "then", "else", "not"):
            continue  # the conditional forms are broken through the branches they guard
        if keyword == "type":
            yield keyword, where, _other_type(rule)
        elif keyword in ("enum", "const"):
            yield keyword, where, "no-such-value"
        elif keyword == "pattern":
            yield keyword, where, "Not A Name!"
        elif keyword in ("exclusiveMinimum", "exclusiveMaximum"):
            yield keyword, where, rule
        elif keyword in ("minimum", "maximum"):  # one past it, or far past it in a float
            step = -1 if keyword == "minimum" else 1
            yield keyword, where, rule + step if abs(rule) < 1e15 else rule * 10
        elif keyword == "minLength":
            yield keyword, where, "k" * (rule - 1)
        elif keyword == "maxLength":
            yield keyword, where, "k" * (rule + 1)
        elif keyword == "minItems" and present:
            yield keyword, where, valid[: rule - 1]
        elif keyword == "maxItems" and present:
            yield keyword, where, (valid * (rule + 1))[: rule + 1]
        elif keyword == "uniqueItems" and present:
            yield keyword, where, [valid[0], valid[0]]
        elif keyword == "required" and present:
            yield from ((keyword, (*where, name), _DROP) for name in rule)
        elif keyword == "minProperties" and present:
            kept = [name for name in schema.get("required", []) if name in valid][: rule - 1]
            yield keyword, where, {name: valid[name] for name in kept}
        elif keyword == "additionalProperties" and rule is False:
            yield keyword, (*where, "no_such_field"), 1
        elif keyword == "additionalProperties" and present:
            for name, item in valid.items():
                yield from _breaks(rule, item, (*where, name))
        elif keyword == "properties":
            for name, sub in rule.items():
                yield from _breaks(
                    sub, valid.get(name, _DROP) if present else _DROP, (*where, name)
                )
        elif keyword == "items" and present and valid:
            yield from _breaks(rule, valid[0], (*where, 0))
        elif keyword in ("anyOf", "oneOf"):
            yield keyword, where, _matching_no_form(rule)
            for form in rule:
                if present and Draft202012Validator(form).is_valid(valid):
                    yield from _breaks(form, valid, where)
        elif keyword not in _NEED_A_VALUE:
            raise AssertionError(f"no breaking value for the keyword {keyword}")


def _matching_no_form(forms: list[Any]) -> Any:
    values: list[Any] = ["no-such-value", 1.5, True, [], {}]
    return next(v for v in values if not any(Draft202012Validator(f).is_valid(v) for f in forms))


def _set(body: Any, where: tuple[Any, ...], value: Any) -> Any:
    body = copy.deepcopy(body)
    if not where:
        return value
    target = body
    for step in where[:-1]:
        target = target[step]
    if value is _DROP:
        del target[where[-1]]
    else:
        target[where[-1]] = value
    return body


def _check(
    api: Api, method: str, path: str, body: Any, keyword: str, where: tuple[Any, ...]
) -> None:
    field = ".".join(map(str, where))
    field = re.sub(r"^items\.(\d+)", r"items[\1]", field)  # a batch's items: API.md's form
    response = api.call(method, path, raw=json.dumps(body))
    case = f"{method} {path}, {keyword} at {field or 'the body'}: {response.text}"
    assert response.status_code == 400, case
    problem = response.get_json()
    for error in problem["errors"]:
        assert not _RAW.search(error["message"]), case
        named = error["field"] or "the body"
        assert error["message"].startswith(named + " "), case
        assert (
            " got " in error["message"]
            or " is missing; add it" in error["message"]
            or (" is not a field here; remove it" in error["message"])
        ), case
    assert not _RAW.search(problem["detail"]), case
    fields = [error["field"] for error in problem["errors"]]
    assert any(f == field or field.startswith(f + ".") or f.startswith(field) for f in fields), case


@pytest.fixture
def setup(api: Api) -> Api:
    api.make_dataset(accounting="approx", budget={"epsilon": 5, "delta": 1e-5})
    api.make_consumer("svc", datasets=["clicks"])
    return api


@pytest.mark.parametrize(
    ("method", "path", "schema", "valid"),
    OPERATIONS,
    ids=[f"{method} {path}" for method, path, _, _ in OPERATIONS],
)
def test_every_schema_rule_speaks_plainly(
    setup: Api, method: str, path: str, schema: dict[str, Any], valid: dict[str, Any]
) -> None:
    assert Draft202012Validator(schema).is_valid(json.loads(json.dumps(valid)))
    cases = list(_breaks(schema, valid, ()))
    assert cases
    for keyword, where, value in cases:
        _check(setup, method, path, _set(valid, where, value), keyword, where)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_every_mechanism_schema_rule_speaks_plainly(setup: Api, app: Any, mechanism: str) -> None:
    registry: MechanismRegistry = app.extensions["accountant"].registry
    found = registry.get(mechanism)
    assert found is not None
    params, data = MECHANISMS[mechanism]
    valid = {**_CHARGE, "mechanism": mechanism, "params": params, "input": data}
    walked = [("params", found.params_schema, params), ("input", found.input_schema, data)]
    for part, schema, value in walked:
        assert Draft202012Validator(schema).is_valid(json.loads(json.dumps(value)))
        for keyword, where, broken in _breaks(schema, value, (part,)):
            body = _set(valid, where, broken)
            _check(setup, "POST", "/v1/charges/preview", body, keyword, where)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ('{"dataset": "clicks",', "line 1, column"),
        ('{"dataset": "clicks", "dataset": "other"}', 'the key "dataset" comes twice'),
    ],
    ids=["malformed", "duplicate key"],
)
def test_a_body_that_is_not_json_is_told_so_plainly(setup: Api, raw: str, words: str) -> None:
    problem = setup.post("/v1/charges", raw=raw).get_json()
    assert words in problem["detail"] and "(char" not in problem["detail"]
    assert not re.search(r"'[^']*'", problem["detail"]), problem["detail"]
