"""accountant_client's holds against a real `accountant serve`: drawn on, settled, released,
settled in full by a block that did neither, typed denials, receipts verified offline,
retries that hold and settle once, and the same under asyncio."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import httpx
import pytest

from accountant.migrate import upgrade
from accountant_client import (
    AsyncClient,
    AsyncHold,
    BudgetExhausted,
    Conflict,
    Hold,
    HoldExhausted,
    InvalidRequest,
    ReceiptInvalid,
    Settlement,
)
from accountant_client import Client as ApiClient
from tests.conftest import ADMIN_KEY
from tests.dropping_proxy import dropping_proxy
from tests.server import running_service
from tests.test_sampled_gaussian import accountant_rdp

pytestmark = pytest.mark.slow

LAPLACE: dict[str, Any] = {"mechanism": "laplace", "input": {"values": [10.0, 20.0]}}
SAMPLED: dict[str, Any] = {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 100}
Q, SIGMA = Fraction(1, 100), Fraction(11, 10)


def _laplace(epsilon: float) -> dict[str, Any]:
    return {**LAPLACE, "params": {"epsilon": epsilon, "sensitivity": 1}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `accountant serve` for the module, on SQLite: what is tested is the client; the
    holds themselves are tested on every backend in tests/test_holds.py. Each test makes
    datasets of its own."""
    folder = tmp_path_factory.mktemp("client-holds")
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


def make_hold(admin: ApiClient, dataset: str, **fields: Any) -> Hold:
    return admin.hold(
        **{"dataset": dataset, "partitions": ["p1"], "expires_in": 600, **fields}
        | ({} if "mechanism" in fields or "amount" in fields else {"amount": {"epsilon": 0.4}})
    )


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


def test_a_hold_drawn_on_twice_then_settled_and_its_receipts_verified_offline(
    admin: ApiClient, server: str
) -> None:
    make_dataset(admin, "drawn")
    hold = make_hold(admin, "drawn", amount={"epsilon": 0.5}, purpose="nightly report")
    assert (hold.state, hold.release_kind, hold.partitions) == ("open", "joint", ["p1"])
    assert hold.amount["epsilon"] == Decimal("0.5") and hold.drawn["epsilon"] == 0
    assert hold.remaining is not None and hold.remaining["epsilon"] == Decimal("0.5")
    assert hold.claims["kind"] == "hold" and hold.claims["hold_id"] == hold.hold_id
    assert hold.raw["purpose"] == "nightly report" and hold.settlement is None
    draws = [hold.charge(**_laplace(0.1)) for _ in range(2)]
    assert all(d.hold_id == hold.hold_id and d.charged["epsilon"] == 0 for d in draws)
    assert [d.claims["hold_id"] for d in draws] == [hold.hold_id] * 2
    assert admin.budget("drawn")["loss"]["epsilon"] == 0.5  # charged once, by the hold
    assert hold.refresh().drawn["epsilon"] == Decimal("0.2")

    settlement = hold.settle(used={"epsilon": 0.3})
    assert isinstance(settlement, Settlement) and hold.settlement is settlement
    assert (settlement.hold_id, settlement.state) == (hold.hold_id, "settled")
    assert settlement.amount["epsilon"] == Decimal("0.5")
    assert settlement.drawn["epsilon"] == Decimal("0.2")
    assert settlement.used["epsilon"] == Decimal("0.3")
    assert settlement.returned["epsilon"] == Decimal("0.2")
    assert settlement.claims["kind"] == "settle" and settlement.claims["used"]["epsilon"] == 0.3
    assert admin.budget("drawn")["loss"]["epsilon"] == 0.3
    with pytest.raises(Conflict, match="settled"):
        hold.settle(used={"epsilon": 0.3})

    transport = _Counting()
    with ApiClient(server, ADMIN_KEY, transport=transport) as verifier:
        claims = verifier.verify_receipt(hold.receipt or "", kind="hold")
        assert claims["amount"] == {"epsilon": 0.5, "delta": 0.0}
        assert transport.paths == ["/v1/receipts/public-key"]  # fetched once, cached
        settled = verifier.verify_receipt(settlement.receipt, kind="settle")
        assert settled["hold_id"] == hold.hold_id and settled["returned"]["epsilon"] == 0.2
        with pytest.raises(ReceiptInvalid, match="a settle receipt, not a charge"):
            verifier.verify_receipt(settlement.receipt, kind="charge")
        with pytest.raises(ReceiptInvalid, match="names no output"):
            verifier.verify_receipt(settlement.receipt, output=draws[0].output)
        assert verifier.verify_receipt(draws[0].receipt, output=draws[0].output, kind="charge")
        assert transport.paths == ["/v1/receipts/public-key"]  # offline from then on


