"""accountant_client's approvals against a real `accountant serve` with
ACCOUNTANT_APPROVALS=on: a raise, a new admin and an admin key raise ``PendingApproval``
and change nothing; the requester cannot decide its own request (``Forbidden``); another
admin approves (the change is made, and a new key comes back in ``result``) or denies; a
service asks for a quota; the reads under asyncio; and, offline, the bodies sent and what
a 202 becomes for each call that may answer one."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from accountant.migrate import upgrade
from accountant_client import (
    AccountantError,
    AsyncClient,
    ChangeRequest,
    Conflict,
    Forbidden,
    InvalidRequest,
    IssuedKey,
    NotFound,
    PendingApproval,
)
from accountant_client import Client as ApiClient
from tests.conftest import ADMIN_KEY
from tests.server import running_service

BIN = Path(sys.executable).parent / "accountant"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Approving:
    """A service that requires approvals, and the key of its second admin."""

    base: str
    second_key: str


@contextmanager
def approving_service(folder: Path) -> Iterator[Approving]:
    """`accountant serve` on SQLite with ACCOUNTANT_APPROVALS=on and two admins: ``admin``
    (ACCOUNTANT_ADMIN_KEY, made as the service starts) and ``second``, made as API.md says
    the first admins are, by `accountant keys create --role admin` with database access (the
    API would only ask for another admin's approval)."""
    url = f"sqlite:///{folder / 'accountant.db'}"
    upgrade(url)
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(folder / "signing-key.pem"),
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
        "ACCOUNTANT_APPROVALS": "on",
    }
    with running_service(env, folder / "serve.log") as running:
        made = subprocess.run(
            [BIN, "keys", "create", "--name", "second", "--role", "admin"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, made.stderr
        yield Approving(running.base, made.stdout.strip())


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Approving]:
    """One service for the module: each test makes datasets and consumers of its own."""
    with approving_service(tmp_path_factory.mktemp("client-requests")) as running:
        yield running


@pytest.fixture
def admin(service: Approving) -> Iterator[ApiClient]:
    with ApiClient(service.base, ADMIN_KEY, deadline=20) as client:
        yield client


@pytest.fixture
def second(service: Approving) -> Iterator[ApiClient]:
    with ApiClient(service.base, service.second_key, deadline=20) as client:
        yield client


def make_dataset(admin: ApiClient, name: str, epsilon: float = 1) -> None:
    admin.create_dataset(
        name=name, privacy_unit="record", accounting="pure", budget={"epsilon": epsilon}
    )


def pending(call: Any, *args: Any, **kwargs: Any) -> ChangeRequest:
    """The request a change became: ``call`` raised ``PendingApproval`` carrying it."""
    with pytest.raises(PendingApproval) as raised:
        call(*args, **kwargs)
    request = raised.value.request
    assert raised.value.request_id == request.request_id and request.state == "pending"
    assert "nothing changed yet" in str(raised.value)
    assert (request.decided_by, request.decision_reason, request.decided_at) == (None,) * 3
    assert request.result is None and request.created_at < request.expires_at
    return request


def test_a_raise_waits_for_another_admin_who_approves_it(
    admin: ApiClient, second: ApiClient
) -> None:
    make_dataset(admin, "clicks")
    with pytest.raises(InvalidRequest) as no_reason:  # a change to approve says why
        admin.update_dataset("clicks", budget={"epsilon": 2})
    assert [e["field"] for e in no_reason.value.errors] == ["reason"]
    asked = pending(admin.update_dataset, "clicks", budget={"epsilon": 2}, reason="Q4 report")
    assert (asked.kind, asked.target, asked.requested_by) == ("dataset_limits", "clicks", "admin")
    assert asked.change == {"budget": {"epsilon": 2}} and asked.reason == "Q4 report"
    assert admin.dataset("clicks")["budget"]["epsilon"] == 1  # nothing changed
    assert asked.request_id in [r.request_id for r in admin.requests(state="pending")]
    with pytest.raises(Forbidden) as mine:  # the requester cannot approve its own
        admin.approve(asked.request_id, reason="fine by me")
    assert mine.value.status == 403 and "another admin" in mine.value.detail
    with pytest.raises(Forbidden):
        admin.deny(asked.request_id, reason="never mind")
    approved = second.approve(asked.request_id, reason="budget review ok")
    assert (approved.request_id, approved.state, approved.kind) == (
        asked.request_id,
        "approved",
        "dataset_limits",
    )
    assert (approved.decided_by, approved.decision_reason) == ("second", "budget review ok")
    assert approved.decided_at is not None and approved.result is None
    assert admin.dataset("clicks")["budget"]["epsilon"] == 2  # made, by the approval
    [change] = [e for e in admin.ledger(dataset="clicks") if "approved_by" in e["detail"]]
    assert change["consumer"] == "admin"
    assert (change["detail"]["approved_by"], change["detail"]["request_id"]) == (
        "second",
        asked.request_id,
    )
    with pytest.raises(Conflict):  # decided once
        second.approve(asked.request_id, reason="twice")
    assert admin.get_request(asked.request_id).state == "approved"
    assert asked.request_id in [r.request_id for r in second.requests(state="approved")]
    lowered = admin.update_dataset("clicks", budget={"epsilon": 1.5})  # applies at once
    assert lowered["budget"]["epsilon"] == 1.5
    assert admin.verify_ledger()["ok"] is True


def test_a_denied_request_changes_nothing(admin: ApiClient, second: ApiClient) -> None:
    admin.create_population("customers", accounting="pure", budget={"epsilon": 1})
    asked = pending(
        admin.update_population, "customers", budget={"epsilon": 4}, reason="a new study"
    )
    assert (asked.kind, asked.target) == ("population_limit", "customers")
    denied = second.deny(asked.request_id, reason="not this quarter")
    assert (denied.state, denied.decided_by, denied.decision_reason) == (
        "denied",
        "second",
        "not this quarter",
    )
    with pytest.raises(Conflict):
        second.approve(asked.request_id, reason="changed my mind")
    assert admin.population("customers")["budget"]["epsilon"] == 1
    assert asked.request_id in [r.request_id for r in admin.requests(state="denied")]
    assert asked.request_id not in [r.request_id for r in admin.requests(state="pending")]
    lowered = admin.update_population("customers", budget={"epsilon": 0.5}, reason="tighter")
    assert lowered["budget"]["epsilon"] == 0.5


def test_a_request_whose_target_changed_cannot_be_approved(
    admin: ApiClient, second: ApiClient
) -> None:
    make_dataset(admin, "orders")
    asked = pending(admin.update_dataset, "orders", budget={"epsilon": 3}, reason="more")
    admin.update_dataset("orders", budget={"epsilon": 0.9})
    with pytest.raises(Conflict) as stale:
        second.approve(asked.request_id, reason="ok")
    assert "changed since" in stale.value.detail
    assert admin.dataset("orders")["budget"]["epsilon"] == 0.9


def test_an_approved_admin_or_admin_key_comes_back_in_the_result(
    admin: ApiClient, second: ApiClient, service: Approving
) -> None:
    made = admin.create_consumer("reporter", "service")  # not an admin: no approval
    assert made["api_key"]
    key = admin.create_key("reporter")
    assert key["consumer"] == "reporter" and key["id"] and key["api_key"]
    asked = pending(admin.create_consumer, "third", "admin", reason="on call")
    assert (asked.kind, asked.target) == ("admin_consumer", "third")
    assert "third" not in [c["name"] for c in admin.consumers()]
    approved = second.approve(asked.request_id, reason="yes")
    assert isinstance(approved.result, IssuedKey) and approved.result.consumer == "third"
    assert approved.result.api_key not in repr(approved)  # a secret stays out of logs
    assert approved.raw["result"]["key_id"] == approved.result.key_id
    with ApiClient(service.base, approved.result.api_key) as third:
        assert (third.me()["name"], third.me()["role"]) == ("third", "admin")
        for_second = pending(admin.create_key, "second", reason="a new laptop")
        assert (for_second.kind, for_second.target) == ("admin_key", "second")
        issued = third.approve(for_second.request_id, reason="ok")
    assert issued.result is not None and issued.result.consumer == "second"
    with ApiClient(service.base, issued.result.api_key) as laptop:
        assert laptop.me()["name"] == "second"
    assert admin.get_request(for_second.request_id).result is None  # shown once


def test_a_service_asks_for_a_quota(admin: ApiClient, service: Approving) -> None:
    make_dataset(admin, "visits")
    make_dataset(admin, "elsewhere")
    key = admin.create_consumer("asker", "service", ["visits"], {"visits": {"epsilon": 0.2}})
    with ApiClient(service.base, key["api_key"]) as asker:
        asked = asker.ask_quota("visits", {"epsilon": Decimal("0.5")}, reason="report grew")
        assert (asked.state, asked.kind, asked.target) == ("pending", "quota", "visits")
        assert asked.requested_by == "asker"
        assert asked.change == {"consumer": "asker", "quota": {"epsilon": 0.5}}
        assert [r.request_id for r in asker.requests()] == [asked.request_id]  # its own only
        assert asker.get_request(asked.request_id).reason == "report grew"
        with pytest.raises(Forbidden):  # a service decides nothing
            asker.approve(asked.request_id, reason="please")
        with pytest.raises(Forbidden):  # on a dataset not granted to it
            asker.ask_quota("elsewhere", {"epsilon": 1}, reason="mine too")
        with pytest.raises(NotFound):
            asker.ask_quota("nowhere", {"epsilon": 1}, reason="?")
        approved = admin.approve(asked.request_id, reason="fine")  # the admin did not ask
        assert approved.state == "approved"
        assert asker.me()["quotas"]["visits"]["epsilon"] == 0.5


def test_the_async_client_asks_and_reads(admin: ApiClient, service: Approving) -> None:
    make_dataset(admin, "pages")
    key = admin.create_consumer("async-asker", "service", ["pages"])["api_key"]

    async def ask() -> tuple[ChangeRequest, list[ChangeRequest], ChangeRequest]:
        async with AsyncClient(service.base, key, deadline=20) as client:
            asked = await client.ask_quota("pages", {"epsilon": 0.25}, reason="a new chart")
            return (
                asked,
                await client.requests("pending"),
                await client.get_request(asked.request_id),
            )

    asked, listed, read = asyncio.run(ask())
    assert asked.kind == "quota" and asked.change["quota"] == {"epsilon": 0.25}
    assert [r.request_id for r in listed] == [asked.request_id]
    assert read == asked  # as when asked: still pending


# offline --------------------------------------------------------------------------------

REQUEST = {
    "request_id": "0b9a4c1e-5f00-4d2a-9a57-1c4f2f0c2b11",
    "state": "pending",
    "kind": "dataset_limits",
    "target": "clicks",
    "requested_by": "admin",
    "change": {"budget": {"epsilon": 2}},
    "reason": "Q4",
    "created_at": "2026-11-21T00:00:00Z",
    "expires_at": "2026-11-28T00:00:00Z",
    "decided_by": None,
    "decision_reason": None,
    "decided_at": None,
}


def test_a_202_raises_pending_approval_from_every_call_that_may_answer_one() -> None:
    """Offline: a change the service answered 202 raises ``PendingApproval`` with the
    request read; not an ``AccountantError`` (nothing was refused)."""
    transport = httpx.MockTransport(lambda request: httpx.Response(202, json=REQUEST))
    calls: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
        ("update_dataset", ("clicks",), {"budget": {"epsilon": 2}, "reason": "Q4"}),
        ("update_population", ("p",), {"budget": {"epsilon": 2}, "reason": "Q4"}),
        ("create_consumer", ("third", "admin"), {"reason": "Q4"}),
        ("create_key", ("second",), {"reason": "Q4"}),
    ]
    with ApiClient("http://accountant", "k", transport=transport) as client:
        for name, args, kwargs in calls:
            with pytest.raises(PendingApproval) as raised:
                getattr(client, name)(*args, **kwargs)
            assert not isinstance(raised.value, AccountantError)
            request = raised.value.request
            assert request.raw == REQUEST and request.change == {"budget": {"epsilon": 2}}
            assert (request.request_id, request.expires_at) == (
                REQUEST["request_id"],
                REQUEST["expires_at"],
            )
            assert request.request_id in str(raised.value)


