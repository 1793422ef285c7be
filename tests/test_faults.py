"""Faults: a worker killed mid-stream, and a database that goes away and comes back."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import text

from tests.conftest import ADMIN_KEY, POSTGRES_URL, Api
from tests.server import children, running_service

BIN = Path(sys.executable).parent / "accountant"
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.mark.slow
def test_a_worker_killed_mid_stream_loses_nothing(
    api: Api, database_url: str, signing_key_file: str, tmp_path: Path
) -> None:
    api.make_dataset("stream", budget={"epsilon": 1000})
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
    }
    seen: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def client(base: str, number: int) -> None:
        session = requests.Session()
        index, retrying = 0, False
        # a request cut off by the kill is retried until answered, even after the stop:
        # its charge may be committed, and only the retry shows it to the client
        while (retrying or not stop.is_set()) and index < 400:
            key = f"c{number}-{index}"
            try:
                reply = session.post(
                    f"{base}/v1/charges",
                    headers={**HEADERS, "Idempotency-Key": key},
                    timeout=10,
                    json={
                        "dataset": "stream",
                        "partitions": [f"p{index % 7}"],
                        "mechanism": "laplace",
                        "params": {"epsilon": 0.01, "sensitivity": 1},
                        "input": {"values": [1.0]},
                    },
                )
            except requests.RequestException:
                # the worker died under us (no answer, or an answer cut off mid-body):
                # retry with the same key
                retrying = True
                continue
            retrying = False
            seen.append((reply.status_code, reply.json().get("charge_id")))
            index += 1

    with running_service(env, tmp_path / "serve.log", "--workers", "2", "--threads", "2") as server:
        threads = [threading.Thread(target=client, args=(server.base, n)) for n in range(4)]
        for thread in threads:
            thread.start()
        _wait_for(lambda: len(seen) >= 40)  # charging under way
        victims = children(server.process.pid)
        assert victims
        os.kill(int(victims[0]), signal.SIGKILL)
        answered = len(seen)
        _wait_for(lambda: len(seen) >= answered + 40)  # and going on after the kill
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    granted = {charge_id for status, charge_id in seen if status == 201}
    assert granted and {status for status, _ in seen} == {201}
    ledger = {entry["charge_id"] for entry in api.ledger(dataset="stream")}
    assert granted <= ledger
    assert len(ledger) == len(granted)  # retries with the same key never charged twice
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    check = subprocess.run(
        [BIN, "ledger", "rebuild-totals", "--check"], env=env, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


class _Proxy:
    """A TCP relay to the database server that the test can cut and restore."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def cut(self) -> None:
        self.open = False
        for connection in self.sockets:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()
        self.sockets.clear()

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.mark.skipif(POSTGRES_URL is None, reason="needs a PostgreSQL server to cut off")
def test_a_lost_database_is_a_503_and_recovery_needs_no_restart(
    database_url: str, signing_key_file: str
) -> None:
    from sqlalchemy.engine import make_url

    from accountant.app import prepared_app

    if not database_url.startswith("postgresql"):
        pytest.skip("the database is cut at the network; SQLite has none")
    url = make_url(database_url)
    proxy = _Proxy((url.host or "127.0.0.1", url.port or 5432))
    try:
        proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
        app = prepared_app(
            {
                "database_url": proxied,
                "admin_key": ADMIN_KEY,
                "signing_key_file": signing_key_file,
                "lock_timeout_ms": 2000,
            }
        )
        api = Api(app.test_client())
        api.make_dataset(budget={"epsilon": 1})
        assert api.charge(epsilon=0.1).status_code == 201
        proxy.cut()
        outcomes: list[Any] = [api.charge(epsilon=0.1) for _ in range(3)]
        assert {r.status_code for r in outcomes} == {503}
        assert all(r.content_type == "application/problem+json" for r in outcomes)
        stalled = api.client.get("/readyz")
        assert stalled.status_code == 503
        assert "does not answer" in stalled.get_json()["detail"]
        assert "db upgrade" not in stalled.get_json()["detail"]  # not the fix for a stall
        proxy.restore()
        assert api.charge(epsilon=0.1).status_code == 201
        assert api.client.get("/readyz").status_code == 200
        assert api.budget()["loss"]["epsilon"] == 0.2  # nothing half-written meanwhile
        assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    finally:
        proxy.close()


