"""Populations against an independent reference: random workloads on two or three member
datasets in every mode, the closing figure of the populations issue (a population of
(1, 1e-6) admits what one such dataset admits), and sixteen concurrent clients on one
population that never take it above its limit.

The reference below is written from DESIGN.md ("Accounting semantics", "Populations")
with exact integers of the service's units (accountant.exact: 10^-9 epsilon, 10^-18 delta,
10^-12 rho; costs rounded up, limits rounded down), and the mathematics of each mode
(the Gaussian's rho, the epsilon-DP bound on the Renyi divergence, mu-GDP) computed here
with fractions and mpmath, never with the service's accounting modules. The enforced
limits of the converting modes (rho*, B(alpha), mu*^2 of an (epsilon, delta) budget) are
read from the service, after checking them against figures computed here, because the
service fixes them with a floating-point search over alpha whose exact result a second
search cannot be required to reproduce to the unit.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import cache
from typing import Any

import mpmath
import pytest
import requests

from accountant.exact import DELTA, EPSILON, RHO
from tests.conftest import ADMIN_KEY, Api

#: The units of each field an amount reports, in its mode's measure.
SCALE = {
    "epsilon": EPSILON.scale,
    "delta": DELTA.scale,
    "rho": RHO.scale,
    "rdp": RHO.scale,
    "mu2": RHO.scale,
}
#: The fields that add up in each mode: the ones a population sums and limits.
FIELDS = {
    "pure": ("epsilon", "delta"),
    "approx": ("epsilon", "delta"),
    "zcdp": ("rho",),
    "rdp": ("rdp",),
    "gdp": ("mu2",),
}
PARTITIONS = ["p1", "p2", "p3"]
RDP_ORDER = "16"
GDP_MARGIN = 1 + Fraction(1, 2**20)  # the gaussian's charged mu over D/sigma (docs)
_names = itertools.count()

Units = dict[str, int]


def exact(reply: Any) -> Any:
    """A reply's JSON with every number exact (the service writes exact decimals)."""
    return json.loads(reply.text, parse_float=Decimal)


def units_of(amount: dict[str, Any], name: str) -> int:
    """An amount's field in units; the service reports whole units, exactly."""
    assert name in amount, (name, amount)
    value = Fraction(amount[name]) * SCALE[name]
    assert value.denominator == 1, (name, amount)
    return int(value)


def number(value: float) -> Fraction:
    """A parameter as the service parses it: the decimal text JSON carries, exactly."""
    return Fraction(Decimal(repr(value)))


def up(value: Fraction | mpmath.mpf, name: str) -> int:
    """A cost in units, rounded up."""
    if isinstance(value, Fraction):
        return math.ceil(value * SCALE[name])
    with mpmath.workdps(80):  # the product at the value's own precision
        return int(mpmath.ceil(value * SCALE[name]))


def down(value: Fraction, name: str) -> int:
    """A limit in units, rounded down."""
    return math.floor(value * SCALE[name])


# --- the mathematics of each mode, computed here ---------------------------------------


@cache
def renyi_of_pure(epsilon: Fraction, order: Fraction) -> mpmath.mpf:
    """The Renyi divergence at ``order`` that an epsilon-DP mechanism is charged: that of
    binary randomized response, (1/(a-1)) ln[(sinh(a e) - sinh((a-1) e)) / sinh(e)] (Bun
    and Steinke 2016, Proposition 3.3), and never above epsilon; at 80 digits."""
    with mpmath.workdps(80):
        e = mpmath.mpf(epsilon.numerator) / epsilon.denominator
        a = mpmath.mpf(order.numerator) / order.denominator
        value = mpmath.log((mpmath.sinh(a * e) - mpmath.sinh((a - 1) * e)) / mpmath.sinh(e))
        return min(value / (a - 1), e)


def b_of(epsilon: mpmath.mpf, delta: mpmath.mpf, alpha: mpmath.mpf) -> mpmath.mpf:
    """B(alpha) of DESIGN.md: the largest Renyi divergence at alpha that is (epsilon,
    delta)-DP (Canonne, Kamath and Steinke 2020, Proposition 12)."""
    return (
        epsilon
        + mpmath.log(alpha / (alpha - 1))
        - (mpmath.log(1 / delta) - mpmath.log(alpha)) / (alpha - 1)
    )


