"""Two independent service instances, as two hosts would be, on one database."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.conftest import ADMIN_KEY, Api
from tests.server import running_service

BIN = Path(sys.executable).parent / "accountant"
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.mark.slow
def test_two_instances_never_overspend_and_keep_one_chain(
    api: Api, database_url: str, signing_key_file: str, tmp_path: Path
) -> None:
    api.make_dataset(
        "shared",
        privacy_unit="user",
        max_partitions_per_user=2,
        budget={"epsilon": 3},
        partition_budget={"epsilon": 1},
        windows=[{"period": "1d", "epsilon": 2.5}],
    )
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_LOG_LEVEL": "ERROR",
    }
    results: list[int] = []
    partition_sets = [["a"], ["a", "b"], ["b", "c"], ["c"], ["a", "c"]]

    def client(base: str, number: int) -> None:
        session = requests.Session()
        for index in range(30):
            keys = partition_sets[(number + index) % len(partition_sets)]
            reply = session.post(
                f"{base}/v1/charges",
                headers=HEADERS,
                timeout=30,
                json={
                    "dataset": "shared",
                    "partitions": keys,
                    "release": "parallel",
                    "mechanism": "laplace",
                    "params": {"epsilon": 0.05, "sensitivity": 1},
                    "input": {"values": [1.0] * len(keys)},
                },
            )
            results.append(reply.status_code)

    with (
        running_service(env, tmp_path / "host0.log", "--workers", "2") as first,
        running_service(env, tmp_path / "host1.log", "--workers", "2") as second,
    ):
        bases = [first.base, second.base]
        threads = [threading.Thread(target=client, args=(bases[n % 2], n)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert len(results) == 240 and set(results) <= {201, 409, 429}
    assert results.count(201) > 0 and results.count(409) > 0
    budget = api.budget("shared")
    assert budget["loss"]["epsilon"] <= 3
    assert budget["windows"][0]["loss"]["epsilon"] <= 2.5
    spent = {
        p["key"]: p["spent"]["epsilon"]
        for p in api.get("/v1/datasets/shared/partitions").get_json()["partitions"]
    }
    assert max(spent.values()) <= 1.0
    entries = api.ledger(dataset="shared")
    assert len(entries) == 240
    assert [e["seq"] for e in entries] == list(range(1, 241))
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(entries))
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    check = subprocess.run(
        [BIN, "ledger", "rebuild-totals", "--check"], env=env, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
