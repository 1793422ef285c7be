"""JSON without binary floats: numbers parse as ``Decimal``; NaN, Infinity and duplicate keys
are refused. Output turns decimals into the shortest float that reads back the same."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from flask.json.provider import JSONProvider


class JSONInputError(ValueError):
    """The body is not JSON the service accepts."""


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise JSONInputError(
                f"the key {json.dumps(key)} comes twice in one object; send each key once"
            )
        result[key] = value
    return result


#: Longest number text accepted, and the largest decimal exponent: every meaningful amount
#: (epsilon, rho up to 10^6, delta down to 10^-18 units, doubles' 10^-324..10^308) fits well
#: inside, and nothing can grow into a billion-digit integer when it is made exact.
MAX_NUMBER_CHARACTERS = 100
MAX_EXPONENT = 400


class RefusedValue(JSONInputError):
    """A value the service refuses at parsing; ``field`` names where it is."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field or 'the body'}: {message}")
        self.field = field
        self.message = message


class _Refused(str):
    """A number refused while parsing, kept in place so its field can be named."""


class _Constant(_Refused):
    """NaN, Infinity or -Infinity, which JSON does not have and no amount may be."""


def _refused_field(value: Any, bad: Any, path: str = "") -> str | None:
    """The dotted path of the first value in ``value`` for which ``bad`` is true, if any."""
    if bad(value):
        return path
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _refused_field(item, bad, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    if isinstance(value, dict):  # a key may be the culprit too
        for key in value:
            if bad(key):
                return path
    return None


def _lone_surrogate(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return True
    return False


def loads(text: str | bytes) -> Any:
    """Parse a request body. ``RefusedValue`` names NaN or an infinity, a number too large
    to make exact, or a string with a lone surrogate (which no database can store)."""
    refused: list[str] = []
    constants: list[str] = []

    def constant(name: str) -> _Constant:
        constants.append(name)
        return _Constant(name)

    def number(text: str) -> Decimal | _Refused:
        if len(text) > MAX_NUMBER_CHARACTERS:
            refused.append(text)
            return _Refused(text)
        value = Decimal(text)
        if not -MAX_EXPONENT <= value.adjusted() <= MAX_EXPONENT:
            refused.append(text)
            return _Refused(text)
        return value

    def integer(text: str) -> int | _Refused:
        if len(text) > MAX_NUMBER_CHARACTERS:
            refused.append(text)
            return _Refused(text)
        return int(text)

    try:
        value = json.loads(
            text,
            parse_float=number,
            parse_int=integer,
            parse_constant=constant,
            object_pairs_hook=_object_without_duplicates,
        )
    except RecursionError:
        raise JSONInputError("the JSON document is nested too deeply") from None
    except json.JSONDecodeError as error:
        what = error.msg[0].lower() + error.msg[1:].replace("'", '"')
        raise JSONInputError(
            f"the body is not valid JSON: at line {error.lineno}, column {error.colno}, "
            f"{what}; send one JSON document"
        ) from None
    except UnicodeDecodeError:
        raise JSONInputError("the body is not UTF-8") from None
    if constants:  # only then is the whole document walked, to name the field
        raise RefusedValue(
            _refused_field(value, lambda v: isinstance(v, _Constant)) or "",
            f"{constants[0]} is not a number the service accepts; send a finite number",
        )
    if refused:
        raise RefusedValue(
            _refused_field(value, lambda v: isinstance(v, _Refused)) or "",
            f"too many digits or too large an exponent; send at most "
            f"{MAX_NUMBER_CHARACTERS} characters with a decimal exponent "
            f"within ±{MAX_EXPONENT}",
        )
    raw = text if isinstance(text, str) else text.decode("utf-8", "replace")
    if "\\ud" in raw.lower():  # an escaped surrogate: make sure each one is paired
        field = _refused_field(value, _lone_surrogate)
        if field is not None:
            raise RefusedValue(
                field,
                "a string holds a lone UTF-16 surrogate (an unpaired "
                "\\ud800-\\udfff escape); send valid Unicode text",
            )
    return value


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps(value: Any) -> str:
    return json.dumps(
        value, default=_default, ensure_ascii=False, allow_nan=False, separators=(",", ":")
    )


class DecimalJSONProvider(JSONProvider):
    """Flask's JSON provider with the rules above."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        return dumps(obj)

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads(s)
