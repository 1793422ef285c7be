"""Access control: every /v1 route for every role, on a granted and a non-granted dataset."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from accountant.api.openapi import OPERATIONS
from tests.conftest import Api

ROLES = ["anonymous", "admin", "auditor", "service", "outsider"]  # outsider: service, no grant

Setup = Callable[[Api], tuple[str, str, Any]]  # -> method, path, body

CHARGE = {
    "partitions": ["p"],
    "mechanism": "laplace",
    "params": {"epsilon": 0.1, "sensitivity": 1},
    "input": {"values": [1.0]},
}


def _route(method: str, path: str, body: Any = None) -> Setup:
    return lambda api: (method, path, body)


def _charge_id(api: Api) -> str:
    return str(api.charge().get_json()["charge_id"])


HOLD = {"partitions": ["p"], "amount": {"epsilon": 0.1}, "expires_in": 60}


def _population(api: Api) -> str:
    body = {"name": "customers", "privacy_unit": "user", "budget": {"epsilon": 1}}
    assert api.post("/v1/populations", body).status_code == 201
    return "/v1/populations/customers"


def _request_id(api: Api) -> str:
    """A quota request of a service of its own ("asker"), which no role tested made."""
    asker = api.as_key(api.make_consumer("asker", datasets=["clicks"]))
    body = {"kind": "quota", "dataset": "clicks", "quota": {"epsilon": 0.5}, "reason": "more"}
    made = asker.post("/v1/requests", body)
    assert made.status_code == 202, made.get_json()
    return str(made.get_json()["request_id"])


def _hold_id(api: Api) -> str:
    return str(api.post("/v1/holds", {"dataset": "clicks", **HOLD}).get_json()["hold_id"])


ROUTES: dict[str, tuple[Setup, dict[str, int]]] = {
    "mechanisms": (
        _route("GET", "/v1/mechanisms"),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 200},
    ),
    "create dataset": (
        _route(
            "POST",
            "/v1/datasets",
            {"name": "new", "privacy_unit": "record", "budget": {"epsilon": 1}},
        ),
        {"admin": 201, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "list datasets": (
        _route("GET", "/v1/datasets"),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 200},
    ),
    "show dataset": (
        _route("GET", "/v1/datasets/clicks"),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 403},
    ),
    "patch dataset": (
        _route("PATCH", "/v1/datasets/clicks", {"budget": {"epsilon": 2}}),
        {"admin": 200, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "declare partitions": (
        _route("POST", "/v1/datasets/clicks/partitions", {"keys": ["x"]}),
        {"admin": 201, "auditor": 403, "service": 201, "outsider": 403},
    ),
    "budget": (
        _route("GET", "/v1/datasets/clicks/budget"),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 403},
    ),
    "partitions": (
        _route("GET", "/v1/datasets/clicks/partitions"),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 403},
    ),
    "create population": (
        _route(
            "POST",
            "/v1/populations",
            {"name": "customers", "privacy_unit": "user", "budget": {"epsilon": 1}},
        ),
        {"admin": 201, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "list populations": (
        _route("GET", "/v1/populations"),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "show population": (
        lambda api: ("GET", _population(api), None),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "patch population": (
        lambda api: ("PATCH", _population(api), {"budget": {"epsilon": 0.5}}),
        {"admin": 200, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "population budget": (
        lambda api: ("GET", _population(api) + "/budget", None),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "ask for quota": (
        _route(
            "POST",
            "/v1/requests",
            {"kind": "quota", "dataset": "clicks", "quota": {"epsilon": 0.5}, "reason": "more"},
        ),
        {"admin": 403, "auditor": 403, "service": 202, "outsider": 403},
    ),
    "list requests": (
        _route("GET", "/v1/requests"),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 200},
    ),
    "show request": (
        lambda api: ("GET", f"/v1/requests/{_request_id(api)}", None),
        {"admin": 200, "auditor": 200, "service": 404, "outsider": 404},
    ),
    "approve request": (
        lambda api: ("POST", f"/v1/requests/{_request_id(api)}/approve", {"reason": "ok"}),
        {"admin": 200, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "deny request": (
        lambda api: ("POST", f"/v1/requests/{_request_id(api)}/deny", {"reason": "no"}),
        {"admin": 200, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "create consumer": (
        _route("POST", "/v1/consumers", {"name": "third", "role": "auditor"}),
        {"admin": 201, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "list consumers": (
        _route("GET", "/v1/consumers"),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "issue key": (
        _route("POST", "/v1/consumers/svc/keys"),
        {"admin": 201, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "revoke key": (
        lambda api: (
            "DELETE",
            "/v1/keys/" + api.post("/v1/consumers/aud/keys").get_json()["id"],
            None,
        ),
        {"admin": 204, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "charge": (
        _route("POST", "/v1/charges", {"dataset": "clicks", **CHARGE}),
        {"admin": 201, "auditor": 403, "service": 201, "outsider": 403},
    ),
    "preview": (
        _route("POST", "/v1/charges/preview", {"dataset": "clicks", **CHARGE}),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 403},
    ),
    "plan": (
        _route("POST", "/v1/charges/plan", {"dataset": "clicks", **CHARGE}),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 403},
    ),
    "batch": (
        _route("POST", "/v1/charges/batch", {"items": [{"dataset": "clicks", **CHARGE}]}),
        {"admin": 201, "auditor": 403, "service": 201, "outsider": 403},
    ),
    "weighted plan": (
        _route(
            "POST",
            "/v1/charges/plan",
            {"items": [{"dataset": "clicks", **CHARGE, "params": {"sensitivity": 1}, "weight": 1}]},
        ),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 403},
    ),
    "patch consumer": (
        _route("PATCH", "/v1/consumers/svc", {"datasets": ["clicks", "other"]}),
        {"admin": 200, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "me": (
        _route("GET", "/v1/consumers/me"),
        {"anonymous": 401, "admin": 200, "auditor": 200, "service": 200, "outsider": 200},
    ),
    "show charge": (
        lambda api: ("GET", f"/v1/charges/{_charge_id(api)}", None),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "hold": (
        _route("POST", "/v1/holds", {"dataset": "clicks", **HOLD}),
        {"admin": 201, "auditor": 403, "service": 201, "outsider": 403},
    ),
    "settle hold": (
        lambda api: ("POST", f"/v1/holds/{_hold_id(api)}/settle", {"used": {"epsilon": 0.1}}),
        {"admin": 200, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "release hold": (
        lambda api: ("POST", f"/v1/holds/{_hold_id(api)}/release", {}),
        {"admin": 200, "auditor": 403, "service": 403, "outsider": 403},
    ),
    "list holds": (
        _route("GET", "/v1/holds"),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 200},
    ),
    "show hold": (
        lambda api: ("GET", f"/v1/holds/{_hold_id(api)}", None),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "ledger": (
        _route("GET", "/v1/ledger"),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "export": (
        _route("GET", "/v1/ledger/export?format=csv"),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "verify ledger": (
        _route("GET", "/v1/ledger/verify"),
        {"admin": 200, "auditor": 200, "service": 403, "outsider": 403},
    ),
    "verify receipt": (
        _route("POST", "/v1/receipts/verify", {"receipt": "x.y.z"}),
        {"admin": 200, "auditor": 200, "service": 200, "outsider": 200},
    ),
    "public key": (
        _route("GET", "/v1/receipts/public-key"),
        {"anonymous": 200, "admin": 200, "auditor": 200, "service": 200, "outsider": 200},
    ),
}


def test_the_matrix_covers_every_v1_route() -> None:
    documented = {path for _, path in OPERATIONS if path.startswith("/v1/")}
    exercised = {
        "/v1/mechanisms",
        "/v1/datasets",
        "/v1/datasets/{name}",
        "/v1/datasets/{name}/partitions",
        "/v1/datasets/{name}/budget",
        "/v1/populations",
        "/v1/populations/{name}",
        "/v1/populations/{name}/budget",
        "/v1/requests",
        "/v1/requests/{request_id}",
        "/v1/requests/{request_id}/approve",
        "/v1/requests/{request_id}/deny",
        "/v1/consumers",
        "/v1/consumers/{name}/keys",
        "/v1/keys/{key_id}",
        "/v1/consumers/{name}",
        "/v1/consumers/me",
        "/v1/charges/plan",
        "/v1/charges/batch",
        "/v1/charges",
        "/v1/charges/preview",
        "/v1/charges/{charge_id}",
        "/v1/holds",
        "/v1/holds/{hold_id}",
        "/v1/holds/{hold_id}/settle",
        "/v1/holds/{hold_id}/release",
        "/v1/ledger",
        "/v1/ledger/export",
        "/v1/ledger/verify",
        "/v1/receipts/verify",
        "/v1/receipts/public-key",
    }
    assert documented == exercised
    # /v1/charges/plan is exercised in both its forms
    assert len(ROUTES) == 1 + sum(1 for _, path in OPERATIONS if path.startswith("/v1/"))


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_access(api: Api, route: str, role: str) -> None:
    api.make_dataset()
    api.make_dataset("other")
    keys = {
        "admin": api.key,
        "auditor": api.make_consumer("aud", role="auditor"),
        "service": api.make_consumer("svc", datasets=["clicks"]),
        "outsider": api.make_consumer("out", datasets=["other"]),
        "anonymous": "",
    }
    setup, expected = ROUTES[route]
    method, path, body = setup(api)
    caller = api.as_key(keys[role])
    headers = {} if role != "anonymous" else {"Authorization": ""}
    response = caller.call(method, path, body, headers=headers)
    assert response.status_code == expected.get(role, 401), response.text
    if response.status_code >= 400:
        assert response.content_type == "application/problem+json"


def test_a_service_reads_its_own_charges(api: Api) -> None:
    api.make_dataset()
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    charge_id = service.charge().get_json()["charge_id"]
    assert service.get(f"/v1/charges/{charge_id}").status_code == 200


def test_no_key_reaches_the_logs(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    api.make_dataset()
    key = api.make_consumer("svc", datasets=["clicks"])
    service = api.as_key(key)
    service.charge()
    service.charge(epsilon=50)  # a denial
    api.as_key(key + "x").get("/v1/datasets")  # an unknown key
    service.post("/v1/charges", raw="{broken")
    captured = capsys.readouterr()
    assert key not in captured.out + captured.err
