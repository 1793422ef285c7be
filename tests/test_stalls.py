"""A PostgreSQL server that stops answering (every process frozen with SIGSTOP): requests end
with a 503 problem+json while it is still frozen, /healthz keeps answering, and once it runs
again the same requests succeed without a restart, each charged once."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from accountant.migrate import upgrade
from tests.conftest import ADMIN_KEY
from tests.pg_cluster import clusters, postgres_bin
from tests.server import running_service

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(postgres_bin() is None, reason="needs PostgreSQL's server programs"),
]
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHARGE: dict[str, Any] = {
    "dataset": "frozen",
    "partitions": ["p1"],
    "mechanism": "laplace",
    "params": {"epsilon": 0.01, "sensitivity": 1},
    "input": {"values": [1.0]},
}


def _stopped(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    return any(line.startswith("State:") and "T" in line.split()[1] for line in status.splitlines())


def _in_parallel(calls: list[Any]) -> list[Any]:
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except requests.RequestException as error:  # a hang shows here, as a timeout
            results[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_a_frozen_database_is_a_503_within_the_timeout_and_healthz_stays_up(tmp_path: Path) -> None:
    with clusters() as [server]:
        upgrade(server.url)
        env = {
            **os.environ,
            "ACCOUNTANT_DATABASE_URL": server.url,
            "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
            "ACCOUNTANT_SIGNING_KEY_FILE": str(tmp_path / "signing.pem"),
            "ACCOUNTANT_LOCK_TIMEOUT_MS": "1000",
            "ACCOUNTANT_DATABASE_TIMEOUT_MS": "1000",
        }
        with running_service(
            env, tmp_path / "serve.log", "--workers", "2", "--threads", "4"
        ) as service:
            http = requests.Session()
            created = http.post(
                f"{service.base}/v1/datasets",
                headers=HEADERS,
                json={
                    "name": "frozen",
                    "privacy_unit": "record",
                    "accounting": "pure",
                    "budget": {"epsilon": 10},
                },
            )
            assert created.status_code == 201, created.text

            def charge(key: str) -> Any:
                return lambda: requests.post(
                    f"{service.base}/v1/charges",
                    json=CHARGE,
                    headers={**HEADERS, "Idempotency-Key": key},
                    timeout=60,
                )

            assert charge("before")().status_code == 201  # the pools hold connections now
            keys = [f"during-{n}" for n in range(12)]
            server.signal_all(signal.SIGSTOP)
            try:
                during = _in_parallel(
                    [charge(key) for key in keys]
                    + [
                        lambda: requests.get(f"{service.base}/readyz", timeout=60),
                        lambda: requests.get(f"{service.base}/healthz", timeout=60),
                    ]
                )
                still_frozen = _stopped(server.postmaster())
            finally:
                server.signal_all(signal.SIGCONT)
            assert still_frozen  # every answer came while the database was frozen
            *charges, ready, health = during
            assert [getattr(r, "status_code", r) for r in charges] == [503] * len(keys)
            assert all(
                r.headers["Content-Type"] == "application/problem+json"
                and "Retry-After" in r.headers
                for r in charges
            )
            assert ready.status_code == 503 and health.status_code == 200

            after = _in_parallel([charge(key) for key in keys])
            retried = [
                charge(key)() if r.status_code == 503 else r
                for key, r in zip(keys, after, strict=True)
            ]
            assert [r.status_code for r in retried] == [201] * len(keys)
            ledger = http.get(
                f"{service.base}/v1/ledger",
                headers=HEADERS,
                params={"dataset": "frozen", "limit": "100"},
            ).json()
            assert len(ledger["entries"]) == 1 + len(keys)  # each charged once
            assert (
                http.get(f"{service.base}/v1/ledger/verify", headers=HEADERS).json()["ok"] is True
            )
            assert requests.get(f"{service.base}/readyz", timeout=60).status_code == 200
