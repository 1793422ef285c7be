"""accountant_client against a real `accountant serve`: typed results and errors, receipts
verified offline, and retries that never charge twice (a proxy loses answers after the
service committed them)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from accountant_client import (
    AsyncClient,
    BudgetExhausted,
    Charge,
    Client,
    Forbidden,
    InvalidRequest,
    ReceiptInvalid,
    Unavailable,
    WindowExhausted,
)
from tests.conftest import ADMIN_KEY
from tests.dropping_proxy import dropping_proxy

pytestmark = pytest.mark.slow

LAPLACE: dict[str, Any] = {
    "mechanism": "laplace",
    "params": {"epsilon": 0.25, "sensitivity": 1},
    "input": {"values": [10.0, 20.0]},
}


@pytest.fixture
def admin(server: str) -> Iterator[Client]:
    with Client(server, ADMIN_KEY, deadline=20) as client:
        client.create_dataset(
            name="clicks",
            privacy_unit="record",
            accounting="pure",
            budget={"epsilon": 1},
            windows=[{"period": "1d", "epsilon": 0.75}],
        )
        yield client


def test_a_charge_and_its_denials_are_typed(admin: Client) -> None:
    granted = admin.charge(dataset="clicks", partitions=["a"], **LAPLACE)
    assert granted.cost["epsilon"] == Decimal("0.25") and granted.multiplicity == 1
    assert granted.remaining["epsilon"] == Decimal("0.75")
    assert len(granted.output["values"]) == 2
    assert granted.claims["charge_id"] == granted.charge_id  # verified offline
    assert granted.accuracy is not None and granted.accuracy["half_width_95"] > 0
    assert admin.get_charge(granted.charge_id)["status"] == "granted"
    for _ in range(2):
        admin.charge(dataset="clicks", partitions=["a"], **LAPLACE)
    with pytest.raises(WindowExhausted) as window:
        admin.charge(dataset="clicks", partitions=["a"], **LAPLACE)
    assert window.value.scope == "window" and window.value.resets_at.endswith("T00:00:00Z")
    assert window.value.retry_after is not None and window.value.retry_after > 0
    assert window.value.requested["epsilon"] == Decimal("0.25")
    admin.update_dataset("clicks", windows=[], reason="no more windows")
    with pytest.raises(BudgetExhausted) as lifetime:
        admin.charge(
            dataset="clicks",
            partitions=["a"],
            mechanism="laplace",
            params={"epsilon": 0.5, "sensitivity": 1},
            input={"values": [1.0]},
        )
    assert lifetime.value.status == 409 and lifetime.value.scope == "dataset"
    assert lifetime.value.limit["epsilon"] == Decimal(1)
    assert lifetime.value.spent["epsilon"] == Decimal("0.75")
    assert lifetime.value.requested["epsilon"] == Decimal("0.5")
    with pytest.raises(InvalidRequest) as bad:
        admin.charge(
            dataset="clicks",
            partitions=["a"],
            mechanism="laplace",
            params={"epsilon": -1, "sensitivity": 1},
            input={"values": [1.0]},
        )
    assert [e["field"] for e in bad.value.errors] == ["params.epsilon"]


def test_reads_preview_plan_and_consumers(admin: Client) -> None:
    admin.charge(dataset="clicks", partitions=["a"], **LAPLACE)
    key = admin.create_consumer(
        "svc", "service", datasets=["clicks"], quotas={"clicks": {"epsilon": 0.5}}
    )["api_key"]
    preview = admin.preview(
        dataset="clicks",
        partitions=["a"],
        mechanism="laplace",
        params={"epsilon": 0.5, "sensitivity": 1},
    )
    assert preview.granted and preview.remaining_after["epsilon"] == Decimal("0.25")
    assert preview.accuracy is not None and preview.accuracy["kind"] == "additive_noise"
    plan = admin.plan(
        dataset="clicks",
        partitions=["a"],
        mechanism="laplace",
        params={"epsilon": 0.25, "sensitivity": 1},
    )
    assert plan.fits == 2 and plan.limited_by is not None  # the window: 0.75 - 0.25
    assert plan.accuracy is not None and plan.accuracy["scale"] == plan.raw["accuracy"]["scale"]
    assert admin.budget("clicks")["loss"]["epsilon"] == 0.25
    assert [p["key"] for p in admin.partitions("clicks")] == ["a"]
    assert [e["kind"] for e in admin.ledger(dataset="clicks")] == ["charge"]
    assert len(list(admin.export(dataset="clicks"))) == 1
    assert admin.verify_ledger()["ok"] is True
    assert {"laplace", "gaussian"} <= {m["name"] for m in admin.mechanisms()}
    assert [d["name"] for d in admin.datasets()] == ["clicks"]
    assert {c["name"] for c in admin.consumers()} == {"admin", "svc"}
    with Client(admin._http.base_url.__str__(), key) as service:
        service.charge(dataset="clicks", partitions=["b"], **LAPLACE)
        mine = service.me()
        assert mine["name"] == "svc" and mine["use"]["clicks"]["loss"]["epsilon"] == 0.25
        with pytest.raises(Forbidden):
            service.consumers()
    admin.update_consumer("svc", datasets=[], reason="project ended")
    assert admin.consumers()[1]["datasets"] == []


def test_a_lost_answer_is_retried_and_charged_once(server: str) -> None:
    """The proxy lets the service commit each charge's first attempt, then resets the
    connection; the client retries with the same key and gets the first answer."""
    with Client(server, ADMIN_KEY) as admin:
        admin.create_dataset(
            name="clicks", privacy_unit="record", accounting="pure", budget={"epsilon": 10}
        )
    with dropping_proxy(server) as proxy:
        charges_seen: list[bytes] = []

        def decide(line: bytes) -> str | None:
            if not line.startswith(b"POST /v1/charges "):
                return None
            charges_seen.append(line)
            return "drop" if len(charges_seen) % 2 == 1 else None  # every first attempt

        proxy.decide = decide
        with Client(proxy.base, ADMIN_KEY, deadline=20) as client:
            results = [
                client.charge(dataset="clicks", partitions=["a"], **LAPLACE) for _ in range(5)
            ]
            again = client.charge(
                dataset="clicks",
                partitions=["a"],
                **LAPLACE,
                idempotency_key=results[0].idempotency_key,
            )
    assert [action for _, action in proxy.seen if action == "drop"] == ["drop"] * 6
    assert len({r.charge_id for r in results}) == 5
    assert (again.charge_id, again.output) == (results[0].charge_id, results[0].output)
    with Client(server, ADMIN_KEY) as admin:
        entries = list(admin.ledger(dataset="clicks"))
        assert sorted(e["charge_id"] for e in entries) == sorted(r.charge_id for r in results)
        assert admin.budget("clicks")["loss"]["epsilon"] == 1.25  # five charges, not ten


def test_unavailable_is_retried_after_retry_after_then_given_up(server: str) -> None:
    with Client(server, ADMIN_KEY) as admin:
        admin.create_dataset(
            name="clicks", privacy_unit="record", accounting="pure", budget={"epsilon": 10}
        )
    with dropping_proxy(server) as proxy:
        proxy.decide = lambda line: (
            "503"
            if line.startswith(b"POST") and len([s for s in proxy.seen if s[1] == "503"]) < 1
            else None
        )
        with Client(proxy.base, ADMIN_KEY, deadline=20) as client:
            started = time.monotonic()
            granted = client.charge(dataset="clicks", partitions=["a"], **LAPLACE)
            assert time.monotonic() - started >= 1.0  # Retry-After: 1 was honoured
        assert granted.cost["epsilon"] == Decimal("0.25")
        proxy.decide = lambda line: "503"
        with (
            Client(proxy.base, ADMIN_KEY, deadline=2) as client,
            pytest.raises(Unavailable, match="no answer after"),
        ):
            client.charge(dataset="clicks", partitions=["a"], **LAPLACE)


def test_a_receipt_that_does_not_check_out_is_refused(admin: Client) -> None:
    granted = admin.charge(dataset="clicks", partitions=["a"], **LAPLACE)
    with pytest.raises(ReceiptInvalid, match="not the one"):
        admin.verify_receipt(granted.receipt, output={"values": [0.0, 0.0]})
    header, claims, signature = granted.receipt.split(".")
    forged = ".".join([header, claims[:-4] + "AAAA", signature])
    with pytest.raises(ReceiptInvalid):
        admin.verify_receipt(forged)


def test_the_async_client_charges_concurrently_and_retries_lost_answers(server: str) -> None:
    """Eight charges at once through a proxy that loses every other charge's answer after the
    service committed it: eight distinct charges, each charged once, then a typed denial."""
    with Client(server, ADMIN_KEY) as admin:
        admin.create_dataset(
            name="clicks", privacy_unit="record", accounting="pure", budget={"epsilon": 2}
        )

    async def run(base: str) -> list[Charge]:
        async with AsyncClient(base, ADMIN_KEY, deadline=30) as client:
            results = await asyncio.gather(
                *[client.charge(dataset="clicks", partitions=["a"], **LAPLACE) for _ in range(8)]
            )
            with pytest.raises(BudgetExhausted):
                await client.charge(dataset="clicks", partitions=["a"], **LAPLACE)
            assert (await client.budget("clicks"))["loss"]["epsilon"] == 2.0
            return list(results)

    with dropping_proxy(server) as proxy:
        attempts = itertools.count()
        proxy.decide = lambda line: (
            "drop" if line.startswith(b"POST /v1/charges ") and next(attempts) % 2 == 0 else None
        )
        results = asyncio.run(run(proxy.base))
    assert [action for _, action in proxy.seen].count("drop") >= 4
    assert len({r.charge_id for r in results}) == 8 and all(r.claims for r in results)
    with Client(server, ADMIN_KEY) as admin:
        statuses = [e["status"] for e in admin.ledger(dataset="clicks")]
    assert sorted(statuses) == ["denied"] + ["granted"] * 8
