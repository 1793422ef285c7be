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
#: The service's lock and database timeouts here are 1 s each: a request's deadline is 3 s.
DEADLINE_S = 3.0
FREEZES = 10
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


def _settle(charge: Any, keys: list[str]) -> None:
    """Once the database runs again, the same requests succeed without a restart (a 503
    while the pools replace their connections is retried with the same key)."""
    after = _in_parallel([charge(key) for key in keys])
    retried = [
        charge(key)() if r.status_code == 503 else r for key, r in zip(keys, after, strict=True)
    ]
    assert [r.status_code for r in retried] == [201] * len(keys)


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
            worst_503 = worst_health = 0.0
            for freeze in range(FREEZES):
                keys = [f"during-{freeze}-{n}" for n in range(12)]
                server.signal_all(signal.SIGSTOP)
                try:
                    during = _in_parallel(
                        [charge(key) for key in keys]
                        + [
                            lambda: requests.get(f"{service.base}/readyz", timeout=60),
                            lambda: requests.get(f"{service.base}/metrics", timeout=60),
                            lambda: requests.get(f"{service.base}/healthz", timeout=60),
                        ]
                    )
                    still_frozen = _stopped(server.postmaster())
                finally:
                    server.signal_all(signal.SIGCONT)
                assert still_frozen  # every answer came while the database was frozen
                *charges, ready, metrics, health = during
                assert [getattr(r, "status_code", r) for r in charges] == [503] * len(keys)
                assert all(
                    r.headers["Content-Type"] == "application/problem+json"
                    and "Retry-After" in r.headers
                    for r in charges
                )
                assert ready.status_code == 503 and health.status_code == 200
                # a scrape still answers, saying the database is down
                assert metrics.status_code == 200, metrics.text
                assert "\naccountant_database_up 0\n" in metrics.text
                assert "accountant_charge_duration_seconds" in metrics.text  # its own
                # one deadline for each request, its wait for a thread included, and
                # liveness answered without waiting for the database at all
                slowest = max(r.elapsed.total_seconds() for r in [*charges, ready, metrics])
                assert slowest < DEADLINE_S + 1, [
                    round(r.elapsed.total_seconds(), 2) for r in during
                ]
                assert health.elapsed.total_seconds() < min(
                    r.elapsed.total_seconds() for r in charges
                )
                worst_503 = max(worst_503, slowest)
                worst_health = max(worst_health, health.elapsed.total_seconds())
                _settle(charge, keys)
            print(
                f"{FREEZES} freezes, deadline {DEADLINE_S:g} s: worst 503 after "
                f"{worst_503:.2f} s, worst /healthz {worst_health * 1000:.1f} ms"
            )
            ledger = http.get(
                f"{service.base}/v1/ledger",
                headers=HEADERS,
                params={"dataset": "frozen", "limit": "1000"},
            ).json()
            assert len(ledger["entries"]) == 1 + 12 * FREEZES  # each charged once
            assert (
                http.get(f"{service.base}/v1/ledger/verify", headers=HEADERS).json()["ok"] is True
            )
            assert requests.get(f"{service.base}/readyz", timeout=60).status_code == 200