@cache
def rho_star(epsilon: str, delta: str) -> mpmath.mpf:
    """max over alpha > 1 of B(alpha)/alpha, by a scan then golden sections on ln(alpha-1)."""
    with mpmath.workdps(40):
        e, d = mpmath.mpf(epsilon), mpmath.mpf(delta)

        def value(x: mpmath.mpf) -> mpmath.mpf:
            alpha = 1 + mpmath.exp(x)
            return b_of(e, d, alpha) / alpha

        best = max((mpmath.mpf(i) / 4 for i in range(-40, 120)), key=value)
        low, high = best - mpmath.mpf(1) / 4, best + mpmath.mpf(1) / 4
        ratio = (mpmath.sqrt(5) - 1) / 2
        for _ in range(200):
            a, b = high - ratio * (high - low), low + ratio * (high - low)
            if value(a) >= value(b):
                high = b
            else:
                low = a
        return value((low + high) / 2)


def gdp_delta(epsilon: mpmath.mpf, mu: mpmath.mpf) -> mpmath.mpf:
    """delta(epsilon) of mu-GDP (Dong, Roth and Su 2022, Corollary 2.13)."""
    return mpmath.ncdf(-epsilon / mu + mu / 2) - mpmath.exp(epsilon) * mpmath.ncdf(
        -epsilon / mu - mu / 2
    )


@cache
def mu_star_squared(epsilon: str, delta: str) -> mpmath.mpf:
    """mu*^2, mu* the root of delta(epsilon) = delta, by bisection at 40 digits."""
    with mpmath.workdps(40):
        e, d = mpmath.mpf(epsilon), mpmath.mpf(delta)
        low, high = mpmath.mpf(0), mpmath.mpf(1)
        while gdp_delta(e, high) <= d:
            low, high = high, 2 * high
        for _ in range(160):
            middle = (low + high) / 2
            low, high = (middle, high) if gdp_delta(e, middle) <= d else (low, middle)
        return low**2


def reference_limit(mode: str, budget: dict[str, float]) -> Units | None:
    """The enforced limit of a budget in units, where it is exact arithmetic (pure, approx);
    None where the service's search fixes it (checked by ``check_converted_limit``)."""
    if mode == "pure":
        return {"epsilon": down(number(budget["epsilon"]), "epsilon"), "delta": 0}
    if mode == "approx":
        return {
            "epsilon": down(number(budget["epsilon"]), "epsilon"),
            "delta": down(number(budget["delta"]), "delta"),
        }
    return None


def check_converted_limit(mode: str, budget: dict[str, float], enforced: int) -> None:
    """The service's enforced limit of a converting mode against this file's figure: never
    above it, and below it only by the few units its rounding and search may take."""
    epsilon, delta = repr(budget["epsilon"]), repr(budget["delta"])
    if mode == "zcdp":
        with mpmath.workdps(40):
            mine = int(mpmath.floor(rho_star(epsilon, delta) * RHO.scale))
        assert mine - 5 <= enforced <= mine, (mode, budget, enforced, mine)
    elif mode == "rdp":
        with mpmath.workdps(60):
            bound = b_of(mpmath.mpf(epsilon), mpmath.mpf(delta), mpmath.mpf(RDP_ORDER))
            mine = max(0, int(mpmath.floor(bound * RHO.scale)))
        assert mine - 1 <= enforced <= mine, (mode, budget, enforced, mine)
    else:
        with mpmath.workdps(40):
            mine = int(mpmath.floor(mu_star_squared(epsilon, delta) * RHO.scale))
        assert mine - 3 <= enforced <= mine, (mode, budget, enforced, mine)


