"""accountant_client's batches against a real `accountant serve`: a granted batch's charges
and their receipts verified offline, a refusal raised as one typed error listing every
overflowing scope, retries under one key that charge once, and the same under asyncio."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from accountant.migrate import upgrade
from accountant_client import (
    AsyncClient,
    BatchDenial,
    BatchDenied,
    BatchPlan,
    BatchRefused,
    BatchResult,
    BatchWindowRefused,
    BudgetExhausted,
    Charge,
    InvalidRequest,
    WindowExhausted,
)
from accountant_client import Client as ApiClient
from tests.conftest import ADMIN_KEY
from tests.dropping_proxy import dropping_proxy
from tests.server import running_service

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `accountant serve` for the module, on SQLite: what is tested is the client; the
    batches themselves are tested on every backend in tests/test_batches.py. Each test makes
    datasets of its own."""
    folder = tmp_path_factory.mktemp("client-batches")
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


def make_dataset(admin: ApiClient, name: str, **fields: Any) -> None:
    defaults = {"privacy_unit": "record", "accounting": "pure", "budget": {"epsilon": 1}}
    admin.create_dataset(name=name, **{**defaults, **fields})


def make_item(
    dataset: str, epsilon: float, partitions: Any = ("p1",), values: Any = (10.0,)
) -> dict[str, Any]:
    """A batch item: a charge's body, as ``charge``'s keyword arguments name it."""
    return {
        "dataset": dataset,
        "partitions": partitions,
        "mechanism": "laplace",
        "params": {"epsilon": epsilon, "sensitivity": 1},
        "input": {"values": list(values)},
    }