@pytest.mark.parametrize(
    ("dataset", "amount"),
    [
        pytest.param({"accounting": "pure"}, {"epsilon": 0.4}, id="pure"),
        pytest.param(
            {"accounting": "approx", "budget": {"epsilon": 1, "delta": 1e-5}},
            {"epsilon": 0.4, "delta": 1e-7},
            id="approx",
        ),
        pytest.param(  # measured in rho, stated in epsilon and delta
            {
                "accounting": "approx",
                "composition": "advanced",
                "budget": {"epsilon": 1, "delta": 1e-5},
            },
            {"epsilon": 0.1, "delta": 1e-7},
            id="approx-advanced",
        ),
        pytest.param(
            {"accounting": "zcdp", "budget": {"epsilon": 1, "delta": 1e-6}},
            {"rho": 0.01},
            id="zcdp",
        ),
        pytest.param(
            {"accounting": "rdp", "rdp_order": 8, "budget": {"epsilon": 10, "delta": 1e-6}},
            {"rdp": 0.1},
            id="rdp",
        ),
        pytest.param(  # mu as the service states it, rounded, squares to more than the amount
            {"accounting": "gdp", "budget": {"epsilon": 5, "delta": 1e-6}},
            {"mu": 0.123456789},
            id="gdp",
        ),
    ],
)
def test_a_block_that_does_nothing_settles_at_the_full_amount(
    admin: ApiClient,
    request: pytest.FixtureRequest,
    dataset: dict[str, Any],
    amount: dict[str, Any],
) -> None:
    """Never a refund by default: the job may have published."""
    name = f"idle-{request.node.callspec.id}"
    make_dataset(admin, name, **dataset)
    with make_hold(admin, name, amount=amount) as hold:
        pass
    measure = hold.raw["amount"]["measure"]
    assert hold.settlement is not None and hold.settlement.used == hold.amount
    assert hold.settlement.returned[measure] == 0
    shown = admin.get_hold(hold.hold_id)
    assert shown.state == "settled" and shown.raw["used"] == hold.raw["amount"]
    report = admin.budget(name)
    assert report["loss"][measure] == hold.raw["amount"][measure]
    assert report["held"][measure] == 0


def test_a_block_left_by_an_exception_settles_at_the_full_amount(admin: ApiClient) -> None:
    make_dataset(admin, "failed")
    with pytest.raises(RuntimeError, match="the job failed"), make_hold(admin, "failed") as hold:
        hold.charge(**_laplace(0.1))
        raise RuntimeError("the job failed after it published")
    assert hold.settlement is not None and hold.settlement.used["epsilon"] == Decimal("0.4")
    assert hold.refresh().state == "settled"
    assert admin.budget("failed")["loss"]["epsilon"] == 0.4


def test_a_block_that_released_its_hold_is_not_settled_again(admin: ApiClient) -> None:
    make_dataset(admin, "released")
    with make_hold(admin, "released") as hold:
        hold.charge(**_laplace(0.1))
        released = hold.release()
    assert hold.settlement is released and released.used["epsilon"] == Decimal("0.1")
    assert released.returned["epsilon"] == Decimal("0.3")
    assert admin.get_hold(hold.hold_id).raw["used"]["epsilon"] == 0.1
    assert admin.budget("released")["loss"]["epsilon"] == 0.1
    # ended elsewhere (another process, read by its id): the block leaves quietly
    with make_hold(admin, "released") as other:
        admin.get_hold(other.hold_id).release()
    assert other.settlement is None and other.refresh().state == "settled"
    assert admin.budget("released")["loss"]["epsilon"] == 0.1
    settles = [e for e in admin.ledger(dataset="released") if e["kind"] == "settle"]
    assert sorted(e["hold_id"] for e in settles) == sorted([hold.hold_id, other.hold_id])
    listed = admin.holds(dataset="released", state="settled")
    assert [h.hold_id for h in listed] == [other.hold_id, hold.hold_id]  # newest first
    assert admin.holds(dataset="released", state="open") == []


def test_a_draw_over_the_remainder_raises_hold_exhausted(admin: ApiClient) -> None:
    make_dataset(admin, "exhausted")
    hold = make_hold(admin, "exhausted", amount={"epsilon": 0.5})
    for _ in range(2):
        hold.charge(**_laplace(0.2))
    with pytest.raises(HoldExhausted) as over:
        hold.charge(**_laplace(0.2))
    assert isinstance(over.value, BudgetExhausted) and over.value.status == 409
    assert over.value.scope == "hold" and over.value.limit["epsilon"] == Decimal("0.5")
    assert over.value.spent["epsilon"] == Decimal("0.4")
    assert over.value.requested["epsilon"] == Decimal("0.2")
    hold.release()
    with pytest.raises(HoldExhausted, match="the hold is settled"):
        hold.charge(**_laplace(0.01))


