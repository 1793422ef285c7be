"""Schemas shared by the built-in additive mechanisms."""

from __future__ import annotations

from typing import Any

#: Inputs are bounded so that every value is a finite double.
FINITE_NUMBER: dict[str, Any] = {"type": "number", "minimum": -1e300, "maximum": 1e300}
POSITIVE_EPSILON: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000}
SENSITIVITY: dict[str, Any] = {
    "type": "number", "exclusiveMinimum": 0, "maximum": 1e15,
    "description": "add/remove sensitivity at the dataset's privacy unit",
}

ADDITIVE_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "values": {"type": "array", "items": FINITE_NUMBER, "minItems": 1},
        "size": {"type": "integer", "minimum": 1},
    },
    "oneOf": [{"required": ["values"]}, {"required": ["size"]}],
    "additionalProperties": False,
}
