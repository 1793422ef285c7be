"""The exponential mechanism: pick candidate i with probability proportional to
exp(epsilon u_i / (2 Δ)), Δ the sensitivity of the utilities (McSherry and Talwar,
FOCS 2007). It is epsilon-DP and, as a bounded-range mechanism, epsilon²/8-zCDP
(Cesar and Rogers, "Bounding, Concentrating, and Truncating", 2021, Lemma 3.2).

Sampling is exact and never touches a float. The exponents gamma_i = epsilon'
(u_max - u_i) / (2 Δ), rounded up and capped as below, are computed in
integers: each utility is an exact ratio p_i / q over a common denominator
(a float is a dyadic rational, a Decimal a decimal one, both given exactly
by ``as_integer_ratio``), and with a / b = epsilon' 2^k / (2 Δ) in lowest
terms, 2^k gamma_i = a (p_max - p_i) / (b q), whose ceiling is one integer
floor division, -(-x // y): the same integers as the rational computation
(numpy's int64 when every intermediate provably fits, Python's integers
otherwise). Candidate i is then drawn with probability exactly
exp(-gamma_i) / sum_j exp(-gamma_j) by a rejection sampler that proposes a
level floor(gamma) by a geometric count of Bernoulli(e^-1) trials, a
candidate uniformly within it, and accepts it with probability
exp(-(gamma_i - floor(gamma_i))), every trial drawn by the exact
Bernoulli(exp(-x)) sampler of Canonne, Kamath and Steinke (2020,
Algorithm 1) on integer comparisons (``_exponential_sampling``, which gives
the argument). This is the exact fix that Ilvento (arXiv 1912.04222) asks
for.

gamma_i is rounded up to a multiple of 2^-k and capped at 2^20. Capping is
the exponential mechanism on the utilities max(u_i, u_max - 2^21 Δ/epsilon'),
which are still Δ-sensitive (a maximum of Δ-sensitive functions), so the
cap costs nothing. Rounding each gamma up by less than 2^-k changes each
probability ratio by less than e^(2^-k) in the numerator and in the
normaliser, so the mechanism is (epsilon' + 2^(1-k))-DP; with epsilon' =
epsilon (1 - 2^-20) and 2^-k <= epsilon' 2^-22, at every epsilon however
small, that is below epsilon. The cost is exactly epsilon.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from accountant import hookimpl
from accountant.accounting.modes import renyi_of_pure
from accountant.mechanism import Accuracy, Cost, Mechanism, PrivacyContext, UnusableParameters
from accountant.randomness import RandomSource
from accountant_plugins import _accuracy
from accountant_plugins._common import FINITE_NUMBER, epsilon_params, version
from accountant_plugins._exponential_sampling import (
    ArrayLevels,
    Bits,
    IntegerLevels,
    Levels,
    select,
)

Ints = npt.NDArray[np.int64]

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"utilities": {"type": "array", "items": FINITE_NUMBER, "minItems": 1}},
    "required": ["utilities"],
    "additionalProperties": False,
}
_CAP = 2**20


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    epsilon = Fraction(params["epsilon"])
    rho = epsilon**2 / 8
    if context.order is None:
        return Cost(epsilon=epsilon, rho=rho)
    # rdp: the smaller of alpha rho (rho-zCDP) and the bound of every epsilon-DP mechanism
    order = Fraction(context.order)
    return Cost(
        epsilon=epsilon,
        rho=rho,
        rdp=min(order * rho, Fraction(renyi_of_pure(epsilon, context.order))),
    )


def _effective(epsilon: Fraction) -> Fraction:
    """epsilon', the epsilon the exponents are computed with (see above)."""
    return epsilon * (1 - Fraction(1, 2**20))


@lru_cache(maxsize=1024)
def _scaling(epsilon: Any, sensitivity: Any) -> tuple[int, int, int]:
    """k, the smallest k >= 0 with 2^-k <= epsilon' 2^-22, and the reduced a / b = epsilon'
    2^k / (2 Δ), so that 2^k gamma_i = a (u_max - u_i) / b (from the parameters as given:
    equal numbers are equal rationals, so they share an entry)."""
    effective = _effective(Fraction(epsilon))
    top, bottom = effective.numerator, effective.denominator << 22
    k = max(0, bottom.bit_length() - top.bit_length())
    while k > 0 and top << (k - 1) >= bottom:
        k -= 1
    while top << k < bottom:
        k += 1
    ratio = effective * (1 << k) / (2 * Fraction(sensitivity))
    return k, ratio.numerator, ratio.denominator


_RATIONAL_KINDS = {int, float, Decimal, Fraction}


