"""What a mechanism is: a name, schemas, a pure cost declaration, a preparation and a run.

The accountant always calls ``cost`` and ``prepare`` first, then charges the
budget and calls ``run`` inside the charge's transaction, and commits only
once ``run`` has returned: no charge is ever committed without its output.
``cost`` sees parameters and the privacy context, never data or randomness;
``prepare`` sees parameters and the input and derives (and range-checks)
everything ``run`` needs; ``run`` sees parameters, the input and a random
source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from accountant.randomness import RandomSource

if TYPE_CHECKING:  # dp_accounting takes seconds to import: only where a batch is priced
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

Number = Decimal | Fraction | int | float


@dataclass(frozen=True)
class Cost:
    """The privacy cost of one release, as the mechanism declares it.

    ``epsilon`` and ``delta`` are the (epsilon, delta)-DP guarantee of one
    release at the caller's stated sensitivity; ``rho`` is its zCDP guarantee
    where the mechanism has one (Bun and Steinke 2016). ``rdp`` is its Renyi
    divergence at the order ``PrivacyContext.order`` (rdp datasets), and
    ``mu`` its Gaussian-DP parameter (Dong, Roth and Su 2022; gdp datasets
    accept only mechanisms that declare it). Without ``rdp`` an rdp dataset
    charges alpha * rho, or the epsilon-DP bound for a mechanism with delta 0
    (``accountant.accounting.modes.renyi_of_pure``). Exact types
    (``Decimal``, ``Fraction``, ``int``) are preferred; a float is converted
    exactly and then rounded up like every cost.
    """

    epsilon: Number
    delta: Number = 0
    rho: Number | None = None
    rdp: Number | None = None
    mu: Number | None = None


@dataclass(frozen=True)
class PrivacyContext:
    """What a cost function may know besides the parameters."""

    privacy_unit: str
    accounting: str
    #: The Renyi order of an rdp dataset (fixed at its creation); None in other modes.
    order: Decimal | None = None


#: The probability a stated half-width covers: P(|noise| <= half_width) >= 95%.
CONFIDENCE = Fraction(19, 20)


@dataclass(frozen=True)
class Accuracy:
    """How far one released value may be from the true one, as the mechanism states it.

    It depends on the parameters the mechanism runs with and on the shape of
    the input (how many values, candidates or categories), never on the
    input's values: it is published with the release and must reveal nothing
    more. ``kind`` says what ``half_width`` bounds:

    - ``additive_noise``: each released value is the true one (rounded to
      ``grid``) plus noise of the law ``distribution`` with parameter
      ``scale`` (a Laplace's b, a Gaussian's sigma, in output units), and
      ``half_width`` is the smallest w on the grid with P(|noise| <= w) >=
      ``CONFIDENCE``, per value (not simultaneously for all of them);
    - ``utility_gap``: the selected candidate's utility is within
      ``half_width`` of the best with probability at least ``CONFIDENCE``,
      for ``candidates`` candidates, ``scale`` being the selection's
      temperature (2Δ/ε for the exponential mechanism);
    - ``randomized_response``: each reported value of a member with a record
      is the true one with probability ``probability_true``, among
      ``categories`` categories.

    ``exact`` is true when the figures are those of the distribution actually
    sampled (the smallest such half-width, an exact probability), false when
    they are bounds. ``None`` marks what the input's shape decides when no
    input was sent (a preview or plan without one). docs/mechanisms.md,
    "Accuracy", gives every formula.
    """

    kind: str
    distribution: str
    scale: Number | None
    half_width: Number | None
    exact: bool
    grid: Number | None = None
    candidates: int | None = None
    categories: int | None = None
    probability_true: Number | None = None


class UnusableParameters(ValueError):
    """Parameters or an input a mechanism cannot run with, found before anything is charged.

    ``field`` names the offending request field (``params.epsilon``,
    ``input.values``); the message says what was given and the usable range.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


CostFunction = Callable[[Mapping[str, Any], PrivacyContext], Cost]
RunFunction = Callable[[Mapping[str, Any], Mapping[str, Any], RandomSource], dict[str, Any]]
InputCheck = Callable[[Mapping[str, Any]], None]
PrepareFunction = Callable[[Mapping[str, Any], Mapping[str, Any] | None], None]
AccuracyFunction = Callable[[Mapping[str, Any], Mapping[str, Any] | None], Accuracy | None]
PrivacyLossFunction = Callable[[Mapping[str, Any], int, float], "PrivacyLossDistribution"]

#: The most buckets one ``privacy_loss`` call may build: a distribution that would need more
#: at the interval asked is refused with ``PrivacyLossTooWide`` before it is built, which
#: bounds the time one build takes (about a second for dp_accounting's Gaussian).
MAX_PRIVACY_LOSS_BUCKETS = 2**18


class PrivacyLossTooWide(ValueError):
    """A privacy-loss distribution that would need more than ``MAX_PRIVACY_LOSS_BUCKETS``
    buckets at the discretisation interval asked: too little noise to compose tightly at it.
    The pricer tries a coarser interval or refuses the group."""


