"""Batches and single charges racing over overlapping datasets from four processes at once
(16 clients): every dataset is locked in name order, so none deadlocks, and every scope
ends within its limit with exactly what was granted in it."""

from __future__ import annotations

import multiprocessing
import threading
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import ADMIN_KEY, POOLED_BACKENDS, Api

PROCESSES = 4
THREADS = 4
ROUNDS = 4  # per client: a batch one way, a batch the other way, and two charges
DATASETS = ("alpha", "beta", "gamma")


def _item(dataset: str, epsilon: str) -> dict[str, Any]:
    return {
        "dataset": dataset,
        "partitions": ["p1"],
        "mechanism": "laplace",
        "params": {"epsilon": float(epsilon), "sensitivity": 1},
        "input": {"values": [1.0]},
    }


#: What each client sends, in turn: batches naming the datasets in opposite orders, and
#: single charges on one of them.
PLANS: list[list[dict[str, Any]]] = [
    [_item("alpha", "0.1"), _item("beta", "0.1"), _item("alpha", "0.05")],
    [_item("beta", "0.1"), _item("gamma", "0.05"), _item("alpha", "0.1")],
    [_item("gamma", "0.1"), _item("alpha", "0.1")],
    [_item("beta", "0.15")],
]


def _race(database_url: str, signing_key_file: str, start: Any, out: Any) -> None:
    from accountant.app import prepared_app

    app = prepared_app({"database_url": database_url, "signing_key_file": signing_key_file})
    results: list[tuple[int, dict[str, Decimal]]] = []

    def client(offset: int) -> None:
        api = Api(app.test_client(), ADMIN_KEY)
        for r in range(ROUNDS):
            items = PLANS[(offset + r) % len(PLANS)]
            if len(items) == 1:
                response = api.post("/v1/charges", items[0])
                granted = {items[0]["dataset"]: Decimal(str(items[0]["params"]["epsilon"]))}
            else:
                response = api.post("/v1/charges/batch", {"items": items})
                granted = {}
                for item in items:
                    name = item["dataset"]
                    epsilon = Decimal(str(item["params"]["epsilon"]))
                    granted[name] = granted.get(name, Decimal(0)) + epsilon
            results.append((response.status_code, granted))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
    start.wait(timeout=120)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    out.put([(code, {k: str(v) for k, v in granted.items()}) for code, granted in results])


#: With populations: each dataset's population, and the populations' limits. Their names
#: sort against their datasets' (alpha in "west", beta in "east"), so that locking a
#: dataset before its population would deadlock against a batch.
MEMBERS = {"alpha": "west", "beta": "east", "gamma": "west"}
POPULATION_LIMITS = {"west": Decimal("1.8"), "east": Decimal("1.2")}


@pytest.mark.slow
@pytest.mark.parametrize("populations", [False, True], ids=["datasets", "populations"])
@pytest.mark.parametrize("database_url", POOLED_BACKENDS, indirect=True)
def test_batches_and_charges_racing_never_overspend_or_deadlock(
    api: Api, database_url: str, signing_key_file: str, populations: bool
) -> None:
    limits = {"alpha": Decimal("2.0"), "beta": Decimal("1.5"), "gamma": Decimal("1.0")}
    if populations:
        for name, limit in POPULATION_LIMITS.items():
            body = {"name": name, "privacy_unit": "user", "accounting": "pure"}
            created = api.post("/v1/populations", {**body, "budget": {"epsilon": float(limit)}})
            assert created.status_code == 201, created.get_json()
    for name, limit in limits.items():
        member = {"privacy_unit": "user", "population": MEMBERS[name]} if populations else {}
        api.make_dataset(name, budget={"epsilon": float(limit)}, **member)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = context.Barrier(PROCESSES)
    workers = [
        context.Process(target=_race, args=(database_url, signing_key_file, start, out))
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    results = [result for _ in workers for result in out.get(timeout=300)]
    for worker in workers:
        worker.join(timeout=60)
    codes = [code for code, _ in results]
    assert set(codes) <= {201, 409}, codes  # no deadlock, no timeout, no error
    assert len(codes) == PROCESSES * THREADS * ROUNDS
    spent = dict.fromkeys(DATASETS, Decimal(0))
    for code, granted in results:
        if code == 201:
            for name, epsilon in granted.items():
                spent[name] += Decimal(epsilon)
    for name in DATASETS:
        loss = Decimal(str(api.budget(name)["loss"]["epsilon"]))
        assert loss == spent[name] <= limits[name], (name, loss, spent[name])
    if populations:
        for name, limit in POPULATION_LIMITS.items():
            budget = api.get(f"/v1/populations/{name}/budget").get_json()
            members = [d for d, population in MEMBERS.items() if population == name]
            loss = Decimal(str(budget["loss"]["epsilon"]))
            assert loss == sum(spent[d] for d in members) <= limit, (name, loss)
    assert 0 < codes.count(201) < len(codes)  # the budgets grant some and refuse others
    print(f"granted {codes.count(201)}, refused {codes.count(409)}; spent {spent}")
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
