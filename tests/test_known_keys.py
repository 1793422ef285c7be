"""A charge's caller is authenticated once per process and its key read again under the
dataset's lock: a revoked key charges nothing and gets 401, whatever else its request
does wrong, and grants are never taken from what the process remembers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from flask import Flask

from accountant.services.api_keys import KnownKeys, Principal
from tests.conftest import Api, charge_authenticated_before, run_sql


def _revoked_after_a_charge(api: Api) -> tuple[Api, str]:
    """A service whose key charged once (so this process remembers it), then was revoked;
    and its consumer's other key, still valid."""
    api.make_dataset(budget={"epsilon": 10})
    other = api.make_consumer("svc", datasets=["clicks"])
    issued = api.post("/v1/consumers/svc/keys").get_json()
    service = api.as_key(issued["api_key"])
    first = service.charge(headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201, first.get_json()
    assert api.call("DELETE", f"/v1/keys/{issued['id']}").status_code == 204
    return service, other


FAILING_ONE_WAY_OR_ANOTHER = {
    "a charge": lambda service: service.charge(),
    "a replay": lambda service: service.charge(headers={"Idempotency-Key": "k1"}),
    "a denial, which is ledgered": lambda service: service.charge(epsilon=100),
    "an unknown dataset": lambda service: service.charge(dataset="nope"),
    "an unknown mechanism": lambda service: service.charge(mechanism="nope"),
    "a malformed body": lambda service: service.post("/v1/charges", raw='{"dataset": "c'),
}


@pytest.mark.parametrize(
    "send", FAILING_ONE_WAY_OR_ANOTHER.values(), ids=list(FAILING_ONE_WAY_OR_ANOTHER)
)
def test_a_key_revoked_after_it_charged_gets_401_and_charges_nothing(
    app: Flask, api: Api, send: Callable[[Api], Any]
) -> None:
    service, other = _revoked_after_a_charge(api)
    runtime = app.extensions["accountant"]
    assert runtime.known_keys.get(runtime.key_hasher(service.key)) is not None
    spent = api.budget()["loss"]["epsilon"]
    entries = len(api.ledger())

    response = send(service)
    assert response.status_code == 401, response.get_json()
    assert api.budget()["loss"]["epsilon"] == spent
    assert len(api.ledger()) == entries
    assert runtime.known_keys.get(runtime.key_hasher(service.key)) is None  # forgotten
    assert api.as_key(other).charge().status_code == 201  # the consumer's other key


def test_a_key_revoked_between_its_read_and_the_lock_charges_nothing(app: Any, api: Api) -> None:
    """The key is read again with the dataset under its lock, not only at the start of the
    request."""
    from accountant.errors import Unauthorized

    api.make_dataset(budget={"epsilon": 10})
    api.make_consumer("svc", datasets=["clicks"])
    issued = api.post("/v1/consumers/svc/keys").get_json()
    entries = len(api.ledger())
    with pytest.raises(Unauthorized):
        charge_authenticated_before(
            app, issued["api_key"], lambda: api.call("DELETE", f"/v1/keys/{issued['id']}")
        )
    assert api.budget()["loss"]["epsilon"] == 0
    assert len(api.ledger()) == entries


def test_grants_are_read_with_the_charge_not_remembered(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    api.make_dataset(name="other", budget={"epsilon": 10})
    service = api.as_key(api.make_consumer("svc", datasets=["other"]))
    assert service.charge(dataset="other").status_code == 201  # remembered from here on
    assert service.charge().status_code == 403
    assert api.patch("/v1/consumers/svc", {"datasets": ["clicks"]}).status_code == 200
    assert service.charge().status_code == 201
    assert service.charge(dataset="other").status_code == 403


def test_a_role_is_read_with_the_charge_not_remembered(api: Api, database_url: str) -> None:
    """A service remembered by this process, made an auditor in the database since, may
    not charge: its role is read under the lock with its grant."""
    api.make_dataset(budget={"epsilon": 10})
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    assert service.charge().status_code == 201  # remembered from here on
    entries = len(api.ledger())
    run_sql(database_url, "UPDATE consumers SET role = 'auditor' WHERE name = 'svc'")
    assert service.charge().status_code == 403
    assert len(api.ledger()) == entries


def test_a_remembered_role_is_never_stretched(app: Flask, api: Api) -> None:
    """Only a view that reads the key again takes a remembered principal; an auditor's key
    revoked after it was remembered gets 401 where its role would get 403."""
    api.make_dataset()
    api.make_consumer("audit", role="auditor")
    issued = api.post("/v1/consumers/audit/keys").get_json()
    auditor = api.as_key(issued["api_key"])
    assert auditor.charge().status_code == 403
    runtime = app.extensions["accountant"]
    assert runtime.known_keys.get(runtime.key_hasher(auditor.key)) is not None
    assert api.call("DELETE", f"/v1/keys/{issued['id']}").status_code == 204
    assert auditor.charge().status_code == 401
    assert auditor.get("/v1/ledger").status_code == 401


def test_known_keys_are_bounded_and_keep_no_grants() -> None:
    known = KnownKeys(size=2)
    caller = Principal(
        consumer_id=1, name="svc", role="service", key_id="k1", granted=frozenset({7})
    )
    known.remember("a", caller)
    assert known.get("a") == replace(caller, granted=frozenset())
    known.remember("b", caller)
    known.remember("c", caller)  # full: the others are dropped
    assert (known.get("a"), known.get("b")) == (None, None)
    assert known.get("c") is not None
    known.forget("c")
    assert known.get("c") is None