def reference_cost(mode: str, mechanism: str, params: dict[str, float]) -> Units:
    """The per-release cost c of one release in the mode's measure, in units, rounded up
    (DESIGN.md, "Accounting semantics")."""
    p = {name: number(value) for name, value in params.items()}
    if mode in ("pure", "approx"):
        return {
            "epsilon": up(p["epsilon"], "epsilon"),
            "delta": up(p.get("delta", Fraction(0)), "delta"),
        }
    if mechanism == "laplace":
        if mode == "zcdp":
            return {"rho": up(p["epsilon"] ** 2 / 2, "rho")}
        assert mode == "rdp"
        # (the releases below keep this bound under epsilon: where it is epsilon itself,
        # the service adds its 10^-40 guard and charges one unit more, which is sound)
        return {"rdp": up(renyi_of_pure(p["epsilon"], Fraction(RDP_ORDER)), "rdp")}
    assert mechanism == "gaussian"
    rho = p["rho"] if "rho" in p else p["sensitivity"] ** 2 / (2 * p["sigma"] ** 2)
    if mode == "zcdp":
        return {"rho": up(rho, "rho")}
    if mode == "rdp":
        return {"rdp": up(Fraction(RDP_ORDER) * rho, "rdp")}
    # gdp: mu = (D / sigma) times the sampler's margin, and mu^2 adds
    return {"mu2": up((p["sensitivity"] / p["sigma"] * GDP_MARGIN) ** 2, "mu2")}


# --- the loss of a user dataset ----------------------------------------------------------

Release = tuple[int, list[str], str]  # (c in units of one field, partitions, joint|parallel)


def _multiplicity(release: str, n: int, k: int | None) -> int:
    return 1 if release == "joint" else (n if k is None else min(k, n))


def _total(charges: list[Release], k: int | None) -> int:
    """T: the sum of c * m."""
    return sum(c * _multiplicity(release, len(ps), k) for c, ps, release in charges)


def _top(charges: list[Release], k: int) -> int:
    """min(T, the sum of the k largest s(p)), s(p) the sum of c over charges touching p."""
    spends: Counter[str] = Counter()
    for c, ps, _ in charges:
        for p in ps:
            spends[p] += c
    return min(_total(charges, k), sum(sorted(spends.values(), reverse=True)[:k]))


def user_loss(charges: list[Release], k: int | None) -> int:
    """L of a user-unit scope in one field: T with unbounded k (T is then at most the sum of
    every s(p)), else the smaller of min(T, top-k s) over every charge and the same figure
    over the joint releases plus over the parallel ones (both sound: DESIGN.md allows
    further sound terms, and the service adds this one)."""
    if k is None:
        return _total(charges, None)
    joint = [c for c in charges if c[2] == "joint"]
    parallel = [c for c in charges if c[2] != "joint"]
    return min(_top(charges, k), _top(joint, k) + _top(parallel, k))


@dataclass
class Books:
    """One member dataset's granted releases, its k and its limit."""

    k: int | None
    limit: Units
    granted: list[tuple[Units, list[str], str]] = field(default_factory=list)

    def loss(
        self, fields: tuple[str, ...], extra: tuple[Units, list[str], str] | None = None
    ) -> Units:
        charges = [*self.granted, *([extra] if extra else [])]
        return {
            name: user_loss([(cost[name], ps, release) for cost, ps, release in charges], self.k)
            for name in fields
        }


def within(loss: Units, limit: Units) -> bool:
    return all(loss[name] <= limit[name] for name in limit)


# --- workloads ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeWorkload:
    """What the random workloads of one mode draw from."""

    population_budgets: list[dict[str, float]]
    dataset_budgets: list[dict[str, float]]
    releases: list[tuple[str, dict[str, float]]]


