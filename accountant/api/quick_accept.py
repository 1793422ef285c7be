"""A compiled yes-check for the common case: a request body that is valid.

``jsonschema`` walks a schema with a new validator object per subschema and
collects every error with its path, about a third of a millisecond for a
charge's three schemas. Most requests are valid, and for them all that work
finds nothing. ``compile_check`` turns a schema into nested closures that
answer only "certainly valid": when one returns True, ``jsonschema`` would
find no error; when it returns False, the caller validates with
``jsonschema`` as before, which decides and reports. So this check may be
stricter than the schema, never laxer, and error messages have one source.

It knows a subset of draft 2020-12 (the keywords below); a schema using any
other keyword gets no check (``None``) and always takes the full path. It is
stricter in two places, on purpose: "integer" accepts only ``int`` (not 3.0),
and "number" only ``int``, ``float`` and ``Decimal``. ``oneOf`` and ``not``
need an exact answer from their branches, so they are supported only over
branches that are exact (no numeric keyword below them). Instances are JSON
values as ``accountant.jsonio`` parses them.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Mapping, Sized
from decimal import Decimal
from typing import Any

Check = Callable[[Any], bool]

#: Keywords that never change validity.
_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_EXACT_TYPES: dict[str, Check] = {
    "string": lambda x: isinstance(x, str),
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
}
#: Narrower than jsonschema's (see the module's notes), so never exact.
_NUMERIC_TYPES: dict[str, Check] = {
    "integer": lambda x: type(x) is int,
    "number": lambda x: type(x) in (int, float, Decimal),
}


class _Unsupported(Exception):
    pass


def compile_check(schema: Any) -> Check | None:
    """A function that returns True only for instances ``schema`` accepts, or None when the
    schema uses a keyword this module does not know."""
    try:
        return _compile(schema)[0]
    except _Unsupported:
        return None


def _compile(schema: Any) -> tuple[Check, bool]:
    """(check, exact): ``exact`` when the check's False also means the schema refuses."""
    if schema is True or schema == {}:
        return (lambda _: True), True
    if schema is False:
        return (lambda _: False), True
    if not isinstance(schema, Mapping):
        raise _Unsupported
    checks: list[Check] = []
    exact = True
    for keyword, value in schema.items():
        if keyword in _ANNOTATIONS or keyword == "additionalProperties":
            continue  # additionalProperties is compiled with properties
        compiler = _KEYWORDS.get(keyword)
        if compiler is None:
            raise _Unsupported
        check, keyword_exact = compiler(value, schema)
        checks.append(check)
        exact = exact and keyword_exact
    if "additionalProperties" in schema and "properties" not in schema:
        check, keyword_exact = _properties({}, schema)
        checks.append(check)
        exact = exact and keyword_exact
    return _all(checks), exact


def _all(checks: list[Check]) -> Check:
    if len(checks) == 1:
        return checks[0]
    every = tuple(checks)

    def check(x: Any) -> bool:
        for one in every:  # noqa: SIM110 (all() over a generator is slower here)
            if not one(x):
                return False
        return True

    return check


def _type(value: Any, _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    names = [value] if isinstance(value, str) else list(value)
    known = {**_EXACT_TYPES, **_NUMERIC_TYPES}
    if any(name not in known for name in names):
        raise _Unsupported
    checks = [known[name] for name in names]
    exact = not any(name in _NUMERIC_TYPES for name in names)
    if len(checks) == 1:
        return checks[0], exact
    return (lambda x: any(check(x) for check in checks)), exact


def _properties(value: Mapping[str, Any], schema: Mapping[str, Any]) -> tuple[Check, bool]:
    compiled = {name: _compile(sub) for name, sub in value.items()}
    checks = {name: check for name, (check, _) in compiled.items()}
    exact = all(e for _, e in compiled.values())
    extra = schema.get("additionalProperties", True)
    extra_check, extra_exact = _compile(extra)
    exact = exact and extra_exact

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        for name, item in x.items():
            sub = checks.get(name, extra_check)
            if not sub(item):
                return False
        return True

    return check, exact


def _required(value: list[str], _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    names = tuple(value)
    return (lambda x: not isinstance(x, dict) or all(n in x for n in names)), True


def _items(value: Any, _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    item, exact = _compile(value)

    def check(x: Any) -> bool:
        if isinstance(x, list):
            for one in x:
                if not item(one):
                    return False
        return True

    return check, exact


def _enum(value: list[Any], _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    if not value or any(type(v) is not str for v in value):
        raise _Unsupported  # jsonschema's equality differs from Python's for 1, 1.0, True
    allowed = frozenset(value)
    return (lambda x: isinstance(x, str) and x in allowed), True


def _const(value: Any, schema: Mapping[str, Any]) -> tuple[Check, bool]:
    return _enum([value], schema)


def _any_of(value: list[Any], _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    compiled = [_compile(sub) for sub in value]
    checks = [check for check, _ in compiled]
    return (lambda x: any(check(x) for check in checks)), all(e for _, e in compiled)


def _all_of(value: list[Any], _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    compiled = [_compile(sub) for sub in value]
    return _all([check for check, _ in compiled]), all(e for _, e in compiled)


def _one_of(value: list[Any], _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    compiled = [_compile(sub) for sub in value]
    if not all(e for _, e in compiled):
        raise _Unsupported  # a branch's False must mean it does not match
    checks = [check for check, _ in compiled]
    return (lambda x: sum(1 for check in checks if check(x)) == 1), True


def _not(value: Any, _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    check, exact = _compile(value)
    if not exact:
        raise _Unsupported
    return (lambda x: not check(x)), True


Compiler = Callable[[Any, Mapping[str, Any]], tuple[Check, bool]]


def _length(kind: type[Sized], compare: Callable[[int, int], bool]) -> Compiler:
    def compiler(value: int, _schema: Mapping[str, Any]) -> tuple[Check, bool]:
        return (lambda x: not isinstance(x, kind) or compare(len(x), value)), True

    return compiler


def _bound(compare: Callable[[Any, Any], bool]) -> Compiler:
    def compiler(value: Any, _schema: Mapping[str, Any]) -> tuple[Check, bool]:
        if type(value) not in (int, float):
            raise _Unsupported

        def check(x: Any) -> bool:
            if type(x) in (int, float, Decimal):
                return compare(x, value)
            # Not a number to jsonschema (no bound applies), or one it knows and we do not.
            return isinstance(x, bool) or not isinstance(x, numbers.Number)

        return check, False

    return compiler


def _pattern(value: str, _schema: Mapping[str, Any]) -> tuple[Check, bool]:
    search = re.compile(value).search
    return (lambda x: not isinstance(x, str) or search(x) is not None), True


_KEYWORDS: dict[str, Compiler] = {
    "type": _type,
    "properties": _properties,
    "required": _required,
    "items": _items,
    "enum": _enum,
    "const": _const,
    "anyOf": _any_of,
    "allOf": _all_of,
    "oneOf": _one_of,
    "not": _not,
    "minLength": _length(str, lambda n, v: n >= v),
    "maxLength": _length(str, lambda n, v: n <= v),
    "minItems": _length(list, lambda n, v: n >= v),
    "maxItems": _length(list, lambda n, v: n <= v),
    "minProperties": _length(dict, lambda n, v: n >= v),
    "maxProperties": _length(dict, lambda n, v: n <= v),
    "minimum": _bound(lambda x, v: x >= v),
    "maximum": _bound(lambda x, v: x <= v),
    "exclusiveMinimum": _bound(lambda x, v: x > v),
    "exclusiveMaximum": _bound(lambda x, v: x < v),
    "pattern": _pattern,
}