def test_a_hold_is_denied_or_refused_like_a_charge(admin: ApiClient) -> None:
    make_dataset(admin, "denied")
    admin.charge(dataset="denied", partitions=["p1"], **_laplace(0.8))
    with pytest.raises(BudgetExhausted) as denied:
        make_hold(admin, "denied")
    assert type(denied.value) is BudgetExhausted and denied.value.scope == "dataset"
    assert denied.value.requested["epsilon"] == Decimal("0.4")
    with pytest.raises(InvalidRequest) as bad:
        make_hold(admin, "denied", amount={"rho": 0.1})
    assert [e["field"] for e in bad.value.errors] == ["amount.rho"]
    with pytest.raises(TypeError, match="one of the two"):
        make_hold(admin, "denied", amount={"epsilon": 0.1}, mechanism="laplace", params={})
    hold = make_hold(admin, "denied", amount={"epsilon": 0.1})
    with pytest.raises(TypeError, match="one of the two"):
        hold.settle()
    assert hold.release().used["epsilon"] == 0


def test_an_rdp_training_hold_settles_at_the_steps_it_ran(admin: ApiClient) -> None:
    make_dataset(
        admin, "training", accounting="rdp", rdp_order=8, budget={"epsilon": 10, "delta": 1e-6}
    )
    hold = make_hold(admin, "training", mechanism="subsampled_gaussian", params=SAMPLED)
    reference = {steps: accountant_rdp(Q, SIGMA, steps, 8) for steps in (60, 100)}  # dp_accounting
    assert float(hold.amount["rdp"]) == pytest.approx(reference[100], rel=1e-9)
    settlement = hold.settle(params={"steps": 60})
    assert float(settlement.used["rdp"]) == pytest.approx(reference[60], rel=1e-9)
    assert settlement.returned["rdp"] == hold.amount["rdp"] - settlement.used["rdp"]
    assert settlement.claims["used"]["rdp"] == float(settlement.used["rdp"])
    assert admin.budget("training")["loss"]["rdp"] == float(settlement.used["rdp"])


def test_a_lost_answer_holds_and_settles_once(admin: ApiClient, server: str) -> None:
    """The proxy lets the service commit the first attempt of each hold and settle, then
    resets the connection; the client retries under the same key and gets the first
    answer."""
    make_dataset(admin, "lossy")
    with dropping_proxy(server) as proxy:
        seen: list[bytes] = []

        def decide(line: bytes) -> str | None:
            if not line.startswith(b"POST /v1/holds"):
                return None
            seen.append(line)
            return "drop" if len(seen) % 2 == 1 else None  # every first attempt

        proxy.decide = decide
        with ApiClient(proxy.base, ADMIN_KEY, deadline=20) as client:
            with make_hold(client, "lossy") as hold:
                pass
            settled = make_hold(client, "lossy", amount={"epsilon": 0.2})
            settlement = settled.settle(used={"epsilon": 0.1})
    assert [action for _, action in proxy.seen].count("drop") == 4
    assert hold.settlement is not None and hold.settlement.used["epsilon"] == Decimal("0.4")
    assert settlement.returned["epsilon"] == Decimal("0.1")
    kinds = sorted(e["kind"] for e in admin.ledger(dataset="lossy"))
    assert kinds == ["hold", "hold", "settle", "settle"]
    assert admin.budget("lossy")["loss"]["epsilon"] == 0.5


def test_the_async_client_holds_draws_and_releases(admin: ApiClient, server: str) -> None:
    make_dataset(admin, "async")

    async def run() -> tuple[AsyncHold, AsyncHold]:
        async with AsyncClient(server, ADMIN_KEY, deadline=20) as client:
            hold = await client.hold(
                dataset="async", partitions=["p1"], expires_in=600, amount={"epsilon": 0.4}
            )
            async with hold:
                drawn = await hold.charge(**_laplace(0.1))
                assert drawn.hold_id == hold.hold_id and drawn.claims["kind"] == "charge"
                released = await hold.release()
            assert hold.settlement is released and released.used["epsilon"] == Decimal("0.1")
            assert (await hold.refresh()).state == "settled"
            idle = await client.hold(
                dataset="async", partitions=["p1"], expires_in=600, amount={"epsilon": 0.2}
            )
            async with idle:
                pass
            assert [h.hold_id for h in await client.holds(dataset="async")] == [
                idle.hold_id,
                hold.hold_id,
            ]
            assert (await client.get_hold(idle.hold_id)).raw["used"]["epsilon"] == 0.2
            return hold, idle

    hold, idle = asyncio.run(run())
    assert hold.claims["kind"] == "hold" and idle.settlement is not None
    assert admin.budget("async")["loss"]["epsilon"] == 0.3  # 0.1 drawn, 0.2 settled in full