WORKLOADS: dict[str, ModeWorkload] = {
    "pure": ModeWorkload(
        population_budgets=[{"epsilon": 1}, {"epsilon": 0.9999999999}, {"epsilon": 1.5}],
        dataset_budgets=[{"epsilon": e} for e in (0.3, 0.5, 0.7, 0.9999999999, 1, 1.5, 3)],
        releases=[
            ("laplace", {"epsilon": e, "sensitivity": 1})
            for e in (0.05, 0.1, 0.1, 0.15, 0.2, 0.25, 0.3, 0.1234567891, 0.0000000015)
        ],
    ),
    "approx": ModeWorkload(
        population_budgets=[{"epsilon": 2, "delta": 1e-6}, {"epsilon": 1.5, "delta": 5e-7}],
        dataset_budgets=[
            {"epsilon": e, "delta": d} for e in (0.8, 1.5, 2, 4) for d in (3e-7, 1e-6, 2e-6)
        ],
        releases=[
            ("laplace", {"epsilon": 0.1, "sensitivity": 1}),
            ("laplace", {"epsilon": 0.3, "sensitivity": 2}),
            ("laplace", {"epsilon": 0.2000000001, "sensitivity": 1}),
            ("gaussian", {"epsilon": 0.2, "delta": 1e-7, "sensitivity": 1}),
            ("gaussian", {"epsilon": 0.5, "delta": 2e-7, "sensitivity": 1}),
            ("gaussian", {"epsilon": 0.3, "delta": 1.5e-7, "sensitivity": 3}),
            ("gaussian", {"epsilon": 0.1, "delta": 3.3333333333e-8, "sensitivity": 1}),
        ],
    ),
    "zcdp": ModeWorkload(
        population_budgets=[{"epsilon": 1, "delta": 1e-6}, {"epsilon": 2, "delta": 1e-6}],
        dataset_budgets=[{"epsilon": e, "delta": 1e-6} for e in (0.5, 0.8, 1, 2, 4)],
        releases=[
            ("laplace", {"epsilon": 0.1, "sensitivity": 1}),
            ("laplace", {"epsilon": 0.07, "sensitivity": 1}),
            ("gaussian", {"sigma": 10, "sensitivity": 1}),
            ("gaussian", {"sigma": 7, "sensitivity": 1}),
            ("gaussian", {"sigma": 30, "sensitivity": 3}),
            ("gaussian", {"sigma": 12.5, "sensitivity": 0.5}),
            ("gaussian", {"rho": 0.003, "sensitivity": 1}),
        ],
    ),
    "rdp": ModeWorkload(
        population_budgets=[{"epsilon": 1.5, "delta": 1e-6}, {"epsilon": 2, "delta": 1e-6}],
        dataset_budgets=[{"epsilon": e, "delta": 1e-6} for e in (1, 1.5, 2, 3, 6)],
        releases=[
            ("laplace", {"epsilon": 0.1, "sensitivity": 1}),
            ("laplace", {"epsilon": 0.25, "sensitivity": 1}),
            ("gaussian", {"sigma": 10, "sensitivity": 1}),
            ("gaussian", {"sigma": 7, "sensitivity": 1}),
            ("gaussian", {"sigma": 15, "sensitivity": 2}),
            ("gaussian", {"rho": 0.004, "sensitivity": 1}),
        ],
    ),
    "gdp": ModeWorkload(
        population_budgets=[{"epsilon": 1, "delta": 1e-6}, {"epsilon": 2, "delta": 1e-6}],
        dataset_budgets=[{"epsilon": e, "delta": 1e-6} for e in (0.5, 0.8, 1, 2, 4)],
        releases=[
            ("gaussian", {"sigma": s, "sensitivity": d})
            for s, d in ((10, 1), (7, 1), (5, 1), (20, 1), (12.5, 0.5), (30, 3))
        ],
    ),
}


def _pick_release(rng: random.Random) -> tuple[list[str], str]:
    """Partitions and a release kind: a joint release on one or two partitions, or now and
    then a parallel one on two or three."""
    if rng.random() < 0.7:
        return rng.sample(PARTITIONS, rng.choice([1, 1, 2])), "joint"
    return rng.sample(PARTITIONS, rng.choice([2, 3])), "parallel"


def _limit_in_units(mode: str, budget: dict[str, float], reported: dict[str, Any]) -> Units:
    """The enforced limit, computed here (pure, approx) or checked and read (the others)."""
    fields = FIELDS[mode]
    limit = reference_limit(mode, budget)
    if limit is None:
        (name,) = fields
        limit = {name: units_of(reported, name)}
        check_converted_limit(mode, budget, limit[name])
    assert {name: units_of(reported, name) for name in fields} == limit, (budget, reported)
    return limit


