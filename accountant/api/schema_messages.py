"""Schema violations in a person's words: each message names the field, says what it
expects and what came, with no Python repr, regular expression or validator phrasing."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from jsonschema.exceptions import ValidationError

_TYPES = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}
_BOUNDS = {
    "minimum": "at least",
    "exclusiveMinimum": "greater than",
    "maximum": "at most",
    "exclusiveMaximum": "less than",
}
#: (validator, word in its message, the size measured, its unit)
_SIZES = {
    "minLength": ("at least", len, "character"),
    "maxLength": ("at most", len, "character"),
    "minItems": ("at least", len, "item"),
    "maxItems": ("at most", len, "item"),
    "minProperties": ("at least", len, "field"),
    "maxProperties": ("at most", len, "field"),
}


def plain(
    error: ValidationError, prefix: str, patterns: Mapping[str, str]
) -> Iterator[tuple[str, str]]:
    """(field, message) for ``error``, its field dotted under ``prefix``. An ``anyOf`` or
    ``oneOf`` over an object or list with one form of its type speaks of that form's own
    violations instead."""
    if error.validator in ("anyOf", "oneOf"):
        inner = _one_form(error)
        if inner:
            for sub in inner:
                yield from plain(sub, prefix, patterns)
            return
    field = _field(error, prefix)
    yield field, _message(error, field or "the body", patterns)


def _field(error: ValidationError, prefix: str) -> str:
    parts = [prefix] * bool(prefix) + [str(part) for part in error.absolute_path]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = [str(f) for f in error.validator_value if f not in instance]
        # one error per missing field, each naming it in the validator's own text
        parts += [next((f for f in missing if error.message.startswith(repr(f))), missing[0])]
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        parts += sorted(set(map(str, instance)) - set(allowed))[:1]
    return ".".join(parts)


def _one_form(error: ValidationError) -> list[ValidationError]:
    instance, forms = error.instance, error.validator_value
    if not isinstance(instance, dict | list) or not isinstance(forms, list):
        return []
    matching = [i for i, form in enumerate(forms) if _kind(form) in (None, _kind_of(instance))]
    if len(matching) != 1:
        return []
    return [e for e in error.context or [] if e.relative_schema_path[0] == matching[0]]


def _kind(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("type"), str):
        return str(schema["type"])
    if "const" in schema:
        return _kind_of(schema["const"])
    return None


def _kind_of(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _message(error: ValidationError, name: str, patterns: Mapping[str, str]) -> str:
    keyword, rule, schema, came = (
        str(error.validator),
        error.validator_value,
        error.schema if isinstance(error.schema, dict) else {},
        _came(error.instance),
    )
    if keyword == "required":
        missing = name.rsplit(".", 1)[-1]
        wanted = _describe(schema.get("properties", {}).get(missing, {}))
        return f"{name} is missing; add it" + (f" ({wanted})" if wanted else "")
    if keyword == "additionalProperties":
        accepted = ", ".join(schema.get("properties", {})) or "none"
        return f"{name} is not a field here; remove it (the fields accepted here: {accepted})"
    if keyword in _BOUNDS:
        return f"{name} must be a number {_BOUNDS[keyword]} {_number(rule)}; got {came}"
    if keyword in _SIZES:
        word, _, unit = _SIZES[keyword]
        among = list(schema.get("properties", {})) if unit == "field" else []
        wanted = f"{rule} of the fields {_or(among)}" if among else _count(rule, unit)
        return f"{name} must have {word} {wanted}; got {came}"
    if keyword == "uniqueItems" and isinstance(error.instance, list):
        items = error.instance
        twice = next((v for i, v in enumerate(items) if v in items[:i]), None)
        return f"{name} must list each item at most once; got {_json(twice)} more than once"
    expected = _expected(keyword, rule, schema, patterns)
    if expected is None:
        return f"{name} is not accepted here (GET /openapi.json says what is); got {came}"
    return f"{name} must be {expected}; got {came}"


def _expected(
    keyword: str, rule: Any, schema: dict[str, Any], patterns: Mapping[str, str]
) -> str | None:
    """What a value must be, in words, for the keywords that say it directly."""
    if keyword == "type":
        return _types(rule)
    if keyword == "enum":
        return "one of " + _or([_json(v) for v in rule])
    if keyword == "const":
        return _json(rule)
    if keyword == "pattern":
        described = patterns.get(rule) or schema.get("description")
        return str(described or "in the form its description in GET /openapi.json states")
    if keyword == "multipleOf":
        return f"a multiple of {_number(rule)}"
    if keyword in ("anyOf", "oneOf"):
        forms = "; ".join(_describe(form) or "another form" for form in rule)
        return ("exactly " if keyword == "oneOf" else "") + f"one of these: {forms}"
    if keyword == "not":
        return "anything but " + (_describe(rule) or "this form")
    return None


def _describe(schema: Any) -> str:
    """A schema in words, as far as a person needs to fix a value."""
    if not isinstance(schema, dict):
        return ""
    words = []
    if "const" in schema:
        words.append(_json(schema["const"]))
    if "enum" in schema:
        words.append("one of " + _or([_json(v) for v in schema["enum"]]))
    if "type" in schema:
        words.append(_types(schema["type"]))
    elif schema.get("required"):
        words.append("an object")
    items = schema.get("items")
    if isinstance(items, dict) and _describe(items):
        words.append(f"whose items are each {_describe(items)}")
    if "minLength" in schema or "maxLength" in schema:
        least, most = schema.get("minLength", 0), schema.get("maxLength")
        words.append(
            f"of {least} to {most} characters" if most else f"of {least} or more characters"
        )
    if schema.get("required"):
        words.append("with " + _and(schema["required"]))
    forbidden = schema.get("not", {}).get("anyOf", [])
    if forbidden:
        words[-1] += ","
        words.append("without " + _or([n for f in forbidden for n in f.get("required", [])]))
    return " ".join(words)


def _types(rule: Any) -> str:
    return _or([_TYPES.get(t, t) for t in ([rule] if isinstance(rule, str) else rule)])


def _came(value: Any) -> str:
    if isinstance(value, str):
        if not value:
            return "an empty string"
        text = json.dumps(value[:40], ensure_ascii=False) + ("..." if len(value) > 40 else "")
        return f"the string {text}" + (f" of {len(value)} characters" if len(value) > 40 else "")
    if isinstance(value, list):
        return f"a list of {_count(len(value), 'item')}" if value else "an empty list"
    if isinstance(value, dict):
        names = sorted(map(str, value))
        return (
            f"an object with the {_count(len(names), 'field')[2:]} {_and(names)}"
            if names
            else ("an empty object")
        )
    return _json(value)


def _json(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float | Decimal):
        return _number(value)
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "s")


def _and(words: list[str]) -> str:
    return _join(words, "and")


def _or(words: list[str]) -> str:
    return _join(words, "or")


def _join(words: list[str], last: str) -> str:
    words = [str(w) for w in words]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"
