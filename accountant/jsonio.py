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


def loads(text: str | bytes) -> Any:
    try:
        return json.loads(text, parse_float=Decimal, parse_constant=_refuse_constant,
                          object_pairs_hook=_object_without_duplicates)
    except RecursionError:
        raise JSONInputError("the JSON document is nested too deeply") from None
    except json.JSONDecodeError as error:
        raise JSONInputError(f"malformed JSON: {error}") from None
    except UnicodeDecodeError:
        raise JSONInputError("the body is not UTF-8") from None


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