def _created_limit(
    api: Api, mode: str, budget: dict[str, float], created: dict[str, Any], path: str
) -> Units:
    """The enforced limit of a dataset or population just created: computed here (pure,
    approx), or read exactly from the 201's budget (zcdp's rho, rdp's divergence) or, as
    gdp's 201 shows mu rounded, from its budget report's mu2; checked either way. (The
    budget reports read at the end check the limits of pure and approx.)"""
    if mode in ("pure", "approx"):
        limit = reference_limit(mode, budget)
        assert limit is not None
        return limit
    if mode == "gdp":
        return _limit_in_units(mode, budget, exact(api.get(path))["limit"])
    return _limit_in_units(mode, budget, created["budget"])


def _mode_fields(mode: str) -> dict[str, Any]:
    return {"rdp_order": float(RDP_ORDER)} if mode == "rdp" else {}


def make_population(api: Api, name: str, mode: str, budget: dict[str, float]) -> dict[str, Any]:
    reply = api.post(
        "/v1/populations",
        {
            "name": name,
            "privacy_unit": "user",
            "accounting": mode,
            "budget": budget,
            **_mode_fields(mode),
        },
    )
    assert reply.status_code == 201, reply.get_json()
    made = exact(reply)
    assert made["name"] == name and made["privacy_unit"] == "user", made
    assert made["accounting"] == mode and made["datasets"] == [], made
    return dict(made)


def run_workload(api: Api, mode: str, rng: random.Random, outcomes: Counter[str]) -> None:
    """One random workload on one population, checked charge by charge."""
    spec = WORKLOADS[mode]
    fields = FIELDS[mode]
    population = f"pop{next(_names)}"
    population_budget = rng.choice(spec.population_budgets)
    made = make_population(api, population, mode, population_budget)
    population_limit = _created_limit(
        api, mode, population_budget, made, f"/v1/populations/{population}/budget"
    )
    members: dict[str, Books] = {}
    for index in range(rng.choice([2, 3])):
        name = f"{population}-d{index}"
        budget = rng.choice(spec.dataset_budgets)
        k = rng.choice([None, 1, 2])
        reply = api.post(
            "/v1/datasets",
            {
                "name": name,
                "privacy_unit": "user",
                "accounting": mode,
                "budget": budget,
                "max_partitions_per_user": k,
                "population": population,
                **_mode_fields(mode),
            },
        )
        assert reply.status_code == 201, reply.get_json()
        limit = _created_limit(api, mode, budget, exact(reply), f"/v1/datasets/{name}/budget")
        members[name] = Books(k, limit)
    history: list[str] = []
    for _ in range(rng.randint(6, 12)):
        dataset = rng.choice(sorted(members))
        mechanism, params = rng.choice(spec.releases)
        partitions, release = _pick_release(rng)
        cost = reference_cost(mode, mechanism, params)
        books = members[dataset]
        before = books.loss(fields)
        after = books.loss(fields, (cost, partitions, release))
        population_before = {n: sum(b.loss(fields)[n] for b in members.values()) for n in fields}
        population_after = {n: population_before[n] - before[n] + after[n] for n in fields}
        if not within(after, books.limit):
            expected = "dataset"
            if not within(population_after, population_limit):
                outcomes["dataset and population"] += 1  # the dataset is named first
        elif not within(population_after, population_limit):
            expected = "population"
        else:
            expected = "granted"
        history.append(f"{dataset} {mechanism} {params} {release} {partitions} -> {expected}")
        reply = api.charge(
            dataset=dataset,
            partitions=partitions,
            release=release,
            mechanism=mechanism,
            params=params,
            input={"values": [1.0] * len(partitions)},
        )
        body = exact(reply)
        context = ("\n".join(history), body)
        if expected == "granted":
            assert reply.status_code == 201, context
            assert {n: units_of(body["cost"], n) for n in fields} == cost, context
            books.granted.append((cost, partitions, release))
        else:
            assert reply.status_code == 409, context
            assert body["scope"] == expected, context
            assert {n: units_of(body["requested"], n) for n in fields} == cost, context
            if expected == "population":
                assert body["population"] == population, context
                assert {n: units_of(body["spent"], n) for n in fields} == population_before, context
                assert {n: units_of(body["limit"], n) for n in fields} == population_limit, context
            else:
                assert {n: units_of(body["spent"], n) for n in fields} == before, context
        outcomes[expected] += 1
    # the books at the end: each member's loss, and the population's, the sum of them
    report = exact(api.get(f"/v1/populations/{population}/budget"))
    expected_total = {n: sum(b.loss(fields)[n] for b in members.values()) for n in fields}
    member_reports = {name: exact(api.get(f"/v1/datasets/{name}/budget")) for name in members}
    for name, books in members.items():
        member_loss = {n: units_of(member_reports[name]["loss"], n) for n in fields}
        assert member_loss == books.loss(fields), (name, member_reports[name])
        member_limit = {n: units_of(member_reports[name]["limit"], n) for n in fields}
        assert member_limit == books.limit, (name, member_reports[name])
        assert {n: units_of(report["datasets"][name], n) for n in fields} == member_loss, report
    assert set(report["datasets"]) == set(members), report
    assert {n: units_of(report["loss"], n) for n in fields} == expected_total, report
    assert {
        n: sum(units_of(r["loss"], n) for r in member_reports.values()) for n in fields
    } == expected_total
    assert {n: units_of(report["limit"], n) for n in fields} == population_limit, report
    assert {n: units_of(report["remaining"], n) for n in fields} == {
        n: max(0, population_limit[n] - expected_total[n]) for n in fields
    }, report


