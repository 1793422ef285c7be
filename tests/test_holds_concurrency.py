"""Holds under concurrency: 16 clients in 4 processes mixing holds, draws, settles, releases
and plain charges on one dataset never take a scope above its limit, never draw a hold below
zero or settle it twice, and leave a ledger that reconciles exactly."""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections import Counter
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from accountant.services import totals
from tests.conftest import ADMIN_KEY, FROZEN_AT_US, POOLED_BACKENDS, Api

PROCESSES = 4
THREADS = 4  # clients per process: 16 in all
ROUNDS = 12  # per client


def _client(api: Api, seed: int, outcomes: list[tuple[str, int]]) -> None:
    """One client's mix: plain charges, and holds that it draws on, then settles, releases
    or leaves open."""
    rng = random.Random(seed)
    for _ in range(ROUNDS):
        keys = rng.choice([["hot"], ["hot", "a"], ["b"], ["a", "b"]])
        if rng.random() < 0.4:
            code = api.charge(dataset="shared", partitions=keys, epsilon=0.1).status_code
            outcomes.append(("charge", code))
            continue
        made = api.post(
            "/v1/holds",
            {
                "dataset": "shared",
                "partitions": keys,
                "amount": {"epsilon": 0.3},
                "expires_in": 600,
            },
        )
        outcomes.append(("hold", made.status_code))
        if made.status_code != 201:
            continue
        hold_id = made.get_json()["hold_id"]
        draws = 0
        for _ in range(rng.randint(0, 4)):  # the fourth never fits 0.3
            code = api.charge(
                dataset="shared", partitions=keys, epsilon=0.1, hold=hold_id
            ).status_code
            outcomes.append(("draw", code))
            draws += code == 201
        end = rng.choice(["settle", "release", "open"])
        if end == "settle":
            used = round(0.1 * draws + rng.choice([0, 0.05, 0.1]), 2)
            code = api.post(
                f"/v1/holds/{hold_id}/settle", {"used": {"epsilon": min(used, 0.3)}}
            ).status_code
            outcomes.append(("settle", code))
        elif end == "release":
            outcomes.append(("release", api.post(f"/v1/holds/{hold_id}/release").status_code))


def _process(
    database_url: str, signing_key_file: str, index: int, start: Any, results: Any
) -> None:
    from accountant.app import prepared_app
    from accountant.clock import FrozenClock

    app = prepared_app(
        {"database_url": database_url, "signing_key_file": signing_key_file},
        clock=FrozenClock(FROZEN_AT_US),
    )
    outcomes: list[tuple[str, int]] = []
    start.wait(timeout=120)
    threads = [
        threading.Thread(
            target=_client,
            args=(Api(app.test_client(), ADMIN_KEY), index * THREADS + n, outcomes),
        )
        for n in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    results.put(outcomes)


@pytest.mark.slow
@pytest.mark.frozen_clock
@pytest.mark.parametrize("database_url", POOLED_BACKENDS, indirect=True)
def test_sixteen_clients_mixing_holds_and_charges_stay_within_every_limit(
    api: Api, database_url: str, signing_key_file: str
) -> None:
    api.make_dataset(
        "shared",
        budget={"epsilon": 10},
        partition_budget={"epsilon": 8},
        windows=[{"period": "1d", "epsilon": 9}],
    )
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    start = context.Barrier(PROCESSES)
    workers = [
        context.Process(
            target=_process, args=(database_url, signing_key_file, index, start, results)
        )
        for index in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    outcomes = [outcome for _ in workers for outcome in results.get(timeout=600)]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    print("outcomes:", sorted(Counter(outcomes).items()))  # for the record, with -s
    kinds = {kind for kind, _ in outcomes}
    assert kinds >= {"charge", "hold", "draw"}
    assert {code for _, code in outcomes} <= {200, 201, 409, 429}
    assert any(code in (409, 429) for kind, code in outcomes if kind in ("charge", "hold"))
    # every scope within its limit
    budget = api.budget("shared")
    assert budget["loss"]["epsilon"] <= 10
    assert budget["partitions"]["max_spent"]["epsilon"] <= 8
    assert budget["windows"][0]["loss"]["epsilon"] <= 9
    # every hold drawn within its amount and settled once, at no less than it drew
    for hold in api.get("/v1/holds?dataset=shared").get_json()["holds"]:
        assert hold["drawn"]["epsilon"] <= hold["amount"]["epsilon"]
        if hold["state"] == "settled":
            assert hold["drawn"]["epsilon"] <= hold["used"]["epsilon"]
    settles = [e for e in api.ledger(dataset="shared") if e["kind"] == "settle"]
    assert len(settles) == len({e["hold_id"] for e in settles})
    # the ledger's chain holds and replays to exactly the running totals
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    engine = create_engine(database_url, poolclass=NullPool)
    with Session(engine) as session:
        replayed, differences = totals.check(session)
    engine.dispose()
    assert differences == [] and replayed > 0


def _race(app: Flask, calls: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Send ``calls`` (path, body) from as many threads at once, each with a client of its
    own; their statuses."""
    barrier = threading.Barrier(len(calls))
    codes: list[int] = [0] * len(calls)

    def send(index: int) -> None:
        path, body = calls[index]
        client = Api(app.test_client(), ADMIN_KEY)
        barrier.wait(timeout=30)
        codes[index] = client.post(path, body).status_code

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return codes


def test_racing_draws_never_take_a_hold_below_zero(api: Api, app: Flask) -> None:
    api.make_dataset(budget={"epsilon": 10})
    hold = {"dataset": "clicks", "partitions": ["p1"], "amount": {"epsilon": 0.5}}
    hold_id = api.post("/v1/holds", {**hold, "expires_in": 600}).get_json()["hold_id"]
    draw = {
        "dataset": "clicks",
        "partitions": ["p1"],
        "mechanism": "laplace",
        "params": {"epsilon": 0.1, "sensitivity": 1},
        "input": {"values": [1.0]},
        "hold": hold_id,
    }
    codes = _race(app, [("/v1/charges", draw)] * 12)
    assert codes.count(201) == 5 and codes.count(409) == 7
    assert api.get(f"/v1/holds/{hold_id}").get_json()["drawn"]["epsilon"] == 0.5


def test_racing_settles_and_releases_end_a_hold_once(api: Api, app: Flask) -> None:
    api.make_dataset(budget={"epsilon": 10})
    hold = {"dataset": "clicks", "partitions": ["p1"], "amount": {"epsilon": 0.5}}
    hold_id = api.post("/v1/holds", {**hold, "expires_in": 600}).get_json()["hold_id"]
    settle = (f"/v1/holds/{hold_id}/settle", {"used": {"epsilon": 0.1}})
    release: tuple[str, dict[str, Any]] = (f"/v1/holds/{hold_id}/release", {})
    codes = _race(app, [settle, release] * 5)
    assert codes.count(200) == 1 and codes.count(409) == 9
    returned = [e for e in api.ledger() if e["kind"] == "settle"]
    assert len(returned) == 1
    assert api.budget()["loss"]["epsilon"] in (0.1, 0.0)
