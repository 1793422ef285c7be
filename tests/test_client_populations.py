"""accountant_client's populations against a real `accountant serve`: created, listed, read
and re-limited; datasets that join one; a charge or a batch it refuses raised as a
``BudgetExhausted`` naming it; the reads under asyncio; and the request bodies the client
sends (Decimal budgets as JSON numbers, an rdp order only when given)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from accountant.migrate import upgrade
from accountant_client import (
    AsyncClient,
    BatchRefused,
    BudgetExhausted,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
)
from accountant_client import Client as ApiClient
from tests.conftest import ADMIN_KEY
from tests.server import running_service

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `accountant serve` for the module, on SQLite: what is tested is the client. Each
    test makes populations and datasets of its own."""
    folder = tmp_path_factory.mktemp("client-populations")
    url = f"sqlite:///{folder / 'accountant.db'}"
    upgrade(url)
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(folder / "signing-key.pem"),
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
    }
    with running_service(env, folder / "serve.log") as running:
        yield running.base


@pytest.fixture
def admin(server: str) -> Iterator[ApiClient]:
    with ApiClient(server, ADMIN_KEY, deadline=20) as client:
        yield client


def make_population(admin: ApiClient, name: str, epsilon: float = 2) -> dict[str, Any]:
    return admin.create_population(name, accounting="pure", budget={"epsilon": epsilon})


def make_member(admin: ApiClient, name: str, population: str, epsilon: float = 1.5) -> None:
    admin.create_dataset(
        name=name,
        privacy_unit="user",
        accounting="pure",
        budget={"epsilon": epsilon},
        population=population,
    )


def laplace(dataset: str, epsilon: float) -> dict[str, Any]:
    """A charge's keyword arguments (and a batch item): one joint release on partition a."""
    return {
        "dataset": dataset,
        "partitions": ["a"],
        "mechanism": "laplace",
        "params": {"epsilon": epsilon, "sensitivity": 1},
        "input": {"values": [10.0]},
    }


def test_a_population_is_created_listed_and_read_with_its_members(admin: ApiClient) -> None:
    created = make_population(admin, "customers")
    assert created["name"] == "customers"
    assert (created["privacy_unit"], created["accounting"]) == ("user", "pure")
    assert created["budget"]["epsilon"] == 2 and created["datasets"] == []
    assert created["created_at"]
    assert "person-level id" in created["identity"]  # said wherever a population is made
    make_member(admin, "orders", "customers")
    make_member(admin, "tickets", "customers")
    read = admin.population("customers")
    assert sorted(read["datasets"]) == ["orders", "tickets"]
    assert {k: read[k] for k in ("name", "privacy_unit", "accounting")} == {
        k: created[k] for k in ("name", "privacy_unit", "accounting")
    }
    assert "customers" in [p["name"] for p in admin.populations()]
    report = admin.population_budget("customers")
    assert report["population"] == "customers" and report["accounting"] == "pure"
    assert report["loss"]["epsilon"] == 0 and report["remaining"]["epsilon"] == 2
    assert report["at_limit"] is False
    assert sorted(report["datasets"]) == ["orders", "tickets"]


def test_a_member_dataset_names_its_population(admin: ApiClient) -> None:
    """GET /v1/datasets/{name} is the dataset as created: its population included."""
    make_population(admin, "patients")
    make_member(admin, "visits-2026", "patients")
    assert admin.dataset("visits-2026")["population"] == "patients"
    assert [d["population"] for d in admin.datasets() if d["name"] == "visits-2026"] == ["patients"]


