"""Several processes charging one SQLite file at once never overspend any scope."""

from __future__ import annotations

import itertools
import multiprocessing
from typing import Any

import pytest

from tests.conftest import ADMIN_KEY, FROZEN_AT_US, POOLED_BACKENDS, Api, run_sql

WORKERS = 4
ATTEMPTS = 40  # per worker: 160 attempts against room for exactly 50


def _charge_many(
    database_url: str,
    signing_key_file: str,
    dataset: str,
    partitions: list[list[str]],
    start: Any,
    results: Any,
) -> None:
    from accountant.app import prepared_app
    from accountant.clock import FrozenClock

    # the same key folder as the test's app, so the same noise secret (one per database),
    # and the same moment as its clock (``frozen_clock``), so the same day window
    app = prepared_app(
        {"database_url": database_url, "signing_key_file": signing_key_file},
        clock=FrozenClock(FROZEN_AT_US),
    )
    client = Api(app.test_client(), ADMIN_KEY)
    start.wait(timeout=120)  # every process starts charging at the same moment
    codes = []
    for attempt in range(ATTEMPTS):
        keys = partitions[attempt % len(partitions)]
        codes.append(
            client.charge(
                dataset=dataset,
                partitions=keys,
                epsilon=0.1,
                release="parallel",
                input={"values": [1.0] * len(keys)},
            ).status_code
        )
    results.put(codes)


@pytest.mark.slow
@pytest.mark.frozen_clock
@pytest.mark.parametrize("database_url", POOLED_BACKENDS, indirect=True)
def test_processes_grant_exactly_what_the_budget_allows(
    api: Api, database_url: str, signing_key_file: str
) -> None:
    # record unit, lifetime 5.0, window 1d 5.0: each partition fits 50 charges of 0.1.
    # Every attempt touches partition "hot", so exactly 50 may be granted in all.
    api.make_dataset("shared", budget={"epsilon": 5}, windows=[{"period": "1d", "epsilon": 5}])
    partition_sets = [["hot", "a"], ["b", "hot"], ["hot"], ["c", "hot", "a"]]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    start = context.Barrier(WORKERS)
    workers = [
        context.Process(
            target=_charge_many,
            args=(database_url, signing_key_file, "shared", partition_sets, start, results),
        )
        for _ in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    codes = [code for _ in workers for code in results.get(timeout=300)]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert sorted(set(codes)) == [201, 409]
    assert codes.count(201) == 50
    budget = api.budget("shared")
    assert budget["loss"]["epsilon"] == 5.0
    assert budget["windows"][0]["loss"]["epsilon"] == 5.0
    entries = api.ledger(dataset="shared")
    assert len(entries) == WORKERS * ATTEMPTS
    assert sum(e["status"] == "granted" for e in entries) == 50
    # The chain is linear: seq 1..n, each entry pointing at the previous hash.
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(entries))
    # The running totals equal the granted ledger entries, partition by partition.
    hot = run_sql(
        database_url,
        "SELECT s.epsilon FROM tally_spends s JOIN tallies t ON t.id = s.tally_id "
        "JOIN partitions p ON p.id = s.partition_id "
        "WHERE t.kind = 'lifetime' AND p.key = 'hot'",
    )[0][0]
    assert hot == 50 * 100_000_000
