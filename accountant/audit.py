"""An empirical privacy audit: a statistical lower bound on a mechanism's epsilon.

For neighbouring inputs x and x' (outputs that differ by the declared
sensitivity), the audit draws N outputs of M(x) and of M(x'), and looks for
an event S with P[M(x) in S] > e^epsilon P[M(x') in S] + delta, which no
(epsilon, delta)-DP mechanism allows. As in DP-Sniper (Bichsel et al., S&P
2021) and the threshold tests of StatDP (Ding et al., CCS 2018):

1. each sample is split in halves; on the selection half, threshold events
   {y >= c} and {y <= c} (and {y = v} for outputs with few values) are
   scored in both directions, and the best is kept;
2. on the evaluation half, one-sided Clopper-Pearson bounds at alpha/2 each
   give p_low <= P[M(x) in S] and p_high >= P[M(x') in S], so
   epsilon_lb = ln((p_low - delta) / p_high) is a lower bound on the true
   epsilon with probability at least 1 - alpha.

Selection and certification use different halves, so an honest mechanism is
flagged with probability at most alpha per configuration; the configurations
of one audit share alpha (Bonferroni). The audit fails when epsilon_lb
exceeds the declared epsilon. It runs from the command line and in CI, never
at service start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats

from accountant.mechanism import Mechanism, PrivacyContext
from accountant.randomness import RandomSource

Floats = npt.NDArray[np.float64]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Configuration:
    """One audit case: parameters, two neighbouring inputs, and how to read an output."""

    label: str
    params: Mapping[str, Any]
    accounting: str
    first: Mapping[str, Any]
    second: Mapping[str, Any]
    samples_per_call: int  # how many outputs one run call yields (1 for a selection)


@dataclass(frozen=True)
class Finding:
    label: str
    declared_epsilon: float
    declared_delta: float
    epsilon_lower_bound: float
    event: str
    samples: int

    @property
    def passed(self) -> bool:
        return self.epsilon_lower_bound <= self.declared_epsilon


def configurations(mechanism: Mechanism, samples: int) -> list[Configuration]:
    """The neighbouring inputs to audit ``mechanism`` with, from the shape of its input.

    Additive mechanisms (``values`` of numbers): x = 0 and x' = Δ. Selections
    (``utilities``): the one candidate's utility raised by Δ, the other
    lowered by Δ. Randomized response: a true and a false value, or over a
    roster a member with a value and the same member absent. A plugin may
    audit differently by offering ``audit_configurations(samples)`` on its module.
    """
    properties = dict(mechanism.input_schema).get("properties", {})
    params_properties = dict(mechanism.params_schema).get("properties", {})
    accounting = "approx" if "approx" in mechanism.accounting else mechanism.accounting[0]
    params: dict[str, Any] = {"epsilon": Decimal(1)}
    if "delta" in params_properties:
        params["delta"] = Decimal("1e-5")
    if "sensitivity" in params_properties:
        params["sensitivity"] = Decimal(1)
    if "utilities" in properties:
        return [
            Configuration(
                "utilities [0, 1] vs [1, 0]",
                params,
                accounting,
                {"utilities": [0, 1]},
                {"utilities": [1, 0]},
                1,
            )
        ]
    items = properties.get("values", {}).get("items", {})
    if "boolean" in str(items) and "null" in str(items):
        # a roster: add/remove turns a member's value into null (a changed value is two
        # such steps, so it is not a neighbour)
        return [
            Configuration(
                f"member {value} vs absent",
                params,
                accounting,
                {"values": [value] * samples},
                {"values": [None] * samples},
                samples,
            )
            for value in (True, False)
        ]
    if "boolean" in str(items):
        return [
            Configuration(
                "value true vs false",
                params,
                accounting,
                {"values": [True] * samples},
                {"values": [False] * samples},
                samples,
            )
        ]
    zero: Any = 0 if items.get("type") == "integer" else 0.0
    return [
        Configuration(
            "value 0 vs sensitivity",
            params,
            accounting,
            {"values": [zero] * samples},
            {"values": [zero + 1] * samples},
            samples,
        )
    ]


def _draw(
    mechanism: Mechanism,
    configuration: Configuration,
    data: Mapping[str, Any],
    samples: int,
    source: RandomSource,
) -> Floats:
    if configuration.samples_per_call > 1:
        output = mechanism.runner()(configuration.params, data, source)
        return np.array([float(v) for v in output["values"]], dtype=np.float64)
    return np.array(
        [
            float(mechanism.runner()(configuration.params, data, source)["index"])
            for _ in range(samples)
        ],
        dtype=np.float64,
    )


@dataclass(frozen=True)
class Event:
    """{y == c}, {y >= c} or {y <= c}."""

    relation: str
    threshold: float

    def __str__(self) -> str:
        return f"y {self.relation} {self.threshold:g}"

    def count(self, outputs: Floats) -> int:
        if self.relation == "==":
            return int(np.count_nonzero(outputs == self.threshold))
        if self.relation == ">=":
            return int(np.count_nonzero(outputs >= self.threshold))
        return int(np.count_nonzero(outputs <= self.threshold))


def _events(a: Floats, b: Floats) -> list[Event]:
    pooled = np.concatenate([a, b])
    distinct = np.unique(pooled)
    events = [Event("==", float(v)) for v in distinct] if distinct.size <= 64 else []
    for c in np.unique(np.quantile(pooled, np.linspace(0.001, 0.999, 199))):
        events += [Event(">=", float(c)), Event("<=", float(c))]
    return events


def _lower(k: int, n: int, alpha: float) -> float:
    return 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def _upper(k: int, n: int, alpha: float) -> float:
    return 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def _bound(hits_a: int, hits_b: int, n: int, delta: float, alpha: float) -> float:
    low, high = _lower(hits_a, n, alpha / 2), _upper(hits_b, n, alpha / 2)
    if low - delta <= 0 or high <= 0:
        return -math.inf
    return math.log((low - delta) / high)


def audit(
    mechanism: Mechanism,
    *,
    samples: int = 1_000_000,
    alpha: float = 1e-3,
    source: RandomSource | None = None,
    progress: Progress | None = None,
) -> list[Finding]:
    """Audit ``mechanism``; a finding with ``passed`` false is a privacy violation."""
    source = source or RandomSource()
    say = progress or (lambda message: None)
    cases = configurations(mechanism, samples)
    findings = []
    for number, configuration in enumerate(cases, start=1):
        cost = mechanism.cost(
            configuration.params, PrivacyContext("record", configuration.accounting)
        )
        epsilon, delta = float(cost.epsilon), float(cost.delta)
        n = samples if configuration.samples_per_call > 1 else min(samples, 20_000)
        say(f"[{number}/{len(cases)}] {configuration.label}: drawing {n} outputs per side ...")
        a = _draw(mechanism, configuration, configuration.first, n, source)
        b = _draw(mechanism, configuration, configuration.second, n, source)
        half = n // 2
        say(f"[{number}/{len(cases)}] choosing an event on {half} outputs per side ...")
        best_score, best, swapped = -math.inf, Event("==", math.nan), False
        for event in _events(a[:half], b[:half]):
            hits_a, hits_b = event.count(a[:half]), event.count(b[:half])
            for flip, (x, y) in enumerate(((hits_a, hits_b), (hits_b, hits_a))):
                score = _bound(x, y, half, delta, 0.05)  # conservative: punishes rare events
                if score > best_score:
                    best_score, best, swapped = score, event, bool(flip)
        name = str(best)
        first, second = (b, a) if swapped else (a, b)
        hits_first = best.count(first[half:])
        hits_second = best.count(second[half:])
        lower = _bound(hits_first, hits_second, n - half, delta, alpha / len(cases))
        direction = "x' vs x" if swapped else "x vs x'"
        findings.append(
            Finding(configuration.label, epsilon, delta, lower, f"{name} ({direction})", n)
        )
        say(
            f"[{number}/{len(cases)}] epsilon lower bound {lower:.4f} "
            f"(declared {epsilon:g}) on event {name}"
        )
    return findings