@dataclass(frozen=True)
class Mechanism:
    """A mechanism as a plugin returns it from ``accountant_register_mechanisms``.

    ``params_schema`` and ``input_schema`` are JSON Schemas (draft 2020-12) of
    the ``params`` and ``input`` objects. ``accounting`` lists the modes the
    mechanism supports. ``has_sensitivity`` tells the core whether the caller
    states a sensitivity (record-level sensitivity is then scaled by the core)
    or whether the cost itself must be scaled. A mechanism without a sensitivity
    is scaled by group privacy (epsilon * f, rho * f^2), unless it declares
    ``independent_values``: each value of the input is randomised independently
    of the others, so f values of one person compose (epsilon * f, rho * f).
    ``check_input``, if given, refuses an input its schema cannot describe by
    raising ``ValueError``; it runs before anything is charged.

    ``prepare(params, input)``, if given, derives everything ``run`` needs
    (noise scales, grids, integer ranges) from the parameters the accountant
    will run with (record-level sensitivities already scaled) and raises
    ``UnusableParameters`` (or ``ValueError``) for a request ``run`` could
    not carry out: the caller gets a 400 and nothing is charged. ``input`` is
    None in a preview that sends none: check the parameters alone. A ``run``
    that fails after a successful ``prepare`` is a bug of the plugin: the
    charge is rolled back and the failure logged as such.

    ``version`` names the implementation: a retried request is answered by
    running the mechanism again with the charge's random source, so the same
    version must give the same output for the same parameters, input and
    random words. Change it whenever that could change; replays of charges
    made by another version are refused rather than answered with new noise.
    Without a version, the version of the plugin's distribution stands in.

    ``accuracy(params, input)``, if given, states how far each released value
    may be from the true one (``Accuracy``), for the parameters the
    accountant runs with, after ``prepare`` accepted them; ``input`` is None
    in a preview or plan that sends none. Every grant, preview and plan
    carries it; a mechanism without it is answered with ``"accuracy": null``
    (not stated) rather than a guess.

    A mechanism without ``run`` is **accounting-only**: it prices releases
    computed elsewhere (a training job, a pipeline that adds its own noise) and
    can price a hold (``POST /v1/holds``), never a charge, a preview or a plan.
    Such a job adds its noise for the sensitivity it states, so a record-level
    sensitivity, which the accountant would scale for a run of its own, is
    refused for it.

    ``privacy_loss(params, d, interval)``, if given, is used only on ``approx``
    datasets, to price a batch's group of joint releases by composing their
    privacy-loss distributions (``accountant.accounting.plan_pricing``). It gets
    the parameters the accountant runs with (record-level sensitivities already
    scaled; Decimal values), the number d of values the release noises and a
    ``value_discretization_interval``, and returns a dp_accounting
    ``PrivacyLossDistribution``, pessimistic, on that interval, that
    **dominates** one release of what ``run`` actually samples: for every pair
    of neighbouring inputs (add/remove, both directions, as dp_accounting
    represents them) and every real epsilon, its hockey-stick divergence
    H_{e^epsilon} is at least the release's (a dominating pair, Zhu, Dathathri
    and Gopi 2022). A grid or integer sampler is not the continuous mechanism
    its parameters name; the distribution must cover the sampler, with the
    float inputs to dp_accounting rounded against privacy. One whose buckets
    at that interval would exceed ``MAX_PRIVACY_LOSS_BUCKETS`` raises
    ``PrivacyLossTooWide`` before building it; parameters ``run`` could not
    carry out raise ``ValueError``. Without it, a grouped item is priced by the
    generic pair of its (epsilon, delta) cost, which dominates every
    (epsilon, delta)-DP mechanism. docs/accounting.md, "Batches: tight
    composition of a fixed plan", gives each built-in's argument.
    """

    name: str
    description: str
    params_schema: Mapping[str, Any]
    input_schema: Mapping[str, Any]
    accounting: tuple[str, ...]
    cost: CostFunction
    run: RunFunction | None = None
    has_sensitivity: bool = True
    check_input: InputCheck | None = None
    prepare: PrepareFunction | None = None
    independent_values: bool = False
    version: str = ""
    accuracy: AccuracyFunction | None = None
    privacy_loss: PrivacyLossFunction | None = None
    plugin: str = field(default="", compare=False)
    #: "plugin/name/version", set by the registry: what a replay must find again.
    implementation: str = field(default="", compare=False)

    @property
    def runs(self) -> bool:
        """Whether the accountant can run it (an accounting-only mechanism has no ``run``)."""
        return self.run is not None

    def runner(self) -> RunFunction:
        """Its ``run``; only mechanisms that run are ever charged, so this is never called
        on an accounting-only one."""
        if self.run is None:
            raise TypeError(f"mechanism {self.name!r} is accounting-only and cannot run")
        return self.run
