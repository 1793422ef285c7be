"""Schemas shared by the built-in mechanisms."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

#: The version of the shared samplers (``_exact``, ``_samplers``): part of every built-in
#: mechanism's version, so that a change to them is a new implementation (replays of older
#: charges are then refused, never answered with new noise). tests/test_replay.py pins the
#: outputs of each version.
SAMPLERS_VERSION = 3


def version(mechanism_version: int) -> str:
    """A built-in mechanism's version string: its own number and the samplers'."""
    return f"{mechanism_version}+samplers.{SAMPLERS_VERSION}"


def approx(value: Fraction) -> str:
    """A rational in three significant digits, however large or small (no float overflow)."""
    with localcontext() as context:
        context.prec = 3
        return f"{Decimal(value.numerator) / Decimal(value.denominator):g}"


def coordinates(data: Mapping[str, Any] | None) -> int:
    """How many values an additive release noises (1 in a preview without input)."""
    if not data:
        return 1
    if "size" in data:
        return int(data["size"])
    return len(data["values"])


#: Inputs are bounded so that every value is a finite double.
FINITE_NUMBER: dict[str, Any] = {"type": "number", "minimum": -1e300, "maximum": 1e300}
#: Integer inputs stay far from int64 overflow once noise is added.
BOUNDED_INTEGER: dict[str, Any] = {"type": "integer", "minimum": -(2**52), "maximum": 2**52}
POSITIVE_EPSILON: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000}
DELTA: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}
SENSITIVITY: dict[str, Any] = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": 1e15,
    "description": "add/remove sensitivity at the dataset's privacy unit",
}


def additive_input(item: dict[str, Any]) -> dict[str, Any]:
    """``{"values": [...]}`` to noise, or ``{"size": n}`` for raw noise."""
    return {
        "type": "object",
        "properties": {
            "values": {"type": "array", "items": item, "minItems": 1},
            "size": {"type": "integer", "minimum": 1},
        },
        "oneOf": [{"required": ["values"]}, {"required": ["size"]}],
        "additionalProperties": False,
    }


ADDITIVE_INPUT = additive_input(FINITE_NUMBER)
INTEGER_INPUT = additive_input(BOUNDED_INTEGER)


def epsilon_params(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    properties = {"epsilon": POSITIVE_EPSILON, "sensitivity": SENSITIVITY, **(extra or {})}
    return {
        "type": "object",
        "properties": properties,
        "required": ["epsilon", "sensitivity"],
        "additionalProperties": False,
    }