class _Counting(httpx.BaseTransport):
    """A transport that records every request's path: none while a receipt is verified
    offline."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_a_granted_batch_gives_each_item_a_charge_with_a_receipt_verified_offline(
    admin: ApiClient, server: str
) -> None:
    make_dataset(admin, "report")
    make_dataset(admin, "orders")
    items = [
        make_item("report", 0.25, values=(10.0, 20.0)),
        make_item("orders", 0.5),
        make_item("report", 0.25, partitions=["p2"]),
    ]
    batch = admin.batch(items)
    assert isinstance(batch, BatchResult) and len(batch.items) == 3
    assert all(isinstance(item, Charge) for item in batch.items)
    assert [item.dataset for item in batch.items] == ["report", "orders", "report"]
    assert [item.partitions for item in batch.items] == [["p1"], ["p1"], ["p2"]]
    assert [len(item.output["values"]) for item in batch.items] == [2, 1, 1]
    assert [item.cost["epsilon"] for item in batch.items] == [
        Decimal("0.25"),
        Decimal("0.5"),
        Decimal("0.25"),
    ]
    assert {item.batch_id for item in batch.items} == {batch.batch_id}
    assert all(item.group is None for item in batch.items)  # no delta: each priced alone
    assert all(item.idempotency_key == batch.idempotency_key for item in batch.items)
    assert [item.claims["charge_id"] for item in batch.items] == [
        item.charge_id for item in batch.items
    ]  # every receipt verified, output included, as the batch answered
    assert batch.cost == {
        "report": {"epsilon": Decimal("0.5"), "delta": Decimal(0)},
        "orders": {"epsilon": Decimal("0.5"), "delta": Decimal(0)},
    }
    assert admin.budget("report")["loss"]["epsilon"] == 0.25  # record unit: p1 and p2 apart
    assert admin.budget("orders")["loss"]["epsilon"] == 0.5
    entries = [e for e in admin.ledger() if e.get("batch_id") == batch.batch_id]
    assert sorted(e["charge_id"] for e in entries) == sorted(i.charge_id for i in batch.items)

    transport = _Counting()
    with ApiClient(server, ADMIN_KEY, transport=transport) as verifier:
        for item in batch.items:
            claims = verifier.verify_receipt(item.receipt, output=item.output, kind="charge")
            assert claims["charge_id"] == item.charge_id and claims["dataset"] == item.dataset
        assert transport.paths == ["/v1/receipts/public-key"]  # fetched once, then offline


def test_a_refused_batch_raises_one_error_listing_every_denial(admin: ApiClient) -> None:
    """Two datasets each taken over their limit by a different item: one ``BatchRefused``,
    caught as ``BudgetExhausted`` by code written for charges, with both denials."""
    make_dataset(admin, "refused-a", budget={"epsilon": 1}, partition_budget={"epsilon": 0.3})
    make_dataset(admin, "refused-b", budget={"epsilon": 0.5})
    items = [
        make_item("refused-a", 0.2),  # 0
        make_item("refused-b", 0.4),  # 1
        make_item("refused-a", 0.2),  # 2: p1 of refused-a over its 0.3
        make_item("refused-b", 0.4),  # 3: refused-b over its 0.5
    ]
    with pytest.raises(BudgetExhausted) as refused:
        admin.batch(items)
    error = refused.value
    assert type(error) is BatchRefused and isinstance(error, BatchDenied)
    assert error.status == 409 and error.batch_id
    assert sorted(error.denials, key=lambda d: d.item) == [
        BatchDenial(
            item=2,
            dataset="refused-a",
            scope="partition",
            partition="p1",
            limit={"epsilon": Decimal("0.3"), "delta": Decimal(0)},
            spent={"epsilon": Decimal(0), "delta": Decimal(0)},
            requested={"epsilon": Decimal("0.4"), "delta": Decimal(0)},
        ),
        BatchDenial(
            item=3,
            dataset="refused-b",
            scope="dataset",
            partition=None,
            limit={"epsilon": Decimal("0.5"), "delta": Decimal(0)},
            spent={"epsilon": Decimal(0), "delta": Decimal(0)},
            requested={"epsilon": Decimal("0.8"), "delta": Decimal(0)},
        ),
    ]
    assert all(d.population is None for d in error.denials)  # the datasets have none
    first = error.denials[0]  # what code written for a charge's denial reads
    assert (error.scope, error.partition) == (first.scope, first.partition)
    assert (error.limit, error.spent, error.requested) == (
        first.limit,
        first.spent,
        first.requested,
    )
    for name in ("refused-a", "refused-b"):
        assert admin.budget(name)["loss"]["epsilon"] == 0  # nothing charged
    refusals = [e for e in admin.ledger(status="denied") if e.get("batch_id") == error.batch_id]
    assert sorted(e["dataset"] for e in refusals) == ["refused-a", "refused-b"]
    granted = admin.batch(items[:2])  # the plan fixed in one go: the items over dropped
    assert len(granted.items) == 2


def test_a_batch_refused_by_windows_alone_is_a_window_exhausted(admin: ApiClient) -> None:
    make_dataset(
        admin, "windowed", budget={"epsilon": 10}, windows=[{"period": "1d", "epsilon": 1}]
    )
    admin.charge(**make_item("windowed", 0.5))
    with pytest.raises(WindowExhausted) as spent:
        admin.batch([make_item("windowed", 0.3), make_item("windowed", 0.3)])
    error = spent.value
    assert type(error) is BatchWindowRefused and isinstance(error, BatchDenied)
    assert not isinstance(error, BudgetExhausted)  # waiting helps: not a lifetime refusal
    assert error.status == 429 and error.retry_after is not None and error.retry_after > 0
    [denial] = error.denials
    assert (denial.item, denial.scope, denial.dataset) == (1, "window", "windowed")
    assert denial.spent["epsilon"] == Decimal("0.5")
    assert denial.requested["epsilon"] == Decimal("0.6")
    assert denial.resets_at is not None and denial.resets_at.endswith("T00:00:00Z")
    assert error.resets_at == denial.resets_at and error.scope == "window"


def test_an_invalid_item_is_an_invalid_request_naming_it(admin: ApiClient) -> None:
    make_dataset(admin, "invalid")
    bad = make_item("invalid", 0.1) | {"params": {"epsilon": -1, "sensitivity": 1}}
    with pytest.raises(InvalidRequest) as invalid:
        admin.batch([make_item("invalid", 0.1), bad])
    assert [e["field"] for e in invalid.value.errors] == ["items[1].params.epsilon"]
    assert admin.budget("invalid")["loss"]["epsilon"] == 0


def test_a_batch_sent_again_under_its_key_returns_the_first_answer(admin: ApiClient) -> None:
    make_dataset(admin, "again")
    items = [make_item("again", 0.25), make_item("again", 0.25, values=(1.0, 2.0, 3.0))]
    first = admin.batch(items, idempotency_key="report-2026-11")
    again = admin.batch(items, idempotency_key="report-2026-11")
    assert again.batch_id == first.batch_id and again.idempotency_key == "report-2026-11"
    assert [(i.charge_id, i.output) for i in again.items] == [
        (i.charge_id, i.output) for i in first.items
    ]
    assert admin.budget("again")["loss"]["epsilon"] == 0.5  # charged once
    with pytest.raises(InvalidRequest):  # the same key for another plan: a 422
        admin.batch(items[:1], idempotency_key="report-2026-11")


def test_a_lost_answer_is_retried_and_the_batch_charged_once(admin: ApiClient, server: str) -> None:
    """The proxy lets the service commit each batch's first attempt, then resets the
    connection; the client retries under the same key and gets the first answer."""
    make_dataset(admin, "lossy", budget={"epsilon": 10})
    with dropping_proxy(server) as proxy:
        seen: list[bytes] = []

        def decide(line: bytes) -> str | None:
            if not line.startswith(b"POST /v1/charges/batch"):
                return None
            seen.append(line)
            return "drop" if len(seen) % 2 == 1 else None  # every first attempt

        proxy.decide = decide
        with ApiClient(proxy.base, ADMIN_KEY, deadline=20) as client:
            batches = [
                client.batch([make_item("lossy", 0.25), make_item("lossy", 0.25)]) for _ in range(2)
            ]
    assert [action for _, action in proxy.seen].count("drop") == 2
    charged = sorted(item.charge_id for batch in batches for item in batch.items)
    assert sorted(e["charge_id"] for e in admin.ledger(dataset="lossy")) == charged
    assert admin.budget("lossy")["loss"]["epsilon"] == 1.0  # two batches, not four


def test_the_async_client_batches_and_is_refused_alike(admin: ApiClient, server: str) -> None:
    make_dataset(admin, "async-a")
    make_dataset(admin, "async-b", budget={"epsilon": 0.5})

    async def run() -> tuple[BatchResult, BatchResult, BatchRefused, BatchPlan]:
        async with AsyncClient(server, ADMIN_KEY, deadline=20) as client:
            items = [make_item("async-a", 0.25), make_item("async-b", 0.25)]
            batch = await client.batch(items, idempotency_key="async-report")
            again = await client.batch(items, idempotency_key="async-report")
            with pytest.raises(BatchRefused) as refused:
                await client.batch([make_item("async-a", 0.8), make_item("async-b", 0.3)])
            weighted = [
                {**make_item(name, 0), "weight": 1, "params": {"sensitivity": 1}}
                for name in ("async-a", "async-b")
            ]
            plan = await client.plan(items=weighted)
            return batch, again, refused.value, plan

    batch, again, refused, plan = asyncio.run(run())
    assert [i.dataset for i in batch.items] == ["async-a", "async-b"]
    assert all(i.claims["charge_id"] == i.charge_id for i in batch.items)  # verified
    assert [i.output for i in again.items] == [i.output for i in batch.items]
    assert sorted((d.dataset, d.scope, d.item) for d in refused.denials) == [
        ("async-a", "dataset", 0),
        ("async-b", "dataset", 1),
    ]
    assert admin.budget("async-a")["loss"]["epsilon"] == 0.25
    assert admin.budget("async-b")["loss"]["epsilon"] == 0.25
    # what each dataset has left, to the last unit: 0.75 and 0.25
    assert [params["epsilon"] for params in plan.items] == [Decimal("0.75"), Decimal("0.25")]
    assert plan.cost["async-a"]["epsilon"] == Decimal("0.75")


def test_a_batch_with_a_delta_composes_its_group_of_gaussians(admin: ApiClient) -> None:
    """DESIGN.md's figure: 100 Gaussians of sigma 10 at delta 1e-6 cost epsilon 4.887 as one
    group, each item charged its share, rounded up."""
    make_dataset(admin, "grouped", accounting="approx", budget={"epsilon": 10, "delta": 1e-5})
    gaussian = {
        "dataset": "grouped",
        "partitions": ["p1"],
        "mechanism": "gaussian",
        "params": {"sigma": 10, "sensitivity": 1},
        "input": {"values": [42.0]},
    }
    batch = admin.batch([gaussian] * 100, delta=1e-6)
    cost = batch.cost["grouped"]
    assert Decimal("4.88") < cost["epsilon"] < Decimal("4.89") and cost["delta"] == Decimal("1e-6")
    assert {item.group for item in batch.items} == {0}
    assert sum(item.cost["epsilon"] for item in batch.items) >= cost["epsilon"]
    assert all(item.claims["output_sha256"] for item in batch.items)  # verified offline
    assert Decimal(str(admin.budget("grouped")["loss"]["epsilon"])) == cost["epsilon"]


def test_a_weighted_plan_gives_parameters_its_batch_is_granted_at(admin: ApiClient) -> None:
    make_dataset(admin, "weighted", accounting="approx", budget={"epsilon": 4, "delta": 1e-5})
    where = {"dataset": "weighted", "partitions": ["p1"]}
    items: list[dict[str, Any]] = [
        {**where, "weight": 2, "mechanism": "gaussian", "params": {"sensitivity": 1}},
        {**where, "weight": 1, "mechanism": "laplace", "params": {"sensitivity": 1}},
    ]
    plan = admin.plan(items=items, share=0.5, delta=1e-6)
    assert isinstance(plan, BatchPlan)
    assert [sorted(params) for params in plan.items] == [["sigma"], ["epsilon"]]
    assert Decimal(0) < plan.cost["weighted"]["epsilon"] <= Decimal(2)  # half of 4
    planned = [
        {**where, "mechanism": item["mechanism"], "input": {"values": [7.0]}}
        | {"params": {**item["params"], **params}}  # Decimals, sent as JSON numbers
        for item, params in zip(items, plan.items, strict=True)
    ]
    batch = admin.batch(planned, delta=1e-6)
    assert batch.cost == plan.cost
    rest = admin.plan(items=items, delta=1e-6)  # share 1: all that is left
    assert rest.cost["weighted"]["epsilon"] <= Decimal(4) - batch.cost["weighted"]["epsilon"]


def test_a_plan_takes_one_charge_or_a_list_of_items_not_both(admin: ApiClient) -> None:
    """Told apart before anything is sent."""
    one = {"dataset": "x", "partitions": ["p1"], "mechanism": "gaussian"}
    with pytest.raises(TypeError, match="no count or hold"):
        admin.plan(items=[one], **one, params={"sensitivity": 1})  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="pass items"):
        admin.plan(**one, params={"sensitivity": 1}, share=0.5)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="or items"):
        admin.plan(dataset="x")  # type: ignore[call-overload]