@pytest.mark.parametrize("mode", list(WORKLOADS))
def test_random_workloads_match_the_reference(api: Api, mode: str) -> None:
    rng = random.Random(f"populations-{mode}")
    outcomes: Counter[str] = Counter()
    for _ in range(30):
        run_workload(api, mode, rng, outcomes)
    # the workloads exercised every outcome: grants, denials by either scope, and charges
    # that both scopes refuse
    assert all(
        outcomes[o] for o in ("granted", "dataset", "population", "dataset and population")
    ), outcomes


# --- creating and joining ----------------------------------------------------------------


def test_populations_are_created_and_joined_as_the_contract_says(api: Api) -> None:
    """201 with the population's limit and no datasets; a member joins at its creation
    with the same unit, mode and order, and nothing else may."""
    other = {"pure": "approx", "approx": "pure", "zcdp": "gdp", "rdp": "zcdp", "gdp": "zcdp"}
    created: dict[str, tuple[dict[str, Any], Units]] = {}
    for mode, spec in WORKLOADS.items():
        budget = spec.population_budgets[0]
        name = f"{mode}-people"
        made = make_population(api, name, mode, budget)
        report = exact(api.get(f"/v1/populations/{name}/budget"))
        fields = FIELDS[mode]
        created[mode] = (made, {n: units_of(report["limit"], n) for n in fields})
        member = {
            "privacy_unit": "user",
            "accounting": mode,
            "budget": spec.dataset_budgets[0],
            "population": name,
            **_mode_fields(mode),
        }
        api.make_dataset(f"{mode}-member", **member)
        assert exact(api.get(f"/v1/populations/{name}"))["datasets"] == [f"{mode}-member"]
        unlike = {"accounting": other[mode], **_mode_fields(other[mode])}
        unlike["budget"] = (
            {"epsilon": 1} if other[mode] == "pure" else {"epsilon": 1, "delta": 1e-6}
        )
        alone = {k: v for k, v in member.items() if k not in ("population", "rdp_order")}
        refused = [{**member, "privacy_unit": "record"}, {**alone, **unlike}]
        if mode == "rdp":
            refused.append({**member, "rdp_order": 8})
        for index, body in enumerate(refused):
            # valid without the population (the control), refused with it
            solo = {k: v for k, v in body.items() if k != "population"}
            reply = api.post("/v1/datasets", {"name": f"{mode}-solo{index}", **solo})
            assert reply.status_code == 201, (solo, reply.get_json())
            body = {**body, "population": name}
            reply = api.post("/v1/datasets", {"name": f"{mode}-refused{index}", **body})
            assert reply.status_code == 400, (body, reply.get_json())
        assert exact(api.get(f"/v1/populations/{name}"))["datasets"] == [f"{mode}-member"]
    reply = api.post(
        "/v1/populations",
        {"name": "rows", "privacy_unit": "record", "accounting": "pure", "budget": {"epsilon": 1}},
    )
    assert reply.status_code == 400, reply.get_json()
    # the 201 states the population's budget as stated, as a dataset's does (its enforced
    # limit is the budget report's)
    for made, _limit in created.values():
        assert made["budget"]["epsilon"] > 0 and made["privacy_unit"] == "user", made


