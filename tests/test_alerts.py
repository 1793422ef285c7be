"""Budget alerts: once per threshold crossing, logged and POSTed to a webhook, never blocking."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from flask import Flask

from accountant.app import prepared_app
from accountant.clock import Clock
from accountant_plugins import alerts_webhook
from tests.conftest import ADMIN_KEY, Api


class _Receiver:
    """A local HTTP server that records JSON bodies; it can fail the first requests."""

    def __init__(self, failures: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.attempts = 0
        self.failures = failures
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.attempts += 1
                if receiver.attempts <= receiver.failures:
                    self.send_response(500)
                else:
                    receiver.bodies.append(body)
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver(failures=1)
    yield server
    server.close()


def _app(
    database_url: str, signing_key_file: str, url: str, clock: Clock | None = None, **extra: Any
) -> Flask:
    return prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
            "alert_webhook_url": url,
            **extra,
        },
        clock=clock,
    )


@pytest.mark.frozen_clock  # the window's alert needs every charge in one day
def test_each_crossing_alerts_once_with_retries(
    database_url: str,
    signing_key_file: str,
    receiver: _Receiver,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = Api(_app(database_url, signing_key_file, receiver.url, clock).test_client())
    api.make_dataset(budget={"epsilon": 1}, windows=[{"period": "1d", "epsilon": 2}])
    for _ in range(5):
        assert api.charge(epsilon=0.2).status_code == 201  # 20% 40% 60% 80% 100%
    assert api.charge(epsilon=0.2).status_code == 409  # denied: nothing more
    alerts_webhook.drain()
    dataset_alerts = [b for b in receiver.bodies if b["scope"] == "dataset"]
    assert [a["threshold"] for a in dataset_alerts] == [50, 80, 100]
    assert dataset_alerts[0]["loss"] == {"epsilon": 0.6} and dataset_alerts[0]["limit"] == {
        "epsilon": 1.0
    }
    window_alerts = [b for b in receiver.bodies if b["scope"] == "window"]
    assert [a["threshold"] for a in window_alerts] == [50]  # 1.0 of 2.0
    assert window_alerts[0]["window"]["period"] == "1d"
    consumer_alerts = [b for b in receiver.bodies if b["scope"] == "consumer"]
    assert consumer_alerts == []  # the admin has no quota
    assert receiver.attempts == len(receiver.bodies) + 1  # the first attempt got a 500
    logged = [r for r in caplog.records if r.getMessage() == "budget threshold crossed"]
    assert len(logged) == len(receiver.bodies)


def test_a_hanging_webhook_never_holds_or_fails_a_charge(
    database_url: str, signing_key_file: str
) -> None:
    """The webhook answers nothing until released; the charge is answered meanwhile."""
    release, arrived = threading.Event(), threading.Event()

    class Hanging(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            arrived.set()
            release.wait(30)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/alerts"
    try:
        api = Api(_app(database_url, signing_key_file, url).test_client())
        api.make_dataset(budget={"epsilon": 1})
        assert api.charge(epsilon=0.9).status_code == 201  # crosses 50% and 80%
        assert arrived.wait(30)  # the alert was sent ...
        assert not release.is_set()  # ... and is still unanswered: the charge did not wait
        assert api.charge(epsilon=0.05).status_code == 201
    finally:
        release.set()
        alerts_webhook.drain()
        server.shutdown()
        server.server_close()


def test_partition_and_quota_scopes_alert(
    database_url: str, signing_key_file: str, receiver: _Receiver
) -> None:
    receiver.failures = 0
    api = Api(
        _app(database_url, signing_key_file, receiver.url, alert_thresholds=(90,)).test_client()
    )
    api.make_dataset(budget={"epsilon": 10}, partition_budget={"epsilon": 1})
    service = api.as_key(
        api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 1}})
    )
    # 95% of partition a and of the quota; then partition b. The consumer's loss composes in
    # parallel too (record unit: the largest s(p)), so the second charge leaves it at 95%.
    assert service.charge(partitions=["a"], epsilon=0.95).status_code == 201
    assert service.charge(partitions=["b"], epsilon=0.95).status_code == 201
    alerts_webhook.drain()
    scopes = sorted((b["scope"], b.get("partition"), b.get("consumer")) for b in receiver.bodies)
    assert scopes == [("consumer", None, "svc"), ("partition", "a", None), ("partition", "b", None)]
