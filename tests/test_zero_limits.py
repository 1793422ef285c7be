"""A positive stated budget whose enforced limit would be 0 units (it would admit no
charge) is refused with a 400 naming the field and the least value that admits one, at
creation and on PATCH, for datasets (lifetime, partition, windows) and consumers' quotas;
never stored. Over HTTP on both backends."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

import mpmath
import pytest

from tests.conftest import Api

RDP: dict[str, Any] = {"accounting": "rdp", "budget": {"epsilon": 8, "delta": 1e-5}}  # order 3.874
ZCDP: dict[str, Any] = {"accounting": "zcdp", "budget": {"epsilon": 1, "delta": 1e-6}}
GDP: dict[str, Any] = {"accounting": "gdp", "budget": {"epsilon": 1, "delta": 1e-6}}
APPROX: dict[str, Any] = {"accounting": "approx", "budget": {"epsilon": 1, "delta": 1e-6}}
PURE: dict[str, Any] = {"accounting": "pure", "budget": {"epsilon": 1}}
UNIT = {"epsilon": Decimal("1e-9"), "delta": Decimal("1e-18"), "rho": Decimal("1e-12")}


def _rdp_least(delta: str, order: str = "3.874") -> str:
    """The least epsilon on the 10^-9 grid with B(alpha) = epsilon - c(alpha, delta) of at
    least one rho unit, c(alpha, delta) = ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1)
    (CKS20, Proposition 12), computed here at 50 digits."""
    with mpmath.workdps(50):
        alpha = mpmath.mpf(order)
        term = mpmath.log((alpha - 1) / alpha) - (
            mpmath.log(mpmath.mpf(delta)) + mpmath.log(alpha)
        ) / (alpha - 1)
        return str(Decimal(int(mpmath.ceil((term + mpmath.mpf("1e-12")) * 10**9))) / 10**9)


# (dataset, where the budget goes, the budget, the field named, the least value admitting)
CASES: dict[str, tuple[dict[str, Any], str, dict[str, Any], str, str]] = {
    # at (8, 1e-5) and order 3.874, c = 3.2360859...
    "rdp partition": (RDP, "partition_budget", {"epsilon": 2.4}, "epsilon", _rdp_least("1e-5")),
    "rdp window": (RDP, "windows", {"period": "1d", "epsilon": 3.2}, "epsilon", _rdp_least("1e-5")),
    "rdp quota": (RDP, "quota", {"epsilon": 3.2}, "epsilon", _rdp_least("1e-5")),
    # at its own delta 1e-12, c = 8.8443...
    "rdp own delta": (
        RDP,
        "partition_budget",
        {"epsilon": 5, "delta": 1e-12},
        "epsilon",
        _rdp_least("1e-12"),
    ),
    "zcdp partition": (
        ZCDP,
        "partition_budget",
        {"epsilon": 1e-6, "delta": 1e-18},
        "epsilon",
        "",
    ),
    "zcdp rho": (ZCDP, "windows", {"period": "1d", "rho": 1e-13}, "rho", "1e-12"),
    "gdp window": (
        GDP,
        "windows",
        {"period": "7d", "epsilon": 1e-6, "delta": 1e-18},
        "epsilon",
        "",
    ),
    "gdp quota": (GDP, "quota", {"epsilon": 1e-6, "delta": 1e-18}, "epsilon", ""),
    "pure window": (PURE, "windows", {"period": "1h", "epsilon": 1e-10}, "epsilon", "1e-9"),
    # a lifetime budget is refused as a sub-budget is, where no conversion makes it terms
    "pure lifetime": (PURE, "budget", {"epsilon": 1e-10}, "epsilon", "1e-9"),
    "approx lifetime delta": (APPROX, "budget", {"epsilon": 1, "delta": 1e-19}, "delta", "1e-18"),
    "approx delta": (
        APPROX,
        "partition_budget",
        {"epsilon": 1, "delta": 1e-19},
        "delta",
        "1e-18",
    ),
}


def _field(where: str, component: str) -> str:
    prefix = {"windows": "windows.0", "quota": "quotas.clicks"}.get(where, where)
    return f"{prefix}.{component}"


def _placed(where: str, budget: dict[str, Any]) -> dict[str, Any]:
    return {"windows": [budget]} if where == "windows" else {where: budget}


def _create(api: Api, dataset: dict[str, Any], where: str, budget: dict[str, Any]) -> Any:
    """Create the dataset with ``budget`` at ``where``, or the consumer with it as a quota."""
    if where == "quota":
        if api.get("/v1/datasets/clicks").status_code == 404:
            api.make_dataset(**dataset)
        body = {"name": "svc", "role": "service", "datasets": ["clicks"]}
        return api.post("/v1/consumers", {**body, "quotas": {"clicks": budget}})
    body = {"name": "clicks", "privacy_unit": "record", **dataset}
    return api.post("/v1/datasets", {**body, **_placed(where, budget)})


def _patch(api: Api, where: str, budget: dict[str, Any]) -> Any:
    if where == "quota":
        return api.patch("/v1/consumers/svc", {"quotas": {"clicks": budget}})
    return api.patch("/v1/datasets/clicks", _placed(where, budget))


def _refused(reply: Any, field: str) -> str:
    """The least value the refusal names, after checking it is a 400 naming ``field``."""
    assert reply.status_code == 400, reply.get_json()
    assert reply.content_type == "application/problem+json"
    problem = reply.get_json()
    assert [error["field"] for error in problem["errors"]] == [field]
    assert problem["detail"].startswith(f"{field}: ")
    assert "admit no charge" in problem["detail"]
    least = re.search(r"at least ([0-9.e+-]+)", problem["detail"])
    assert least is not None, problem["detail"]
    return least.group(1)


def _enforced(api: Api, where: str) -> dict[str, Any]:
    """The enforced terms at ``where`` as the service shows them."""
    if where == "quota":
        consumers = api.get("/v1/consumers").get_json()["consumers"]
        (consumer,) = [c for c in consumers if c["name"] == "svc"]
        return dict(consumer["quotas"]["clicks"])
    dataset = api.get("/v1/datasets/clicks").get_json()
    stated = dataset["windows"][0] if where == "windows" else dataset[where]
    return {k: v for k, v in stated.items() if k != "period"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_budget_that_admits_nothing_is_refused_with_the_least_that_admits(
    api: Api, case: str
) -> None:
    dataset, where, budget, component, expected = CASES[case]
    field = _field(where, component)
    least = _refused(_create(api, dataset, where, budget), field)
    if expected:
        assert least == expected
    if dataset["accounting"] == "rdp":
        assert "zcdp" in _create(api, dataset, where, budget).get_json()["detail"]
    assert api.get("/v1/datasets/clicks").status_code == (404 if where != "quota" else 200)
    assert "svc" not in str(api.get("/v1/consumers").get_json())
    # the least value admits, one unit less (if above 0: the schema refuses 0) does not
    if (lower := Decimal(least) - UNIT[component]) > 0:
        _refused(_create(api, dataset, where, {**budget, component: float(lower)}), field)
    made = _create(api, dataset, where, {**budget, component: float(least)})
    assert made.status_code == 201, made.get_json()
    enforced = _enforced(api, where)
    measure = {"rdp": "rdp", "zcdp": "rho", "gdp": "mu"}.get(dataset["accounting"], component)
    assert enforced[measure] > 0, enforced
    # and on PATCH: refused, nothing changed, nothing ledgered
    entries = api.ledger()
    _refused(_patch(api, where, budget), field)
    assert _enforced(api, where) == enforced
    assert api.ledger() == entries


def test_a_sub_budget_at_the_least_epsilon_admits_a_charge(api: Api) -> None:
    """The (8, 1e-5) rdp dataset of the report: a partition epsilon of 3.236085943 is a
    Renyi limit L in (0, 10^-9); a Gaussian whose divergence at the order, 3.874 / (2
    sigma^2), is 0.6 L fits once, and a second does not."""
    assert api.make_dataset(**RDP, partition_budget={"epsilon": 3.236085943})["rdp_order"] == 3.874
    limit = api.get("/v1/datasets/clicks").get_json()["partition_budget"]["rdp"]
    assert 0 < limit < 1e-9
    sigma = math.sqrt(3.874 / (2 * 0.6 * limit))
    params = {"sigma": sigma, "sensitivity": 1}
    gaussian: dict[str, Any] = {"mechanism": "gaussian", "params": params}
    assert api.charge(**gaussian).status_code == 201
    refused = api.charge(**gaussian)
    assert refused.status_code == 409 and refused.get_json()["scope"] == "partition"


def test_a_stated_limit_of_the_other_modes_is_unchanged(api: Api) -> None:
    """What admits a charge is stored as before: the refusal is only for a zero limit."""
    api.make_dataset(**ZCDP, partition_budget={"epsilon": 0.001, "delta": 1e-18})
    assert api.get("/v1/datasets/clicks").get_json()["partition_budget"]["rho"] > 0
    assert api.patch("/v1/datasets/clicks", {"partition_budget": {"rho": 1e-12}}).status_code == 200
    assert api.get("/v1/datasets/clicks").get_json()["partition_budget"]["rho"] == 1e-12


@pytest.mark.parametrize(
    "dataset",
    [
        # accounting.md's own example of an order that does not suit the budget
        {"accounting": "rdp", "rdp_order": 8, "budget": {"epsilon": 1, "delta": 1e-6}},
        {"accounting": "rdp", "rdp_order": 1.001, "budget": {"epsilon": 1, "delta": 1e-6}},
    ],
    ids=["rdp order 8", "rdp order 1.001"],
)
def test_a_lifetime_limit_of_0_is_shown_at_its_limit_everywhere(
    api: Api, dataset: dict[str, Any]
) -> None:
    """A lifetime budget whose enforced limit is 0 is kept (it is the dataset's terms), and
    admits no charge: API.md's at_limit ("true exactly when ... nothing more fits") says so,
    as does the utilisation metric (1 is exhausted), which would otherwise never alert."""
    api.make_dataset(**dataset)
    report = api.budget()
    assert report["limit"]["rdp"] == 0 and report["remaining"]["rdp"] == 0
    assert report["at_limit"] is True
    refused = api.charge(epsilon=0.001)
    assert refused.status_code == 409 and refused.get_json()["scope"] == "dataset"
    metrics = api.get("/metrics").text
    assert 'accountant_budget_utilisation{dataset="clicks",scope="dataset"} 1\n' in metrics
