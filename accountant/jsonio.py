"""JSON without binary floats: numbers parse as ``Decimal``; NaN, Infinity and duplicate keys
are refused. Output turns decimals into the shortest float that reads back the same."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from flask.json.provider import JSONProvider


class JSONInputError(ValueError):
    """The body is not JSON the service accepts."""


def _refuse_constant(name: str) -> Any:
    raise JSONInputError(f"{name} is not a number the service accepts; send a finite number")


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise JSONInputError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


#: Longest number text accepted, and the largest decimal exponent: every meaningful amount
#: (epsilon, rho up to 10^6, delta down to 10^-18 units, doubles' 10^-324..10^308) fits well
#: inside, and nothing can grow into a billion-digit integer when it is made exact.
MAX_NUMBER_CHARACTERS = 100
MAX_EXPONENT = 400


class NumberOutOfRange(ValueError):
    """A number with too many digits or too large an exponent; ``field`` names where it is."""

    def __init__(self, field: str) -> None:
        super().__init__(f"{field or 'a number'}: too many digits or too large an exponent; "
                         f"send at most {MAX_NUMBER_CHARACTERS} characters with a decimal "
                         f"exponent within ±{MAX_EXPONENT}")
        self.field = field


class _Refused(str):
    """A number refused while parsing, kept in place so its field can be named."""


def _decimal(text: str) -> Decimal | _Refused:
    if len(text) > MAX_NUMBER_CHARACTERS:
        return _Refused(text)
    value = Decimal(text)
    if not -MAX_EXPONENT <= value.adjusted() <= MAX_EXPONENT:
        return _Refused(text)
    return value


def _integer(text: str) -> int | _Refused:
    return _Refused(text) if len(text) > MAX_NUMBER_CHARACTERS else int(text)


def _refused_field(value: Any, path: str = "") -> str | None:
    """The dotted path of the first refused number in ``value``, if any."""
    if isinstance(value, _Refused):
        return path
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _refused_field(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def loads(text: str | bytes) -> Any:
    """Parse a request body; ``NumberOutOfRange`` names a number too large to make exact."""
    try:
        value = json.loads(text, parse_float=_decimal, parse_int=_integer,
                           parse_constant=_refuse_constant,
                           object_pairs_hook=_object_without_duplicates)
    except RecursionError:
        raise JSONInputError("the JSON document is nested too deeply") from None
    except json.JSONDecodeError as error:
        raise JSONInputError(f"malformed JSON: {error}") from None
    except UnicodeDecodeError:
        raise JSONInputError("the body is not UTF-8") from None
    field = _refused_field(value)
    if field is not None:
        raise NumberOutOfRange(field)
    return value


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps(value: Any) -> str:
    return json.dumps(value, default=_default, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":"))


class DecimalJSONProvider(JSONProvider):
    """Flask's JSON provider with the rules above."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        return dumps(obj)

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads(s)
