"""Draws on one hold from four processes at once: the hold's remainder is decided under its
dataset's lock, so exactly as many draws as fit are granted, across processes and hosts."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest

from tests.conftest import ADMIN_KEY, POOLED_BACKENDS, Api

PROCESSES = 4
THREADS = 4
DRAWS = 3  # per client: 48 draws of 0.1 on a hold of 1.0


def _draw_many(
    database_url: str, signing_key_file: str, hold_id: str, start: Any, out: Any
) -> None:
    from accountant.app import prepared_app

    app = prepared_app({"database_url": database_url, "signing_key_file": signing_key_file})
    codes: list[int] = []
    body = {
        "dataset": "clicks",
        "partitions": ["p1"],
        "mechanism": "laplace",
        "params": {"epsilon": 0.1, "sensitivity": 1},
        "input": {"values": [1.0]},
        "hold": hold_id,
    }

    def client() -> None:
        api = Api(app.test_client(), ADMIN_KEY)
        for _ in range(DRAWS):
            codes.append(api.post("/v1/charges", body).status_code)

    threads = [threading.Thread(target=client) for _ in range(THREADS)]
    start.wait(timeout=120)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    out.put(codes)


@pytest.mark.slow
@pytest.mark.parametrize("database_url", POOLED_BACKENDS, indirect=True)
def test_draws_from_many_processes_never_take_a_hold_below_zero(
    api: Api, database_url: str, signing_key_file: str
) -> None:
    api.make_dataset(budget={"epsilon": 10})
    hold = {"dataset": "clicks", "partitions": ["p1"], "amount": {"epsilon": 1.0}}
    hold_id = api.post("/v1/holds", {**hold, "expires_in": 600}).get_json()["hold_id"]
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = context.Barrier(PROCESSES)
    workers = [
        context.Process(
            target=_draw_many, args=(database_url, signing_key_file, hold_id, start, out)
        )
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    codes = [code for _ in workers for code in out.get(timeout=300)]
    for worker in workers:
        worker.join(timeout=60)
    assert codes.count(201) == 10 and codes.count(409) == PROCESSES * THREADS * DRAWS - 10
    shown = api.get(f"/v1/holds/{hold_id}").get_json()
    assert shown["drawn"]["epsilon"] == 1.0
    draws = [e for e in api.ledger() if e["kind"] == "charge" and e["status"] == "granted"]
    assert len(draws) == 10
