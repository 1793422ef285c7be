"""The Poisson-subsampled Gaussian of DP-SGD: an accounting-only mechanism that prices holds.

A training job runs elsewhere: at each of T steps it samples each unit with
probability q (Poisson sampling), clips each unit's contribution to L2 norm C
(``sensitivity``), sums, and adds Gaussian noise of standard deviation
``noise_multiplier`` x C. The accountant never runs it (no ``run``): it
prices a hold for the job (``POST /v1/holds``), and a settle at the steps the
job ran. On a ``user`` dataset the job must sample users, not rows, with
Poisson sampling, and clip each user's whole contribution.

- On ``rdp`` datasets the cost is T times the Renyi divergence of one step at
  the dataset's order (Mironov, Talwar and Zhang 2019, Section 3.3, closed
  form at integer orders), computed in interval arithmetic and rounded up; at
  a fractional order, the value at the next integer order (Renyi divergence
  does not decrease with the order: van Erven and Harremoes 2014, Theorem 3).
  Renyi divergences at one order add under adaptive composition (Mironov
  2017, Proposition 1; as a filter, Feldman and Zrnic 2021), so a job that
  stops early may settle at the steps it ran.
- On ``approx`` datasets the cost is the (epsilon, delta) of the T-fold
  composition at the caller's ``delta``, from Google's dp_accounting
  pessimistic privacy-loss distribution (Koskela, Jalko and Honkela 2020;
  Doroshenko et al. 2022). Composing the T steps tightly is valid because T
  and the noise are fixed before the job starts: such a hold settles at its
  full amount or is released whole, never at fewer steps.

The cost depends on q, the noise multiplier and T only: the noise scales with
the clipping norm the job states. A record-level sensitivity is refused (the
job, not the accountant, adds the noise).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

from accountant import hookimpl
from accountant.mechanism import Cost, Mechanism, PrivacyContext
from accountant_plugins._common import DELTA, SENSITIVITY
from accountant_plugins._sampled_gaussian import approx_epsilon, rdp_cost

#: The most steps one hold may price: a million steps of DP-SGD is already far beyond any
#: training run whose privacy would be worth stating.
MAX_STEPS = 1_000_000

PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sampling_rate": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "description": "q, the probability with which each unit is sampled at each step "
            "(Poisson sampling)",
        },
        "noise_multiplier": {
            "type": "number",
            "minimum": 0.1,
            "maximum": 1000000,
            "description": "the noise's standard deviation relative to the clipping norm",
        },
        "steps": {"type": "integer", "minimum": 1, "maximum": MAX_STEPS},
        "sensitivity": {
            **SENSITIVITY,
            "description": "the clipping norm C (the noise is noise_multiplier x C); the cost "
            "does not depend on it",
        },
        "delta": {**DELTA, "description": "on approx datasets: the delta of the cost"},
    },
    "required": ["sampling_rate", "noise_multiplier", "steps"],
    "additionalProperties": False,
}


def cost(params: Mapping[str, Any], context: PrivacyContext) -> Cost:
    """T steps of the subsampled Gaussian: their Renyi divergence at the dataset's order on
    rdp, their (epsilon, delta) at the stated delta on approx (see the module's notes).
    On rdp, epsilon 0 stands beside the divergence: an rdp dataset reads only ``rdp``."""
    q = Fraction(params["sampling_rate"])
    sigma = Fraction(params["noise_multiplier"])
    steps = int(params["steps"])
    delta = params.get("delta")
    if context.accounting == "rdp":
        if delta is not None:
            raise ValueError("delta applies on approx datasets only; leave it out on rdp")
        if context.order is None:
            raise ValueError("this rdp dataset has no Renyi order")
        return Cost(epsilon=0, rdp=_rdp(q, sigma, steps, Fraction(context.order)))
    if delta is None:
        raise ValueError(
            "on an approx dataset state params.delta, the delta at which the steps are "
            "composed (for example 1e-6)"
        )
    delta = Fraction(delta)
    return Cost(epsilon=_epsilon(q, sigma, steps, delta), delta=delta)


@lru_cache(maxsize=256)
def _rdp(q: Fraction, sigma: Fraction, steps: int, order: Fraction) -> Fraction:
    return rdp_cost(sampling_rate=q, noise_multiplier=sigma, steps=steps, order=order)


@lru_cache(maxsize=64)
def _epsilon(q: Fraction, sigma: Fraction, steps: int, delta: Fraction) -> Fraction:
    """The composition's epsilon, cached: a pessimistic PLD takes about a second."""
    return approx_epsilon(sampling_rate=q, noise_multiplier=sigma, steps=steps, delta=delta)


SUBSAMPLED_GAUSSIAN = Mechanism(
    name="subsampled_gaussian",
    description="DP-SGD's Poisson-subsampled Gaussian, run by a job elsewhere: prices holds "
    "(rdp: Renyi divergence at the dataset's order; approx: a pessimistic PLD at the stated "
    "delta). Accounting-only: it cannot be charged.",
    params_schema=PARAMS_SCHEMA,
    input_schema={"type": "object", "maxProperties": 0},
    accounting=("approx", "rdp"),
    cost=cost,
    version="1",
)


@hookimpl
def accountant_register_mechanisms() -> list[Mechanism]:
    return [SUBSAMPLED_GAUSSIAN]
