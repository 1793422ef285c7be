"""A PostgreSQL failover under load: the primary is killed (SIGKILL, every server process)
while clients charge, its synchronous standby is promoted, and the service, given both hosts
in one connection string with ``target_session_attrs=read-write``, carries on by itself.

Every charge a client saw acknowledged is on the new primary; charges caught by the failover
get a 503 and succeed when retried with the same Idempotency-Key, charged once; the ledger
verifies."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine, text

from accountant.migrate import upgrade
from tests.conftest import ADMIN_KEY
from tests.pg_cluster import clusters, postgres_bin
from tests.server import running_service

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(postgres_bin() is None, reason="needs PostgreSQL's server programs"),
]
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


class Clients:
    """Clients charging with fresh keys; a key is retried until it is answered 201."""

    def __init__(self, base: str, count: int) -> None:
        self.base = base
        self.stop = threading.Event()
        self.acknowledged: dict[str, str] = {}  # key -> charge id
        self.retries = 0
        self.statuses: set[int] = set()
        self.threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, number: int) -> None:
        http = requests.Session()
        index = 0
        while not self.stop.is_set():
            key = f"c{number}-{index}"
            try:
                reply = http.post(
                    f"{self.base}/v1/charges",
                    timeout=60,
                    headers={**HEADERS, "Idempotency-Key": key},
                    json={
                        "dataset": "orders",
                        "partitions": [f"p{index % 5}"],
                        "mechanism": "laplace",
                        "params": {"epsilon": 0.001, "sensitivity": 1},
                        "input": {"values": [1.0]},
                    },
                )
            except requests.ConnectionError:
                reply = None
            status = reply.status_code if reply is not None else 0
            self.statuses.add(status)
            if status == 201 and reply is not None:
                self.acknowledged[key] = reply.json()["charge_id"]
                index += 1
            else:  # the same key again, as API.md tells a client to do after a 503
                self.retries += 1
                time.sleep(0.05)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def _wait_until(condition: Callable[[], bool], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the clients stopped getting charges through"
        time.sleep(0.05)


def test_a_failover_to_the_synchronous_standby_loses_no_acknowledged_charge(tmp_path: Path) -> None:
    with clusters(standby=True) as [primary, standby]:
        url = (
            f"postgresql+psycopg://postgres@/postgres?host=127.0.0.1:{primary.port}"
            f"&host=127.0.0.1:{standby.port}&target_session_attrs=read-write"
        )
        upgrade(url)
        env = {
            **os.environ,
            "ACCOUNTANT_DATABASE_URL": url,
            "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
            "ACCOUNTANT_SIGNING_KEY_FILE": str(tmp_path / "signing.pem"),
            "ACCOUNTANT_LOCK_TIMEOUT_MS": "2000",
            "ACCOUNTANT_DATABASE_TIMEOUT_MS": "2000",
        }
        with running_service(
            env, tmp_path / "serve.log", "--workers", "2", "--threads", "4"
        ) as service:
            created = requests.post(
                f"{service.base}/v1/datasets",
                headers=HEADERS,
                json={
                    "name": "orders",
                    "privacy_unit": "record",
                    "accounting": "pure",
                    "budget": {"epsilon": 100_000},
                },
            )
            assert created.status_code == 201, created.text
            clients = Clients(service.base, 6)
            try:
                _wait_until(lambda: len(clients.acknowledged) >= 100)
                primary.kill()
                before_failover = dict(clients.acknowledged)
                time.sleep(1.0)  # charges meanwhile find no writable server: 503
                standby.promote()
                promoted = len(clients.acknowledged)
                _wait_until(lambda: len(clients.acknowledged) >= promoted + 100)
            finally:
                clients.finish()
            verify = requests.get(
                f"{service.base}/v1/ledger/verify", headers=HEADERS, timeout=60
            ).json()
        engine = create_engine(standby.url)
        with engine.connect() as connection:
            ledgered = set(
                connection.execute(
                    text("SELECT charge_id FROM ledger_entries WHERE status = 'granted'")
                ).scalars()
            )
        engine.dispose()
    acknowledged = set(clients.acknowledged.values())
    assert set(before_failover.values()) <= ledgered
    assert acknowledged - ledgered == set(), f"{len(acknowledged - ledgered)} charges lost"
    assert len(ledgered) == len(acknowledged)  # every retried key charged once
    assert clients.retries > 0 and clients.statuses <= {201, 503}
    assert verify["ok"] is True
    print(
        f"failover: {len(before_failover)} acknowledged before, {len(acknowledged)} in all, "
        f"0 lost, {clients.retries} retries"
    )