# --- the closing figure ------------------------------------------------------------------


def test_two_datasets_in_a_population_admit_what_one_dataset_alone_admits(api: Api) -> None:
    """zcdp, (1, 1e-6): Gaussians of sigma 100 alternating between two members, each with a
    budget of its own ten times larger, fit as many times as on one lone dataset of
    (1, 1e-6), 487, and the next is refused by the population."""
    gaussian = {"sigma": 100, "sensitivity": 1}
    api.make_dataset(
        "lone", privacy_unit="user", accounting="zcdp", budget={"epsilon": 1, "delta": 1e-6}
    )
    alone = 0
    while (reply := api.charge("lone", mechanism="gaussian", params=gaussian)).status_code == 201:
        alone += 1
        assert alone < 2000
    assert reply.status_code == 409 and reply.get_json()["scope"] == "dataset"
    assert alone == 487

    make_population(api, "customers", "zcdp", {"epsilon": 1, "delta": 1e-6})
    for name in ("orders", "clicks"):
        api.make_dataset(
            name,
            privacy_unit="user",
            accounting="zcdp",
            budget={"epsilon": 10, "delta": 1e-6},
            population="customers",
        )
    together = 0
    for name in itertools.cycle(("orders", "clicks")):
        reply = api.charge(name, mechanism="gaussian", params=gaussian)
        if reply.status_code != 201:
            break
        together += 1
        assert together < 2000
    assert together == alone
    body = reply.get_json()
    assert reply.status_code == 409, body
    assert body["scope"] == "population" and body["population"] == "customers", body
    # each Gaussian costs rho 1/20000 exactly: 244 on one member, 243 on the other
    report = exact(api.get("/v1/populations/customers/budget"))
    assert report["loss"]["rho"] == Decimal(487) / 20000
    assert report["datasets"]["orders"]["rho"] == Decimal(244) / 20000
    assert report["datasets"]["clicks"]["rho"] == Decimal(243) / 20000
    assert report["loss"]["rho"] <= report["limit"]["rho"] < Decimal(488) / 20000


def test_tenths_on_two_members_fill_a_population_of_one_exactly(api: Api) -> None:
    """Ten charges of 0.1 alternating between two members fill a population of 1.0 exactly
    (no binary float sums), and the eleventh is the population's to refuse. At the unit: a
    population of 1.0000000019 is a limit of 1.000000001 (rounded down), so after 1.0 a
    charge of 0.0000000015 (two units, rounded up) is refused and one of 0.000000001 fits."""
    make_population(api, "tenths", "pure", {"epsilon": 1})
    for name in ("left", "right"):
        api.make_dataset(name, privacy_unit="user", budget={"epsilon": 1}, population="tenths")
    for index in range(10):
        reply = api.charge(("left", "right")[index % 2], epsilon=0.1)
        assert reply.status_code == 201, reply.get_json()
    refused = api.charge("left", epsilon=0.1).get_json()
    assert refused["scope"] == "population" and refused["population"] == "tenths", refused
    assert exact(api.get("/v1/populations/tenths/budget"))["loss"]["epsilon"] == 1

    make_population(api, "units", "pure", {"epsilon": 1.0000000019})
    api.make_dataset("tiny", privacy_unit="user", budget={"epsilon": 2}, population="units")
    assert api.charge("tiny", epsilon=1).status_code == 201
    refused = api.charge("tiny", epsilon=0.0000000015).get_json()
    assert refused["scope"] == "population" and refused["population"] == "units", refused
    assert exact(api.charge("tiny", epsilon=0.000000001))["cost"]["epsilon"] == Decimal("1e-9")
    report = exact(api.get("/v1/populations/units/budget"))
    assert report["limit"]["epsilon"] == report["loss"]["epsilon"] == Decimal("1.000000001")
    assert report["remaining"]["epsilon"] == 0


