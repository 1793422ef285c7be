"""Retries replay the first response byte for byte, noise included, and charge once."""

from __future__ import annotations

import json
import multiprocessing
from typing import Any

import pytest

from accountant.migrate import downgrade, upgrade
from tests.conftest import ADMIN_KEY, Api, dump, run_sql


def _keyed(api: Api, key: str, epsilon: float = 0.1, **extra: Any) -> Any:
    return api.charge(epsilon=epsilon, headers={"Idempotency-Key": key}, **extra)


def test_a_retry_returns_the_same_bytes_and_charges_once(api: Api) -> None:
    api.make_dataset()
    first = _keyed(api, "k-1", input={"values": [10.0, 20.0, 30.0]})
    again = _keyed(api, "k-1", input={"values": [10.0, 20.0, 30.0]})
    assert first.status_code == again.status_code == 201
    assert first.text == again.text
    assert len(api.ledger()) == 1
    assert api.budget()["loss"]["epsilon"] == 0.1
    other = _keyed(api, "k-2", input={"values": [10.0, 20.0, 30.0]})
    assert other.get_json()["output"] != first.get_json()["output"]  # fresh key, fresh noise


def test_the_key_may_come_in_the_body(api: Api) -> None:
    api.make_dataset()
    first = api.charge(idempotency_key="in-body")
    assert api.charge(idempotency_key="in-body").text == first.text
    clash = api.charge(idempotency_key="a", headers={"Idempotency-Key": "b"})
    assert clash.status_code == 400


def test_the_same_key_with_another_body_is_422_and_changes_nothing(api: Api) -> None:
    api.make_dataset()
    assert _keyed(api, "k").status_code == 201
    response = _keyed(api, "k", epsilon=0.2)
    assert response.status_code == 422
    assert response.content_type == "application/problem+json"
    assert response.get_json()["type"].endswith("/idempotency-key-reused")
    assert len(api.ledger()) == 1 and api.budget()["loss"]["epsilon"] == 0.1


def test_a_denial_replays_as_the_same_denial(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 0.1})
    assert api.charge(epsilon=0.1).status_code == 201
    first = _keyed(api, "late")
    again = _keyed(api, "late")
    assert first.status_code == again.status_code == 409
    assert first.text == again.text
    assert sum(e["status"] == "denied" for e in api.ledger()) == 1


@pytest.mark.frozen_clock  # the 429 needs the grant before it in the same day
def test_answers_kept_as_http_responses_replay_the_same_after_migration(
    api: Api, database_url: str
) -> None:
    """Rows from before migration 0017 kept the HTTP response (status, body, headers); 0017
    keeps the answer's facts. Downgraded, each row holds its first answer as the old form
    did (the body without the output, a 429's Retry-After); upgraded again, a grant, a
    window denial and a lifetime denial each replay with the first answer's status,
    Retry-After and bytes."""
    api.make_dataset(budget={"epsilon": 2}, windows=[{"period": "1d", "epsilon": 1}])
    firsts = {
        key: _keyed(api, key, epsilon=epsilon)
        for key, epsilon in (("granted", 0.6), ("window", 0.6), ("lifetime", 5))
    }
    assert [r.status_code for r in firsts.values()] == [201, 429, 409]
    api.client.application.extensions["accountant"].engine.dispose()  # its pooled connections
    downgrade(database_url, "0016")
    kept = {
        row[0]: (row[1], _parsed(row[2]), _parsed(row[3]))
        for row in run_sql(database_url, "SELECT key, status, body, headers FROM idempotency_keys")
    }
    for key, first in firsts.items():
        status, body, headers = kept[key]
        shown = first.get_json()
        if status == 201:
            assert {k: v for k, v in body.items() if k not in ("run_params", "output_sha256")} == {
                k: v for k, v in shown.items() if k != "output"
            }
        else:
            assert body == shown
        assert headers == ({"Retry-After": first.headers["Retry-After"]} if key == "window" else {})
        assert status == first.status_code
    upgrade(database_url)
    for key, first in firsts.items():
        again = _keyed(api, key, epsilon={"granted": 0.6, "window": 0.6, "lifetime": 5}[key])
        assert (again.status_code, again.text) == (first.status_code, first.text)
        assert again.headers.get("Retry-After") == first.headers.get("Retry-After")
    assert len(api.ledger()) == 3


def _parsed(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def test_keys_are_scoped_per_consumer(api: Api) -> None:
    api.make_dataset()
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    assert _keyed(api, "shared").status_code == 201
    assert _keyed(service, "shared").status_code == 201
    assert len(api.ledger()) == 2


def test_raw_noise_is_replayed_but_never_stored(api: Api, database_url: str) -> None:
    api.make_dataset()
    first = _keyed(api, "raw", input={"size": 5})
    again = _keyed(api, "raw", input={"size": 5})
    noise = first.get_json()["output"]["noise"]
    assert again.get_json()["output"]["noise"] == noise and len(set(noise)) > 1
    everything = dump(database_url)
    for value in noise:
        assert repr(value) not in everything


def _retry_at_once(database_url: str, signing_key_file: str, start: Any, results: Any) -> None:
    from accountant.app import prepared_app

    app = prepared_app({"database_url": database_url, "signing_key_file": signing_key_file})
    api = Api(app.test_client(), ADMIN_KEY)
    start.wait(timeout=120)
    replies = [_keyed(api, "storm", input={"values": [1.0, 2.0]}) for _ in range(5)]
    results.put([(reply.status_code, reply.text) for reply in replies])


@pytest.mark.slow
def test_concurrent_duplicates_across_processes_charge_once(
    api: Api, database_url: str, signing_key_file: str
) -> None:
    api.make_dataset()
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(4), context.Queue()
    workers = [
        context.Process(
            target=_retry_at_once, args=(database_url, signing_key_file, start, results)
        )
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    replies = [reply for _ in workers for reply in results.get(timeout=300)]
    for worker in workers:
        worker.join(timeout=60)
    assert len(replies) == 20
    assert {status for status, _ in replies} == {201}
    assert len({text for _, text in replies}) == 1
    assert len(api.ledger()) == 1 and api.budget()["loss"]["epsilon"] == 0.1
