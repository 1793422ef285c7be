"""The quick check never accepts what jsonschema refuses, and accepts the common requests."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from accountant.api import schemas
from accountant.api.quick_accept import compile_check
from accountant.jsonio import loads
from accountant.plugins import MechanismRegistry, make_plugin_manager


def _schemas() -> dict[str, Mapping[str, Any]]:
    found: dict[str, Mapping[str, Any]] = {
        name: value
        for name, value in vars(schemas).items()
        if name.isupper() and isinstance(value, dict)
    }
    for mechanism in MechanismRegistry(*make_plugin_manager()).all():
        found[f"{mechanism.name}.params"] = mechanism.params_schema
        found[f"{mechanism.name}.input"] = mechanism.input_schema
    return found


SCHEMAS = _schemas()


def _words(schema: Any) -> Iterator[str]:
    """Every property name and string constant in ``schema``: what a near miss is made of."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "properties":
                yield from value
            if key in ("enum", "const"):
                yield from (v for v in (value if key == "enum" else [value]) if isinstance(v, str))
            yield from _words(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _words(item)


WORDS = sorted({w for schema in SCHEMAS.values() for w in _words(schema)} | {"extra", ""})
NUMBERS = [
    0,
    1,
    -1,
    2,
    3,
    64,
    1000000,
    1000001,
    10**15,
    2**52,
    2**52 + 1,
    -(2**52) - 1,
    10**300,
    10**301,
    Decimal("0.01"),
    Decimal("3.0"),
    Decimal("-0.5"),
    Decimal("0.999999"),
    Decimal("1E+300"),
    Decimal("1.0E+301"),
    Decimal("1E-400"),
    Decimal("1000000.000001"),
    Decimal("1E+15"),
    Decimal("1.5E+15"),
    0.5,
    3.0,
]
STRINGS = st.one_of(
    st.sampled_from(WORDS),
    st.text(max_size=5),
    st.sampled_from(
        ["a" * 63, "a" * 64, "x" * 128, "x" * 129, "k" * 256, "Bad Name", "-x", "_a", "a\n"]
    ),
)
NUMBER = st.one_of(
    st.sampled_from(NUMBERS), st.integers(), st.decimals(allow_nan=False, allow_infinity=False)
)
scalars = st.one_of(st.none(), st.booleans(), NUMBER, STRINGS)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(WORDS), inner, max_size=6)
    ),
    max_leaves=12,
)


CHARGE = (
    '{"dataset": "sales", "partitions": ["p1", "p2"], "mechanism": "laplace",'
    ' "params": {"epsilon": 0.01, "sensitivity": 1}, "input": {"values": [1.5, 2]},'
    ' "idempotency_key": "k-1", "release": "joint"}'
)
VALID = {
    "CHARGE": CHARGE,
    "PREVIEW": CHARGE,
    "DATASET_CREATE": '{"name": "sales", "privacy_unit": "user", "max_partitions_per_user": 3,'
    ' "accounting": "approx", "budget": {"epsilon": 1, "delta": 1e-6},'
    ' "partition_budget": {"epsilon": 0.5},'
    ' "windows": [{"period": "1d", "epsilon": 0.5}], "description": "d"}',
    "DATASET_PATCH": '{"budget": {"epsilon": 2}, "partition_budget": null, "reason": "r"}',
    "PARTITIONS_DECLARE": '{"keys": ["a", "b"]}',
    "laplace.params": '{"epsilon": 0.01, "sensitivity": 1}',
    "laplace.input": '{"values": [1.5, 2, -3e10]}',
    "discrete_laplace.input": '{"values": [1, 2]}',
}


@st.composite
def near(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with one part replaced, added or removed somewhere inside it."""
    if isinstance(value, dict) and value and draw(st.integers(0, 3)):
        key = draw(st.sampled_from(sorted(value)))
        what = draw(st.sampled_from(["inside", "drop", "add"]))
        if what == "drop":
            return {k: v for k, v in value.items() if k != key}
        if what == "add":
            return {**value, draw(st.sampled_from(WORDS)): draw(values)}
        return {**value, key: draw(near(value[key]))}
    if isinstance(value, list) and value and draw(st.integers(0, 3)):
        index = draw(st.integers(0, len(value) - 1))
        return [*value[:index], draw(near(value[index])), *value[index + 1 :]]
    if isinstance(value, str) and draw(st.booleans()):
        return draw(STRINGS)
    if isinstance(value, int | Decimal) and draw(st.booleans()):
        return draw(NUMBER)
    return draw(values)


@pytest.mark.parametrize("name", sorted(VALID))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_near_misses_of_valid_bodies_are_never_accepted_wrongly(
    name: str, data: st.DataObject
) -> None:
    schema = SCHEMAS[name]
    quick = compile_check(schema)
    assert quick is not None
    base = loads(VALID[name])
    assert quick(base)
    instance = data.draw(near(base))
    if quick(instance):
        errors = [e.message for e in Draft202012Validator(schema).iter_errors(instance)]
        assert errors == [], f"{name}: quick check accepted {instance!r}"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(instance=values)
def test_the_quick_check_accepts_nothing_the_schema_refuses(name: str, instance: Any) -> None:
    schema = SCHEMAS[name]
    quick = compile_check(schema)
    if quick is not None and quick(instance):
        errors = [e.message for e in Draft202012Validator(schema).iter_errors(instance)]
        assert errors == [], f"{name}: quick check accepted {instance!r}"


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        *((SCHEMAS[name], body) for name, body in VALID.items()),
        (schemas.CHARGE, CHARGE.replace('["p1", "p2"]', '"*"')),
        (SCHEMAS["laplace.input"], '{"size": 3}'),
    ],
)
def test_the_common_requests_take_the_quick_path(schema: Mapping[str, Any], body: str) -> None:
    quick = compile_check(schema)
    assert quick is not None and quick(loads(body))


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        (SCHEMAS["laplace.input"], '{"values": [1], "size": 2}'),  # oneOf: both branches match
        (SCHEMAS["laplace.input"], "{}"),  # oneOf: none
        (SCHEMAS["laplace.params"], '{"epsilon": 0, "sensitivity": 1}'),
        (SCHEMAS["laplace.params"], '{"epsilon": 0.01, "sensitivity": 1, "sigma": 1}'),
        (schemas.BOUND, "3.0"),  # stricter than the schema: the full validator decides
        (schemas.CHARGE, CHARGE.replace('"joint"', '"both"')),
    ],
)
def test_what_the_quick_check_does_not_accept_goes_to_the_full_validator(
    schema: Mapping[str, Any], body: str
) -> None:
    quick = compile_check(schema)
    assert quick is not None and not quick(loads(body))


def test_a_schema_with_an_unknown_keyword_gets_no_quick_check() -> None:
    assert compile_check({"type": "array", "uniqueItems": True}) is None
    assert compile_check({"$ref": "#/$defs/x"}) is None
    assert compile_check({"oneOf": [{"type": "integer"}, {"minimum": 3}]}) is None