def test_the_bodies_sent() -> None:
    """Offline: what the client sends for each call, to the path API.md names."""
    sent: list[tuple[str, str, str, Any]] = []
    approved = {
        **REQUEST,
        "state": "approved",
        "kind": "admin_key",
        "result": {"consumer": "second", "api_key": "secret", "key_id": "k1"},
    }

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        sent.append((request.method, request.url.path, request.url.query.decode(), body))
        if request.method == "GET" and request.url.path == "/v1/requests":
            return httpx.Response(200, json={"requests": [REQUEST]})
        if request.url.path.endswith("/approve"):
            return httpx.Response(200, json=approved)
        if request.url.path == "/v1/requests" or request.url.path.startswith("/v1/requests/"):
            return httpx.Response(202 if request.method == "POST" else 200, json=REQUEST)
        return httpx.Response(201, json={"name": "x", "api_key": "k"})

    with ApiClient("http://accountant", "k", transport=httpx.MockTransport(answer)) as client:
        asked = client.ask_quota("clicks", {"epsilon": Decimal("0.5")}, reason="grew")
        assert asked.state == "pending"
        assert [r.request_id for r in client.requests()] == [REQUEST["request_id"]]
        client.requests(state="pending")
        client.get_request("r1")
        issued = client.approve("r1", reason="ok").result
        assert issued == IssuedKey("second", "secret", "k1")
        client.deny("r2", reason="no")
        client.create_key("svc")
        client.create_key("second", reason="laptop")
        client.create_consumer("svc", "service")
        client.create_consumer("third", "admin", reason="on call")
    assert sent == [
        (
            "POST",
            "/v1/requests",
            "",
            {"kind": "quota", "dataset": "clicks", "quota": {"epsilon": 0.5}, "reason": "grew"},
        ),
        ("GET", "/v1/requests", "", None),
        ("GET", "/v1/requests", "state=pending", None),
        ("GET", "/v1/requests/r1", "", None),
        ("POST", "/v1/requests/r1/approve", "", {"reason": "ok"}),
        ("POST", "/v1/requests/r2/deny", "", {"reason": "no"}),
        ("POST", "/v1/consumers/svc/keys", "", {}),
        ("POST", "/v1/consumers/second/keys", "", {"reason": "laptop"}),
        ("POST", "/v1/consumers", "", {"name": "svc", "role": "service", "datasets": []}),
        (
            "POST",
            "/v1/consumers",
            "",
            {"name": "third", "role": "admin", "datasets": [], "reason": "on call"},
        ),
    ]


def test_requests_reads_every_page() -> None:
    """Offline: ``requests`` follows ``next_cursor`` to the last page, sync and async."""
    pages = {
        "": {"requests": [{**REQUEST, "request_id": "r2"}], "next_cursor": "7_r2"},
        "7_r2": {"requests": [REQUEST], "next_cursor": None},
    }
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.params.get("state") == "pending"
        asked.append(request.url.params.get("cursor", ""))
        return httpx.Response(200, json=pages[asked[-1]])

    transport = httpx.MockTransport(answer)
    with ApiClient("http://accountant", "k", transport=transport) as client:
        listed = [r.request_id for r in client.requests(state="pending")]
    assert listed == ["r2", REQUEST["request_id"]] and asked == ["", "7_r2"]

    async def read() -> list[str]:
        async with AsyncClient("http://accountant", "k", transport=transport) as client:
            return [r.request_id for r in await client.requests(state="pending")]

    assert asyncio.run(read()) == listed and asked == ["", "7_r2"] * 2