def test_a_charge_over_the_population_limit_is_refused_naming_it(admin: ApiClient) -> None:
    """Each dataset has room (1.5 each); together they may lose at most 2."""
    make_population(admin, "people")
    make_member(admin, "visits", "people")
    make_member(admin, "carts", "people")
    admin.charge(**laplace("visits", 1.0))
    admin.charge(**laplace("carts", 0.75))
    report = admin.population_budget("people")
    assert report["loss"]["epsilon"] == 1.75 and report["remaining"]["epsilon"] == 0.25
    assert report["datasets"]["visits"]["epsilon"] == 1.0
    assert report["datasets"]["carts"]["epsilon"] == 0.75
    with pytest.raises(BudgetExhausted) as refused:
        admin.charge(**laplace("carts", 0.5))
    denial = refused.value
    assert (denial.status, denial.scope, denial.population) == (409, "population", "people")
    assert denial.limit["epsilon"] == Decimal(2)
    assert denial.spent["epsilon"] == Decimal("1.75")
    assert denial.requested["epsilon"] == Decimal("0.5")
    assert admin.budget("carts")["loss"]["epsilon"] == 0.75  # nothing charged
    with pytest.raises(BatchRefused) as batch:
        admin.batch([laplace("visits", 0.2), laplace("carts", 0.2)])
    assert batch.value.scope == "population" and batch.value.population == "people"
    assert {(d.scope, d.population) for d in batch.value.denials} == {("population", "people")}
    assert admin.population_budget("people")["loss"]["epsilon"] == 1.75


def test_a_dataset_own_denial_names_no_population(admin: ApiClient) -> None:
    make_population(admin, "wide", epsilon=10)
    make_member(admin, "narrow", "wide", epsilon=0.5)
    with pytest.raises(BudgetExhausted) as refused:
        admin.charge(**laplace("narrow", 1.0))
    assert (refused.value.scope, refused.value.population) == ("dataset", None)


def test_a_new_limit_is_ledgered_and_enforced(admin: ApiClient) -> None:
    make_population(admin, "members", epsilon=1)
    make_member(admin, "logins", "members", epsilon=5)
    admin.charge(**laplace("logins", 1.0))
    with pytest.raises(BudgetExhausted):
        admin.charge(**laplace("logins", 0.5))
    raised = admin.update_population("members", budget={"epsilon": 3}, reason="second study")
    assert raised["name"] == "members" and raised["budget"]["epsilon"] == 3
    admin.charge(**laplace("logins", 0.5))
    lowered = admin.update_population(
        "members", budget={"epsilon": Decimal("1.25")}, reason="back down"
    )
    assert lowered["budget"]["epsilon"] == 1.25
    report = admin.population_budget("members")
    assert report["loss"]["epsilon"] == 1.5 and report["remaining"]["epsilon"] == 0
    assert report["at_limit"] is True
    assert len(report["limit_history"]) >= 2  # the two changes (and, maybe, the first limit)
    with pytest.raises(BudgetExhausted) as refused:
        admin.charge(**laplace("logins", 0.1))
    assert refused.value.population == "members"
    assert admin.verify_ledger()["ok"] is True


def test_refusals_are_typed(admin: ApiClient, server: str) -> None:
    make_population(admin, "shoppers")
    with pytest.raises(InvalidRequest):
        admin.create_population(
            "records", accounting="pure", budget={"epsilon": 1}, privacy_unit="record"
        )
    with pytest.raises(InvalidRequest):  # the population's mode is pure
        admin.create_dataset(
            name="approx-one",
            privacy_unit="user",
            accounting="approx",
            budget={"epsilon": 1, "delta": 1e-6},
            population="shoppers",
        )
    with pytest.raises(Conflict):  # one namespace for populations and datasets
        make_population(admin, "shoppers")
    admin.create_dataset(
        name="plain", privacy_unit="user", accounting="pure", budget={"epsilon": 1}
    )
    with pytest.raises(Conflict):
        make_population(admin, "plain")
    with pytest.raises(NotFound):
        admin.population("nobody")
    with pytest.raises(NotFound):
        admin.population_budget("nobody")
    key = admin.create_consumer("svc-populations", "service")["api_key"]
    with ApiClient(server, key) as service, pytest.raises(Forbidden):
        make_population(service, "theirs")


