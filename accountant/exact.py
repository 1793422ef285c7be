"""Exact privacy amounts: every epsilon, delta and rho is an integer count of units.

Why integers. Budgets must never be overspent by rounding, and the database
does the arithmetic in SQL on both backends. SQLite has no exact decimal type
(a NUMERIC column stores 0.1 as a binary double and SUM of ten of them is
0.9999999999999999), so a decimal column would give the two backends
different semantics. A BIGINT count of fixed units is exact on SQLite and
PostgreSQL alike, compares with plain integer comparisons, and sums without
error (REFERENCES.md, section 2).

Resolutions. One unit is 10^-9 epsilon, 10^-18 delta and 10^-12 rho. A
realistic charge (epsilon >= 10^-3, delta >= 10^-12, rho >= 10^-7) then loses
at most one part in a million to rounding, and the largest accepted values
(epsilon and rho up to 10^6, delta below 1) stay below 2^63 with room for
sums. Rounding is outward, so it always favours privacy: a cost rounds up
(a positive cost never becomes zero) and a limit rounds down.

Input numbers arrive as ``Decimal`` (the JSON layer never builds a binary
float) or as ``Fraction`` from exact cost formulas; floats are accepted only
from mechanisms, converted exactly, and rounded up like any other cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction
from typing import Literal

ComponentName = Literal["epsilon", "delta", "rho"]
Number = Decimal | Fraction | int | float

#: Totals saturate here so that no integer column can overflow; every limit is
#: far below it (see ``MAX_EPSILON``), so saturation never changes a decision.
SATURATION = 2**62

MAX_EPSILON = Decimal(10) ** 6
MAX_RHO = Decimal(10) ** 6


@dataclass(frozen=True)
class Component:
    """One coordinate of a privacy amount, stored as an integer of ``10**-exponent``."""

    name: ComponentName
    exponent: int

    @property
    def scale(self) -> int:
        scale: int = 10**self.exponent
        return scale

    def cost_units(self, value: Number) -> int:
        """Units of a cost: rounded up, so a positive cost is at least one unit."""
        exact = _exact(value, self.name)
        return min(math.ceil(exact * self.scale), SATURATION)

    def limit_units(self, value: Number) -> int:
        """Units of a limit: rounded down, so a limit is never loosened."""
        exact = _exact(value, self.name)
        return min(math.floor(exact * self.scale), SATURATION)

    def to_decimal(self, units: int) -> Decimal:
        """The exact decimal value of ``units``, normalised (``1E+1`` becomes ``10``)."""
        value = Decimal(units).scaleb(-self.exponent)
        normal = value.normalize()
        # normalize() turns 10 into 1E+1; quantize back to an integer form.
        return normal.quantize(Decimal(1)) if normal == normal.to_integral_value() else normal


EPSILON = Component("epsilon", 9)
DELTA = Component("delta", 18)
RHO = Component("rho", 12)
COMPONENTS: dict[ComponentName, Component] = {c.name: c for c in (EPSILON, DELTA, RHO)}


def sqrt_up(square: Fraction) -> Fraction:
    """A rational at least sqrt(``square``): exact for squares of rationals, otherwise
    within 10^-40 above."""
    root = Fraction(math.isqrt(square.numerator), math.isqrt(square.denominator))
    if root * root == square:
        return root
    with localcontext(prec=60, rounding=ROUND_CEILING):
        decimal_root = (Decimal(square.numerator) / Decimal(square.denominator)).sqrt()
    return Fraction(decimal_root) + Fraction(1, 10**40)


def _exact(value: Number, name: str) -> Fraction:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, not a boolean")
    if isinstance(value, float | Decimal) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    exact = Fraction(value)
    if exact < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return exact


@dataclass(frozen=True)
class Amount:
    """A privacy amount in units: epsilon, delta and rho (zero where unused).

    Amounts add componentwise; ``scaled(m)`` multiplies every component by the
    integer multiplicity of a release (DESIGN.md: m = 1 for a joint release,
    min(k, |P|) for a parallel one).
    """

    epsilon: int = 0
    delta: int = 0
    rho: int = 0

    def __getitem__(self, name: ComponentName) -> int:
        value: int = getattr(self, name)
        return value

    def plus(self, other: Amount) -> Amount:
        return Amount(
            min(self.epsilon + other.epsilon, SATURATION),
            min(self.delta + other.delta, SATURATION),
            min(self.rho + other.rho, SATURATION),
        )

    def minus(self, other: Amount) -> Amount:
        """What is left of this amount once ``other``, a part of it, is taken away (a
        settle gives back part of what its hold added): exact, and never below zero, which
        would mean ``other`` was not part of it."""
        left = Amount(self.epsilon - other.epsilon, self.delta - other.delta, self.rho - other.rho)
        if min(left.epsilon, left.delta, left.rho) < 0:
            raise ValueError(f"{other} is not part of {self}")
        return left

    def scaled(self, m: int) -> Amount:
        return Amount(
            min(self.epsilon * m, SATURATION),
            min(self.delta * m, SATURATION),
            min(self.rho * m, SATURATION),
        )


@dataclass(frozen=True)
class Limit:
    """A limit in units per component; ``None`` means that component is not limited here."""

    epsilon: int | None = None
    delta: int | None = None
    rho: int | None = None

    def __getitem__(self, name: ComponentName) -> int | None:
        value: int | None = getattr(self, name)
        return value

    def bounds(self) -> Amount:
        """The limit's bounds as an amount, 0 in the components it does not limit."""
        return Amount(self.epsilon or 0, self.delta or 0, self.rho or 0)

    def is_exceeded_by(self, loss: Amount, names: tuple[ComponentName, ...]) -> bool:
        """True when ``loss`` is above this limit in any of ``names``."""
        return any((bound := self[name]) is not None and loss[name] > bound for name in names)


def positional(value: Decimal) -> str:
    """A decimal as text in positional notation (0.0000001, never 1E-7), without trailing
    zeros: how amounts read in sentences."""
    return format(value.normalize(), "f")
