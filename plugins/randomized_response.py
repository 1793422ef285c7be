"""Randomized response (Warner 1965), binary or k-ary, over a public roster: epsilon-DP per
member under add/remove neighbours.

The input is a roster: ``values`` has one entry per member of a population
fixed by public information (enrolled devices, a panel), in a public order,
and ``null`` for a member with no record. The output has the same length, so
its shape reveals nothing that is not public: a member without a record is
answered uniformly at random among the k categories. Adding or removing a
unit turns one member's entry from a value into ``null`` or back, which
changes its response law from "the truth with probability e^ε/(e^ε + k - 1)"
to uniform: every response's probability moves by a factor between
k/(e^ε + k - 1) >= e^-ε and k e^ε/(e^ε + k - 1) <= e^ε, so the release is
epsilon-DP. Never send only the members that have records: the length of
the list would then be the private count.

Binary: each boolean is kept with probability e^ε / (1 + e^ε) and flipped
otherwise. k-ary (``categories``): each value is kept with probability
e^ε / (e^ε + k - 1), else replaced by one of the k - 1 other categories
uniformly. Both are sampled exactly by rejection with the Bernoulli(exp(-ε))
sampler of Canonne, Kamath and Steinke (2020, Algorithm 1): propose one of
the k categories uniformly; accept the true one always and any other with
probability exp(-ε). The accepted weights are then 1 : e^-ε, i.e. e^ε : 1.
(Binary is the case k = 2.) epsilon is rounded down to a multiple of 2^-40
when its exact ratio does not fit int64, which only adds noise.

There is no sensitivity: the cost is ε per member. On a user dataset with
record-level contributions a person fills up to f roster entries, answered
independently, so the accountant composes them (``independent_values``):
f ε, and f ε²/2 in zCDP (Bun and Steinke 2016, Lemma 2.3), rather than group
privacy's f² ε²/2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from accountant import hookimpl
from accountant.mechanism import Cost, Mechanism, PrivacyContext
from accountant.randomness import RandomSource
from accountant_plugins import _exact
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


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    return Cost(epsilon=params["epsilon"])


def _ratio(epsilon: Fraction) -> tuple[int, int]:
    if epsilon.denominator < 2**40 and epsilon.numerator < 2**50:
        return epsilon.numerator, epsilon.denominator
    return math.floor(epsilon * 2**40), 2**40


def respond(source: RandomSource, truth: np.ndarray, k: int, epsilon: Fraction) -> np.ndarray:
    """Indices in [0, k): the truth kept with probability e^ε/(e^ε + k - 1); a truth of -1
    (no record) is answered uniformly."""
    numerator, denominator = _ratio(epsilon)
    out = np.empty(truth.size, dtype=np.int64)
    pending = np.arange(truth.size)
    while pending.size:
        proposal = _exact.uniform_below(source, np.full(pending.size, k, dtype=np.int64))
        other = _exact.bernoulli_exp(
            source,
            np.full(pending.size, numerator, dtype=np.int64),
            np.full(pending.size, denominator, dtype=np.int64),
        )
        accepted = (proposal == truth[pending]) | other | (truth[pending] < 0)
        out[pending[accepted]] = proposal[accepted]
        pending = pending[~accepted]
    return out


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
    description="Over a public roster (null for a member without a record): keep each value "
    "with probability e^ε/(e^ε + k - 1), else report another category; absent "
    "members are answered uniformly (binary when no categories are given).",
    params_schema=PARAMS_SCHEMA,
    input_schema=INPUT_SCHEMA,
    accounting=("pure", "approx", "zcdp", "rdp"),
    cost=cost,
    run=run,
    has_sensitivity=False,
    check_input=check,
    independent_values=True,
    version=version(2),
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [RANDOMIZED_RESPONSE]
