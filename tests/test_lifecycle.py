"""Process lifecycle under `accountant serve`: a master killed while workers charge loses no
acknowledged charge, and a worker that exits never breaks the others."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import ADMIN_KEY, Api, run_sql
from tests.server import children, running_service

HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _charging(
    base: str, clients: int, seen: list[tuple[int, str | None]], stop: threading.Event
) -> list[threading.Thread]:
    """Clients charging "life" with fresh keys until ``stop`` or the server is gone."""

    def client(number: int) -> None:
        session = requests.Session()
        index = 0
        failures = 0
        while not stop.is_set() and failures < 20:
            try:
                reply = session.post(
                    f"{base}/v1/charges",
                    headers={**HEADERS, "Idempotency-Key": f"c{number}-{index}"},
                    timeout=10,
                    json={
                        "dataset": "life",
                        "partitions": [f"p{index % 5}"],
                        "mechanism": "laplace",
                        "params": {"epsilon": 0.001, "sensitivity": 1},
                        "input": {"values": [1.0]},
                    },
                )
            except requests.RequestException:
                failures += 1
                time.sleep(0.05)
                continue
            body = reply.json() if reply.headers.get("content-type", "").endswith("json") else {}
            seen.append((reply.status_code, body.get("charge_id")))
            index += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    return threads


def _alive(pid: str) -> bool:
    return (
        Path(f"/proc/{pid}").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    )


@pytest.mark.slow
@pytest.mark.parametrize("admin_key", [True, False], ids=["admin-key", "no-admin-key"])
def test_a_killed_master_loses_no_acknowledged_charge(
    api: Api, database_url: str, signing_key_file: str, tmp_path: Path, admin_key: bool
) -> None:
    api.make_dataset("life", budget={"epsilon": 100_000})
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
    }
    if admin_key:
        env["ACCOUNTANT_ADMIN_KEY"] = ADMIN_KEY
    seen: list[tuple[int, str | None]] = []
    stop = threading.Event()
    with running_service(env, tmp_path / "serve.log", "--workers", "4", "--threads", "4") as server:
        threads = _charging(server.base, 8, seen, stop)
        time.sleep(1.5)
        workers = children(server.process.pid)
        assert workers
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        orphans = [pid for pid in workers if _alive(pid)]
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert orphans == [], "workers outlived their master by 15 s"
    acknowledged = {charge_id for status, charge_id in seen if status == 201}
    assert len(acknowledged) > 20 and {status for status, _ in seen} == {201}
    ledgered = {
        row[0]
        for row in run_sql(
            database_url, "SELECT charge_id FROM ledger_entries WHERE status = 'granted'"
        )
    }
    assert acknowledged - ledgered == set(), f"{len(acknowledged - ledgered)} charges lost"
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True


@pytest.mark.slow
@pytest.mark.parametrize("admin_key", [True, False], ids=["admin-key", "no-admin-key"])
def test_the_master_holds_no_database_file_open(
    api: Api, database_url: str, signing_key_file: str, tmp_path: Path, admin_key: bool
) -> None:
    """The root of the lost charges: a SQLite connection open in the master is inherited by
    every worker (file descriptors and SQLite's in-memory lock state), so the workers' own
    locks are not what SQLite believes, and the WAL can be checkpointed away and deleted while
    a worker still commits to it. The master must hold no database file at all."""
    if not database_url.startswith("sqlite"):
        pytest.skip("a SQLite file's descriptors")
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
    }
    if admin_key:
        env["ACCOUNTANT_ADMIN_KEY"] = ADMIN_KEY
    database = database_url.removeprefix("sqlite:///")
    with running_service(env, tmp_path / "serve.log", "--workers", "2") as server:
        assert requests.get(f"{server.base}/readyz", timeout=10).status_code == 200
        held = [
            os.readlink(fd)
            for fd in Path(f"/proc/{server.process.pid}/fd").iterdir()
            if os.path.exists(fd)
        ]
    assert [name for name in held if name.startswith(database)] == []


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTTOU", "SIGHUP"])
def test_a_worker_leaving_breaks_nothing(
    api: Api, database_url: str, signing_key_file: str, tmp_path: Path, signal_name: str
) -> None:
    """SIGTTOU retires a worker and SIGHUP replaces them all: the exiting workers must not take
    the shared metrics folder with them (every later charge answered 500)."""
    api.make_dataset("life", budget={"epsilon": 100_000})
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
    }
    seen: list[tuple[int, str | None]] = []
    stop = threading.Event()
    with running_service(env, tmp_path / "serve.log", "--workers", "3", "--threads", "2") as server:
        threads = _charging(server.base, 4, seen, stop)
        time.sleep(1.0)
        os.kill(server.process.pid, getattr(signal, signal_name))
        time.sleep(3.0)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        after = requests.post(
            f"{server.base}/v1/charges",
            headers=HEADERS,
            timeout=10,
            json={
                "dataset": "life",
                "partitions": ["x"],
                "mechanism": "laplace",
                "params": {"epsilon": 0.001, "sensitivity": 1},
                "input": {"values": [1.0]},
            },
        )
        metrics = requests.get(f"{server.base}/metrics", timeout=10)
    statuses: dict[int, int] = {}
    for status, _ in seen:
        statuses[status] = statuses.get(status, 0) + 1
    assert set(statuses) == {201}, statuses
    assert after.status_code == 201
    assert metrics.status_code == 200 and b"accountant_charge_duration_seconds" in metrics.content


def test_metrics_failures_never_fail_a_charge(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from accountant import app as app_module

    class Broken:
        def labels(self, *_: Any) -> Any:
            raise OSError("the metrics folder is gone")

    monkeypatch.setattr(app_module, "CHARGE_SECONDS", Broken())
    api.make_dataset("life")
    assert api.charge(dataset="life").status_code == 201
