"""Randomized response (Warner 1965), binary or k-ary, over a public roster, calibrated so
that its loss under add/remove neighbours is exactly the charged epsilon.

The input is a roster: ``values`` has one entry per member of a population
fixed by public information (enrolled devices, a panel), in a public order,
and ``null`` for a member with no record. The output has the same length, so
its shape reveals nothing that is not public: a member without a record is
answered uniformly at random among the k categories. Never send only the
members that have records: the length of the list would then be the private
count.

The law. A member with a value is answered with the truth with probability
λ and otherwise uniformly among the k categories (the truth included). Adding
or removing a unit turns one entry from a value into ``null`` or back, from
this law to the uniform one: the truth's probability moves by the factor
1 + (k - 1)λ and every other category's by 1 - λ, so the loss is

    max(ln(1 + (k - 1)λ), -ln(1 - λ)),

increasing in λ. It is at most ε exactly when λ <= (e^ε - 1)/(k - 1) and
λ <= 1 - e^-ε, that is when

    λ <= λ* = min(1, e^ε/(k - 1)) (1 - e^-ε),

and equals ε at λ*: the truth is answered with probability e^ε/k when
e^ε <= k - 1, else 1 - (k - 1)e^-ε/k. In the textbook parametrisation (keep
with probability e^ε'/(e^ε' + k - 1)) this is ε' with e^ε' = k e^ε - k + 1
when e^ε >= k - 1, else (k - 1)e^ε/(k - e^ε); binary at ε = 1 is the textbook
mechanism at ε' = ln(2e - 1) = 1.490. The textbook mechanism at ε' = ε has
an add/remove loss of only max(ln(k e^ε/(e^ε + k - 1)), ln((e^ε + k - 1)/k)),
0.620 for binary at ε = 1. A changed value is two add/remove steps and costs
at most 2ε, as add/remove accounting charges it.

Sampling, exactly: λ is the probability that two independent exact coins
agree to keep, Bernoulli(w) and the complement of Bernoulli(exp(-ε)) (the
sampler of Canonne, Kamath and Steinke 2020, Algorithm 1). w is
min(1, e^ε/(k - 1)) rounded down to a multiple of 2^-62 from a lower bound on
e^ε (Taylor terms rounded down), and is 1 whenever e^ε >= k - 1 (always for
binary); ε is rounded down to a multiple of 2^-40 when its exact ratio does
not fit int64. Both roundings only lower λ below λ*, so the loss is at most ε
(``coins`` gives the two parameters; tests/test_mechanisms.py computes the
loss from them). w is at least 1/(k - 1) > 2^-14 (k <= 10,000), so rounding
it gives up less than a relative 2^-47 of the loss.

There is no sensitivity: the cost is ε per member. On a user dataset with
record-level contributions a person fills up to f roster entries, answered
independently, so the accountant composes them (``independent_values``):
f ε, and f ε²/2 in zCDP (Bun and Steinke 2016, Lemma 2.3), rather than group
privacy's f² ε²/2. The zCDP and RDP charges are those of any ε-DP mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import mpmath
import numpy as np

from accountant import hookimpl
from accountant.mechanism import Accuracy, Cost, Mechanism, PrivacyContext
from accountant.randomness import RandomSource
from accountant_plugins import _accuracy, _exact
from accountant_plugins._common import POSITIVE_EPSILON, version

PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"epsilon": POSITIVE_EPSILON},
    "required": ["epsilon"],
    "additionalProperties": False,
}
_LABEL: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 256}
_ABSENT: dict[str, Any] = {"type": "null"}
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "values": {
            "type": "array",
            "minItems": 1,
            "description": "one entry per member of a public roster, null for a member "
            "without a record",
            "items": {"anyOf": [{"type": "boolean"}, _LABEL, _ABSENT]},
        },
        "categories": {
            "type": "array",
            "items": _LABEL,
            "minItems": 2,
            "maxItems": 10_000,
            "uniqueItems": True,
        },
    },
    "required": ["values"],
    "additionalProperties": False,
    "if": {"required": ["categories"]},
    "then": {"properties": {"values": {"items": {"anyOf": [_LABEL, _ABSENT]}}}},
    "else": {"properties": {"values": {"items": {"anyOf": [{"type": "boolean"}, _ABSENT]}}}},
}

#: The weight coin's resolution: a uniform integer below 2^62 fits int64.
_WEIGHT_BITS = 62
#: Guard bits of the fixed-point lower bound on e^ε.
_GUARD_BITS = 20


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    return Cost(epsilon=params["epsilon"])


@dataclass(frozen=True)
class Coins:
    """A member with a value is answered truly when a Bernoulli(``weight``) coin comes up and
    a Bernoulli(exp(-``exponent``)) coin does not, and uniformly otherwise."""

    exponent: Fraction
    weight: Fraction


def _exp_below(x: Fraction, bits: int) -> int:
    """An integer at most e^x 2^bits, for x >= 0: the Taylor series with every term rounded
    down (each term is at most the true one, and all are positive)."""
    term = total = 1 << bits
    n = 1
    while term:
        term = term * x.numerator // (x.denominator * n)
        total += term
        n += 1
    return total


def coins(epsilon: Fraction, k: int) -> Coins:
    """The coins that answer a member with a value of a k-category roster at ``epsilon``:
    exponent <= ε and weight <= min(1, e^exponent/(k - 1)), so λ <= λ* (see above)."""
    if epsilon.denominator < 2**40 and epsilon.numerator < 2**50:
        exponent = epsilon
    else:
        exponent = Fraction(math.floor(epsilon * 2**40), 2**40)
    if exponent >= (k - 1).bit_length():  # e^x >= 2^x > k - 1
        return Coins(exponent, Fraction(1))
    bits = _WEIGHT_BITS + _GUARD_BITS
    units = _exp_below(exponent, bits) // ((k - 1) << _GUARD_BITS)
    return Coins(exponent, Fraction(min(units, 2**_WEIGHT_BITS), 2**_WEIGHT_BITS))


def respond(source: RandomSource, truth: np.ndarray, k: int, epsilon: Fraction) -> np.ndarray:
    """Indices in [0, k): the truth with probability λ + (1 - λ)/k, any other index with
    probability (1 - λ)/k; a truth of -1 (no record) is answered uniformly."""
    law = coins(epsilon, k)
    n = truth.size
    uniform = _exact.uniform_below(source, np.full(n, k, dtype=np.int64))
    randomised = _exact.bernoulli_exp(
        source,
        np.full(n, law.exponent.numerator, dtype=np.int64),
        np.full(n, law.exponent.denominator, dtype=np.int64),
    )
    if law.weight < 1:
        draws = _exact.uniform_below(source, np.full(n, law.weight.denominator, dtype=np.int64))
        randomised |= draws >= law.weight.numerator
    answers: np.ndarray = np.where(randomised | (truth < 0), uniform, truth)
    return answers


@lru_cache(maxsize=4096)
def probability_true(epsilon: Fraction, k: int) -> Fraction:
    """A rational at most the probability that a member with a value is answered truly:
    lambda + (1 - lambda)/k with lambda = weight (1 - exp(-exponent)) of ``coins``."""
    law = coins(epsilon, k)
    with mpmath.workdps(50):
        exponent = mpmath.mpf(law.exponent.numerator) / law.exponent.denominator
        weight = mpmath.mpf(law.weight.numerator) / law.weight.denominator
        keep = weight * -mpmath.expm1(-exponent)
        return _accuracy.down(keep + (1 - keep) / k)


def accuracy(params: Mapping[str, Any], data: Mapping[str, Any] | None) -> Accuracy:
    """The probability that each reported value of a member with a record is the truth,
    for the number of categories the input names (2 without categories); unknown without
    an input."""
    if data is None:
        return Accuracy("randomized_response", "randomized_response", None, None, True)
    k = len(data["categories"]) if "categories" in data else 2
    return Accuracy(
        "randomized_response",
        "randomized_response",
        None,
        None,
        True,
        categories=k,
        probability_true=probability_true(Fraction(params["epsilon"]), k),
    )


def run(params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource) -> dict[str, Any]:
    epsilon = Fraction(params["epsilon"])
    if "categories" not in data:
        truth = np.array([-1 if v is None else int(v) for v in data["values"]], dtype=np.int64)
        return {"values": (respond(source, truth, 2, epsilon) == 1).tolist()}
    categories = list(data["categories"])
    position = {c: i for i, c in enumerate(categories)}
    truth = np.array([-1 if v is None else position[v] for v in data["values"]], dtype=np.int64)
    return {"values": [categories[i] for i in respond(source, truth, len(categories), epsilon)]}


def check(data: Mapping[str, Any]) -> None:
    if "categories" in data:
        unknown = set(data["values"]) - set(data["categories"]) - {None}
        if unknown:
            raise ValueError(f"values not among the categories: {sorted(unknown)[:5]}")


RANDOMIZED_RESPONSE = Mechanism(
    name="randomized_response",
    description="Over a public roster (null for a member without a record): answer each value "
    "truly with probability λ, else uniformly among the k categories, with λ set so that "
    "adding or removing a record loses exactly ε; absent members are answered uniformly "
    "(binary when no categories are given).",
    params_schema=PARAMS_SCHEMA,
    input_schema=INPUT_SCHEMA,
    accounting=("pure", "approx", "zcdp", "rdp"),
    cost=cost,
    run=run,
    has_sensitivity=False,
    check_input=check,
    independent_values=True,
    accuracy=accuracy,
    version=version(3),
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [RANDOMIZED_RESPONSE]
