"""What a mechanism is: a name, schemas, a pure cost declaration and a run function.

The accountant always calls ``cost`` first, charges the budget, and only then
calls ``run``. ``cost`` sees parameters and the privacy context, never data
or randomness; ``run`` sees parameters, the input and a random source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from accountant.randomness import RandomSource

Number = Decimal | Fraction | int | float


@dataclass(frozen=True)
class Cost:
    """The privacy cost of one release, as the mechanism declares it.

    ``epsilon`` and ``delta`` are the (epsilon, delta)-DP guarantee of one
    release at the caller's stated sensitivity; ``rho`` is its zCDP guarantee
    where the mechanism has one (Bun and Steinke 2016). Exact types
    (``Decimal``, ``Fraction``, ``int``) are preferred; a float is converted
    exactly and then rounded up like every cost.
    """

    epsilon: Number
    delta: Number = 0
    rho: Number | None = None


@dataclass(frozen=True)
class PrivacyContext:
    """What a cost function may know besides the parameters."""

    privacy_unit: str
    accounting: str


CostFunction = Callable[[Mapping[str, Any], PrivacyContext], Cost]
RunFunction = Callable[[Mapping[str, Any], Mapping[str, Any], RandomSource], dict[str, Any]]
InputCheck = Callable[[Mapping[str, Any]], None]


@dataclass(frozen=True)
class Mechanism:
    """A mechanism as a plugin returns it from ``accountant_register_mechanisms``.

    ``params_schema`` and ``input_schema`` are JSON Schemas (draft 2020-12) of
    the ``params`` and ``input`` objects. ``accounting`` lists the modes the
    mechanism supports. ``has_sensitivity`` tells the core whether the caller
    states a sensitivity (record-level sensitivity is then scaled by the core)
    or whether the cost itself must be scaled for group privacy. ``check_input``,
    if given, refuses an input its schema cannot describe by raising ``ValueError``; it
    runs before anything is charged.
    """

    name: str
    description: str
    params_schema: Mapping[str, Any]
    input_schema: Mapping[str, Any]
    accounting: tuple[str, ...]
    cost: CostFunction
    run: RunFunction
    has_sensitivity: bool = True
    check_input: InputCheck | None = None
    plugin: str = field(default="", compare=False)