# --- concurrency -------------------------------------------------------------------------

CLIENTS = 16
MEMBERS = ("orders", "clicks", "tickets")


def _client(
    base: str,
    seed: int,
    start: threading.Barrier,
    granted: list[tuple[Decimal, Decimal]],
    codes: list[int],
    scopes: list[str],
) -> None:
    """Charge Laplace releases of epsilon 0.01 to 0.05 on random members until refused;
    record each status, each grant's (asked, charged) epsilon and each refusal's scope (the
    test asserts, as an assertion in a thread would not fail it)."""
    rng = random.Random(seed)
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        start.wait(timeout=60)
        for _ in range(500):
            epsilon = rng.choice([0.01, 0.02, 0.03, 0.04, 0.05])
            reply = session.post(
                f"{base}/v1/charges",
                json={
                    "dataset": rng.choice(MEMBERS),
                    "partitions": [rng.choice(PARTITIONS)],
                    "mechanism": "laplace",
                    "params": {"epsilon": epsilon, "sensitivity": 1},
                    "input": {"values": [1.0]},
                },
                timeout=120,
            )
            codes.append(reply.status_code)
            body = json.loads(reply.text, parse_float=Decimal)
            if reply.status_code != 201:
                scopes.append(str(body.get("scope")))
                return
            granted.append((Decimal(repr(epsilon)), body["cost"]["epsilon"]))


@pytest.mark.slow
def test_sixteen_clients_never_take_a_population_above_its_limit(server: str) -> None:
    admin = requests.Session()
    admin.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
    made = admin.post(
        f"{server}/v1/populations",
        json={
            "name": "customers",
            "privacy_unit": "user",
            "accounting": "pure",
            "budget": {"epsilon": 1},
        },
        timeout=30,
    )
    assert made.status_code == 201, made.text
    for name in MEMBERS:
        reply = admin.post(
            f"{server}/v1/datasets",
            json={
                "name": name,
                "privacy_unit": "user",
                "accounting": "pure",
                "budget": {"epsilon": 1},
                "population": "customers",
            },
            timeout=30,
        )
        assert reply.status_code == 201, reply.text
    start = threading.Barrier(CLIENTS)
    granted: list[tuple[Decimal, Decimal]] = []
    codes: list[int] = []
    scopes: list[str] = []
    threads = [
        threading.Thread(target=_client, args=(server, seed, start, granted, codes, scopes))
        for seed in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
        assert not thread.is_alive()
    assert set(codes) == {201, 409}, Counter(codes)
    assert codes.count(409) == CLIENTS  # each client stopped at its first refusal
    assert codes.count(201) == len(granted)
    assert set(scopes) <= {"dataset", "population"}, scopes
    assert all(asked == charged for asked, charged in granted), granted

    def get(path: str) -> Any:
        reply = admin.get(f"{server}{path}", timeout=30)
        assert reply.status_code == 200, reply.text
        return json.loads(reply.text, parse_float=Decimal)

    report = get("/v1/populations/customers/budget")
    loss = report["loss"]["epsilon"]
    members = {name: get(f"/v1/datasets/{name}/budget")["loss"]["epsilon"] for name in MEMBERS}
    assert loss <= 1
    assert loss == sum((asked for asked, _ in granted), Decimal(0))
    assert loss == sum(members.values(), Decimal(0))
    assert {name: report["datasets"][name]["epsilon"] for name in MEMBERS} == members
    # every client was refused with the population at least 1 - its charge: nearly full
    assert loss > Decimal("0.95")
    # the ledger: one entry per answer, granted and denied, and its chains verify
    entries = [
        entry
        for name in MEMBERS
        for entry in get(f"/v1/ledger?dataset={name}&limit=1000")["entries"]
        if entry["kind"] == "charge"
    ]
    assert sum(e["status"] == "granted" for e in entries) == len(granted)
    assert sum(e["status"] == "denied" for e in entries) == CLIENTS
    assert sum((e["charged"]["epsilon"] for e in entries), Decimal(0)) == loss
    assert get("/v1/ledger/verify")["ok"] is True
    admin.close()