def test_readiness_says_to_upgrade_only_when_the_schema_is_missing(
    api: Api, database_url: str
) -> None:
    """A database that answers without this release's schema is told to run the upgrade; a
    database that does not answer is not (test_a_lost_database_is_a_503_...)."""
    from sqlalchemy import create_engine

    assert api.client.get("/readyz").status_code == 200
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE alembic_version"))
    engine.dispose()
    missing = api.client.get("/readyz")
    assert missing.status_code == 503
    assert "run 'accountant db upgrade'" in missing.get_json()["detail"]


def test_pooled_connections_the_server_closed_are_replaced_without_a_failed_request(
    api: Api, database_url: str
) -> None:
    from sqlalchemy.engine import make_url

    from tests.conftest import _admin_engine

    if not database_url.startswith("postgresql"):
        pytest.skip("needs server processes to terminate")
    api.make_dataset(budget={"epsilon": 1})
    assert api.charge(epsilon=0.1).status_code == 201  # its connections are pooled now
    with _admin_engine().connect() as admin:
        ended = admin.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = :name AND pid <> pg_backend_pid()"
            ),
            {"name": make_url(database_url).database},
        ).scalar()
    assert ended
    with _admin_engine().connect() as admin:  # until the server has ended them all
        _wait_for(
            lambda: (
                not admin.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = :name "
                        "AND pid <> pg_backend_pid()"
                    ),
                    {"name": make_url(database_url).database},
                ).scalar()
            )
        )
    assert api.charge(epsilon=0.1).status_code == 201
    assert api.get("/v1/datasets/clicks").status_code == 200  # the ORM path too
    assert api.budget()["loss"]["epsilon"] == 0.2


def _wait_for(condition: Callable[[], bool], seconds: float = 60) -> None:
    """Until ``condition()`` holds; a failure if it does not within ``seconds`` (a hang)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the awaited event never came"
        time.sleep(0.02)


def test_a_sqlite_file_locked_from_outside_is_a_503_within_the_deadline(tmp_path: Path) -> None:
    """Another process (a backup, the command line) holding SQLite's write lock: every
    charge is a 503 problem+json within the request's deadline (lock timeout + database
    timeout + 1 s), a request that waited for a thread included. A waiting writer's BEGIN
    used to wait SQLite's whole busy timeout whatever was left of its budget, so a request
    queued behind two rounds of refusals answered a lock timeout late."""
    database = tmp_path / "locked.db"
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": f"sqlite:///{database}",
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(tmp_path / "signing.pem"),
        "ACCOUNTANT_LOCK_TIMEOUT_MS": "1500",
        "ACCOUNTANT_DATABASE_TIMEOUT_MS": "1000",
    }
    deadline_s = 1.5 + 1.0 + 1.0
    subprocess.run([BIN, "init"], env=env, check=True, capture_output=True)
    with running_service(env, tmp_path / "serve.log", "--workers", "1", "--threads", "1") as server:
        api = requests.Session()
        body: dict[str, Any] = {"name": "locked", "privacy_unit": "record", "accounting": "pure"}
        created = api.post(
            f"{server.base}/v1/datasets", json={**body, "budget": {"epsilon": 10}}, headers=HEADERS
        )
        assert created.status_code == 201, created.text
        charge: dict[str, Any] = {
            "dataset": "locked",
            "partitions": ["p"],
            "mechanism": "laplace",
            "params": {"epsilon": 0.01, "sensitivity": 1},
            "input": {"values": [1.0]},
        }
        outside = sqlite3.connect(database, isolation_level=None)
        outside.execute("BEGIN EXCLUSIVE")
        try:
            answers: list[Any] = [None] * 4

            def send(index: int) -> None:  # one thread serves them: three wait for it
                answers[index] = requests.post(
                    f"{server.base}/v1/charges",
                    json={**charge, "idempotency_key": f"k{index}"},
                    headers=HEADERS,
                    timeout=30,
                )

            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(answers))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            outside.execute("ROLLBACK")
            outside.close()
        assert [a.status_code for a in answers] == [503] * len(answers)
        assert all(a.headers["Content-Type"] == "application/problem+json" for a in answers)
        slowest = max(a.elapsed.total_seconds() for a in answers)
        assert slowest < deadline_s + 0.5, [round(a.elapsed.total_seconds(), 2) for a in answers]
        after = api.post(f"{server.base}/v1/charges", json=charge, headers=HEADERS)
        assert after.status_code == 201, after.text