def test_the_async_client_reads_populations(admin: ApiClient, server: str) -> None:
    make_population(admin, "readers")
    make_member(admin, "pages", "readers")
    admin.charge(**laplace("pages", 0.5))

    async def read() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
        async with AsyncClient(server, ADMIN_KEY, deadline=20) as client:
            return (
                await client.populations(),
                await client.population("readers"),
                await client.population_budget("readers"),
            )

    listed, population, report = asyncio.run(read())
    assert "readers" in [p["name"] for p in listed]
    assert population["datasets"] == ["pages"]
    assert report["loss"]["epsilon"] == 0.5 and report["datasets"]["pages"]["epsilon"] == 0.5


def test_the_bodies_sent() -> None:
    """Offline: what the client sends for each call, to the path API.md names."""
    sent: list[tuple[str, str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        sent.append((request.method, request.url.path, body))
        if request.url.path == "/v1/populations" and request.method == "GET":
            return httpx.Response(200, json={"populations": []})
        return httpx.Response(200, json={"name": "p"})

    with ApiClient("http://accountant", "k", transport=httpx.MockTransport(answer)) as client:
        client.create_population("p", accounting="zcdp", budget={"epsilon": Decimal("0.5")})
        client.create_population("q", accounting="rdp", budget={"epsilon": 1}, rdp_order=8)
        client.update_population("p", budget={"epsilon": 1, "delta": 1e-7}, reason="why")
        client.update_population("p", budget={"epsilon": 2})
        client.create_dataset(name="d", privacy_unit="user", budget={"epsilon": 1}, population="p")
        client.create_dataset(name="e", privacy_unit="user", budget={"epsilon": 1})
        assert client.populations() == []
        client.population("p")
        client.population_budget("p")
    assert sent == [
        (
            "POST",
            "/v1/populations",
            {"name": "p", "privacy_unit": "user", "accounting": "zcdp", "budget": {"epsilon": 0.5}},
        ),
        (
            "POST",
            "/v1/populations",
            {
                "name": "q",
                "privacy_unit": "user",
                "accounting": "rdp",
                "budget": {"epsilon": 1},
                "rdp_order": 8,
            },
        ),
        (
            "PATCH",
            "/v1/populations/p",
            {"budget": {"epsilon": 1, "delta": 1e-7}, "reason": "why"},
        ),
        ("PATCH", "/v1/populations/p", {"budget": {"epsilon": 2}}),
        (
            "POST",
            "/v1/datasets",
            {"name": "d", "privacy_unit": "user", "budget": {"epsilon": 1}, "population": "p"},
        ),
        ("POST", "/v1/datasets", {"name": "e", "privacy_unit": "user", "budget": {"epsilon": 1}}),
        ("GET", "/v1/populations", None),
        ("GET", "/v1/populations/p", None),
        ("GET", "/v1/populations/p/budget", None),
    ]


def test_a_denial_names_its_population_and_a_batch_its_first() -> None:
    """Offline: a 409 problem of scope population, alone and as a batch's denials."""
    problem = {
        "type": "https://accountant.example/problems/budget-exhausted",
        "status": 409,
        "detail": "population people is spent",
        "scope": "population",
        "population": "people",
        "limit": {"epsilon": 2},
        "spent": {"epsilon": 1.75},
        "requested": {"epsilon": 0.5},
    }
    denials = [
        {"item": 1, "dataset": "carts", **{k: problem[k] for k in ("scope", "population")}},
        {"item": 0, "dataset": "visits", "scope": "dataset"},
    ]
    answers = iter(
        [
            httpx.Response(409, json=problem),
            httpx.Response(409, json={**problem, "denials": denials, "batch_id": "b"}),
        ]
    )
    transport = httpx.MockTransport(lambda request: next(answers))
    with ApiClient("http://accountant", "k", transport=transport) as client:
        with pytest.raises(BudgetExhausted) as alone:
            client.charge(**laplace("carts", 0.5))
        with pytest.raises(BatchRefused) as batch:
            client.batch([laplace("carts", 0.5)])
    assert (alone.value.scope, alone.value.population) == ("population", "people")
    assert alone.value.spent == {"epsilon": Decimal("1.75")}
    assert (batch.value.population, batch.value.denials[0].population) == ("people", "people")
    assert batch.value.denials[1].population is None
