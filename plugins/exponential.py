"""The exponential mechanism: pick candidate i with probability proportional to
exp(epsilon u_i / (2 Δ)), Δ the sensitivity of the utilities (McSherry and Talwar,
FOCS 2007). It is epsilon-DP and, as a bounded-range mechanism, epsilon²/8-zCDP
(Cesar and Rogers, "Bounding, Concentrating, and Truncating", 2021, Lemma 3.2).

Sampling is exact and never touches a float: with gamma_i = epsilon' (u_max -
u_i) / (2 Δ) computed in rationals, a candidate is proposed uniformly and
accepted with probability exp(-gamma_i) by the Bernoulli(exp(-gamma)) sampler
of Canonne, Kamath and Steinke (2020, Algorithm 1), whole batches at once;
the first accepted proposal is the answer. This is the exact fix that
Ilvento (arXiv 1912.04222) asks for.

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
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from accountant import hookimpl
from accountant.accounting.modes import renyi_of_pure
from accountant.mechanism import Accuracy, Cost, Mechanism, PrivacyContext, UnusableParameters
from accountant.randomness import RandomSource
from accountant_plugins import _accuracy, _exact
from accountant_plugins._common import FINITE_NUMBER, epsilon_params, version

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


def exponents(
    epsilon: Fraction, sensitivity: Fraction, utilities: list[Fraction]
) -> tuple[list[int], int]:
    """Numerators over a common power-of-two denominator 2^k of each gamma_i (rounded up),
    with 2^-k <= epsilon' 2^-22 at every epsilon (exact integers, any size)."""
    effective = _effective(epsilon)
    k = 0
    while Fraction(1, 2**k) > effective / 2**22:
        k += 1
    denominator = 2**k
    best = max(utilities)
    numerators = [
        min(_CAP * denominator, math.ceil(effective * (best - u) / (2 * sensitivity) * denominator))
        for u in utilities
    ]
    return numerators, denominator


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
    utilities = [Fraction(u) for u in data["utilities"]]
    numerators, denominator = exponents(
        Fraction(params["epsilon"]), Fraction(params["sensitivity"]), utilities
    )
    n = len(utilities)
    if max(numerators) < 2**62 // 2 and denominator < 2**40:
        exact = np.array(numerators, dtype=np.int64)
        batch = max(256, n)
        while True:
            proposals = _exact.uniform_below(source, np.full(batch, n, dtype=np.int64))
            accepted = _exact.bernoulli_exp(
                source, exact[proposals], np.full(batch, denominator, dtype=np.int64)
            )
            if accepted.any():
                return {"index": int(proposals[np.argmax(accepted)])}
    # Exponents beyond int64 (epsilon below about 10^-6): the same rejection loop, one
    # proposal at a time in Python integers.
    words = _exact.Words(source)
    while True:
        proposal = words.below(n)
        if words.bernoulli_exp(numerators[proposal], denominator):
            return {"index": proposal}


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
    version=version(2),
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [EXPONENTIAL]