def _integers(utilities: Sequence[Any]) -> tuple[Sequence[int], int]:
    """Integers p_i and q >= 1 with u_i = p_i / q exactly (a float, a Decimal, an int and a
    Fraction each know their exact ratio)."""
    kinds = set(map(type, utilities))
    if kinds == {int}:
        return utilities, 1
    if kinds <= _RATIONAL_KINDS:
        ratios = [u.as_integer_ratio() for u in utilities]
    else:
        ratios = [Fraction(u).as_integer_ratio() for u in utilities]
    denominators = {q for _, q in ratios}
    if len(denominators) == 1:
        return [p for p, _ in ratios], denominators.pop()
    common = math.lcm(*denominators)
    return [p * (common // q) for p, q in ratios], common


def _numerators(integers: Sequence[int], a: int, b: int, k: int) -> list[int]:
    """min(2^20 2^k, ceil(a (p_max - p_i) / b)) in Python integers: a gap above ``limit``
    is exactly one whose ceiling reaches the cap."""
    cap = _CAP << k
    best = max(integers)
    limit = (cap - 1) * b // a
    return [-(-a * (best - p) // b) if best - p <= limit else cap for p in integers]


def _numerator_array(values: Ints, a: int, b: int, k: int) -> Ints | None:
    """The same numerators from int64 p_i, or None when an intermediate could leave int64.
    When some gap exceeds ``limit``, the gaps are first clipped at limit + 1, which the cap
    maps to the cap all the same; with gap = q b + r, ceil(a gap / b) = a q + ceil(a r / b),
    whose terms stay below cap + a and a b."""
    cap = _CAP << k
    best, lowest = int(values.max()), int(values.min())
    spread = best - lowest
    limit = (cap - 1) * b // a
    if max(spread, a * b, cap + a) >= 2**62:
        return None
    numerators: Ints = best - values
    if spread > limit:
        numerators = np.minimum(numerators, limit + 1)
    if b == 1:
        numerators *= a
    else:
        whole, rest = np.divmod(numerators, b)
        numerators = whole * a - (-(rest * a) // b)
    if spread > limit:
        numerators = np.minimum(numerators, cap)
    return numerators


def _integer_array(utilities: Sequence[Any]) -> tuple[Ints | None, Sequence[int], int]:
    """``_integers``, and them as an int64 array when they fit. ``array("q")`` takes only
    integers (through ``__index__``: no float, Decimal or Fraction), each exactly or not at
    all."""
    try:
        return np.frombuffer(array("q", utilities), dtype=np.int64), utilities, 1
    except (TypeError, OverflowError):
        pass
    integers, common = _integers(utilities)
    try:
        return np.frombuffer(array("q", integers), dtype=np.int64), integers, common
    except OverflowError:
        return None, integers, common


def exponents(
    epsilon: Fraction, sensitivity: Fraction, utilities: Sequence[Any]
) -> tuple[list[int], int]:
    """Numerators over a common power-of-two denominator 2^k of each gamma_i (rounded up),
    with 2^-k <= epsilon' 2^-22 at every epsilon (exact integers, any size)."""
    k, a, b = _scaling(epsilon, sensitivity)
    integers, common = _integers(utilities)
    return _numerators(integers, a, b * common, k), 1 << k


#: From this many candidates on, the exponents are computed with numpy when they fit int64.
ARRAY_FROM = 48


def levels(params: Mapping[str, Any], utilities: Sequence[Any]) -> Levels:
    """The candidates by level and fraction of their exponents (the same from either path)."""
    k, a, b = _scaling(params["epsilon"], params["sensitivity"])
    if len(utilities) < ARRAY_FROM:
        integers, common = _integers(utilities)
    else:
        values, integers, common = _integer_array(utilities)
        if values is not None:
            numerators = _numerator_array(values, a, b * common, k)
            if numerators is not None:
                return ArrayLevels(numerators, k)
    return IntegerLevels(_numerators(integers, a, b * common, k), k)


def prepare(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> None:
    if data is not None and len(data["utilities"]) > 2**40:
        raise UnusableParameters("input.utilities", "too many candidates")


def accuracy(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> Accuracy:
    """The utility gap: with n candidates, every gamma_i is at least epsilon' (u_max -
    u_i)/(2 Δ) (rounded up; a capped gamma is 2^20, above ln(20 n) for n <= 2^40) and a best
    candidate has gamma 0, so the chosen candidate's gap is c or more with probability at
    most (n - 1) exp(-epsilon' c/(2 Δ)) (McSherry and Talwar 2007; Dwork and Roth 2014,
    Theorem 3.11, with n - 1 for |R|): 5% at c = (2 Δ/epsilon') ln(20 (n - 1)). A bound,
    from the number of candidates alone (never their utilities, which are private)."""
    n = None if data is None else len(data["utilities"])
    return _gap(Fraction(params["epsilon"]), Fraction(params["sensitivity"]), n)


@lru_cache(maxsize=4096)
def _gap(epsilon: Fraction, sensitivity: Fraction, n: int | None) -> Accuracy:
    scale = 2 * sensitivity / _effective(epsilon)
    if n is None:
        return Accuracy("utility_gap", "exponential", scale, None, False)
    gap = Fraction(0) if n == 1 else _accuracy.log_times_up(scale, 20 * (n - 1))
    return Accuracy("utility_gap", "exponential", scale, gap, n == 1, candidates=n)


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    return {"index": select(levels(params, data["utilities"]), Bits(source))}


EXPONENTIAL = Mechanism(
    name="exponential",
    description="Select the index of a candidate by the exponential mechanism, sampled exactly.",
    params_schema=epsilon_params(),
    input_schema=INPUT_SCHEMA,
    accounting=("pure", "approx", "zcdp", "rdp"),
    cost=cost,
    run=run,
    prepare=prepare,
    accuracy=accuracy,
    version=version(3),
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [EXPONENTIAL]
