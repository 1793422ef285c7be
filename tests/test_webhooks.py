"""Budget alert webhooks a receiver can trust: signed as the Standard Webhooks specification
says, checked by the receiver's code of docs/operations.md run as written; one id per alert
across its retries, waits that grow; a refusal not retried; no secret in any log."""

from __future__ import annotations

import base64
import importlib.util
import json
import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import requests

from accountant.app import prepared_app
from accountant.config import ConfigError, load_settings
from accountant.logging import JSONFormatter
from accountant_plugins import alerts_webhook
from tests.conftest import ADMIN_KEY, Api
from tests.server import BIN, running_service

DOC = Path(__file__).parent.parent / "docs" / "operations.md"
Verify = Callable[..., bool]


@dataclass(frozen=True)
class Delivery:
    method: str
    arrived: float  # time.monotonic()
    headers: dict[str, str]  # names lowercased
    body: bytes


class Receiver:
    """A local HTTP server that records every request as it came and answers with the next
    of ``answers`` (0: hang up without an answer; a 3xx names another path), then 204."""

    def __init__(self, answers: tuple[int, ...] = ()) -> None:
        self.deliveries: list[Delivery] = []
        self.answers = list(answers)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {name.lower(): value for name, value in self.headers.items()}
                receiver.deliveries.append(Delivery(self.command, time.monotonic(), headers, body))
                status = receiver.answers.pop(0) if receiver.answers else 204
                if status == 0:
                    return  # the connection closes with no answer
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "/elsewhere")
                self.end_headers()

            do_GET = do_POST  # a followed redirect would arrive as a GET

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while len(self.deliveries) < count:
            assert time.monotonic() < deadline, f"{len(self.deliveries)} of {count} arrived"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def verify(tmp_path: Path) -> Verify:
    """The ``verify`` function of docs/operations.md, "Verifying an alert", as written."""
    section = DOC.read_text().split("**Verifying an alert.**", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    (tmp_path / "receiver.py").write_text(code)
    spec = importlib.util.spec_from_file_location("receiver", tmp_path / "receiver.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.verify  # type: ignore[no-any-return]  # a module made from the document


def _another_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def _secret(path: Path) -> str:
    return path.read_text().split()[0]


def _logged(records: list[logging.LogRecord]) -> str:
    return "\n".join(JSONFormatter().format(record) for record in records)


@pytest.mark.slow
def test_the_documented_receiver_verifies_an_alert_of_a_running_service(
    database_url: str, tmp_path: Path, verify: Verify
) -> None:
    receiver = Receiver()
    keys = tmp_path / "keys"
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(keys / "signing-key.pem"),
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_ALERT_WEBHOOK_URL": receiver.url,
        "ACCOUNTANT_LOG_LEVEL": "DEBUG",
    }
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    dataset: dict[str, Any] = {
        "name": "clicks",
        "privacy_unit": "record",
        "accounting": "pure",
        "budget": {"epsilon": 1},
    }
    charge: dict[str, Any] = {
        "dataset": "clicks",
        "partitions": ["p1"],
        "release": "joint",
        "mechanism": "laplace",
        "params": {"epsilon": 0.6, "sensitivity": 1},
        "input": {"values": [10.0]},
    }
    log = tmp_path / "serve.log"
    try:
        with running_service(env, log, "--workers", "1") as server:
            made = requests.post(
                f"{server.base}/v1/datasets", json=dataset, headers=auth, timeout=30
            )
            assert made.status_code == 201, made.text
            charged = requests.post(
                f"{server.base}/v1/charges", json=charge, headers=auth, timeout=30
            )
            assert charged.status_code == 201, charged.text  # 60%: crosses 50%
            receiver.wait_for(1)
    finally:
        receiver.close()
    [delivery] = receiver.deliveries
    secret_file = keys / "webhook-secret"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    secret, headers, body = _secret(secret_file), delivery.headers, delivery.body
    assert verify(secret, headers, body)

    assert not verify(_another_secret(), headers, body)  # another secret
    assert not verify(secret, headers, body.replace(b'"threshold": 50', b'"threshold": 5'))
    assert not verify(secret, {**headers, "webhook-id": "msg_other"}, body)
    sent_at = int(headers["webhook-timestamp"])
    assert abs(sent_at - time.time()) < 60
    assert verify(secret, headers, body, now=sent_at + 4 * 60)
    assert not verify(secret, headers, body, now=sent_at + 6 * 60)  # a replay
    assert not verify(secret, headers, body, now=sent_at - 6 * 60)

    event = json.loads(body)
    assert event["type"] == "budget.threshold_crossed"
    assert event["id"] == headers["webhook-id"] and event["id"].startswith("msg_")
    assert event["timestamp"] == event["at"]
    # the alert's fields stay at the top level, where receivers read them
    assert (event["dataset"], event["scope"], event["threshold"]) == ("clicks", "dataset", 50)
    assert event["loss"] == {"epsilon": 0.6} and event["limit"] == {"epsilon": 1.0}

    said = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    created = [line for line in said if line["message"].startswith("created a new webhook")]
    assert [line["path"] for line in created] == [str(secret_file)]
    assert secret not in log.read_text()
    assert secret.removeprefix("whsec_") not in log.read_text()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # no database involved
def test_a_failed_attempt_is_retried_with_the_same_id_and_body_after_longer_waits(
    database_url: str,
    signing_key_file: str,
    verify: Verify,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No answer, a 500 and a 429 are retried; the waits double, with jitter."""
    caplog.set_level(logging.DEBUG)
    receiver = Receiver(answers=(500, 0, 429))
    url = f"{receiver.url}/t0ken-in-the-path"
    try:
        app = prepared_app(
            {
                "database_url": database_url,
                "admin_key": ADMIN_KEY,
                "signing_key_file": signing_key_file,
                "alert_webhook_url": url,
            }
        )
        api = Api(app.test_client())
        api.make_dataset(budget={"epsilon": 1})
        assert api.charge(epsilon=0.6).status_code == 201
        alerts_webhook.drain()
    finally:
        receiver.close()
    attempts = receiver.deliveries
    assert [d.method for d in attempts] == ["POST"] * 4
    assert len({d.headers["webhook-id"] for d in attempts}) == 1
    assert len({d.body for d in attempts}) == 1
    secret = _secret(Path(signing_key_file).parent / "webhook-secret")
    assert all(verify(secret, d.headers, d.body) for d in attempts)  # each its own timestamp
    sent = [int(d.headers["webhook-timestamp"]) for d in attempts]
    assert sent == sorted(sent) and sent[-1] > sent[0]

    retries = [r for r in caplog.records if r.getMessage().startswith("alert webhook attempt")]
    assert [vars(r)["status"] for r in retries] == [500, None, 429]
    waits = [vars(r)["retry_in_s"] for r in retries]
    for n, wait in enumerate(waits):  # 1-1.5 s, 2-3 s, 4-6 s
        assert 2**n <= wait <= 1.5 * 2**n
    gaps = [later.arrived - earlier.arrived for earlier, later in pairwise(attempts)]
    assert gaps == sorted(gaps)
    logged = _logged(caplog.records)
    assert secret not in logged and secret.removeprefix("whsec_") not in logged
    assert "t0ken" not in logged  # the URL's path may hold the receiver's token


@pytest.mark.parametrize("status", [400, 404, 410, 302])
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_refusal_is_not_retried(
    database_url: str, signing_key_file: str, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = Receiver(answers=(status,))
    try:
        app = prepared_app(
            {
                "database_url": database_url,
                "admin_key": ADMIN_KEY,
                "signing_key_file": signing_key_file,
                "alert_webhook_url": receiver.url,
            }
        )
        api = Api(app.test_client())
        api.make_dataset(budget={"epsilon": 1})
        assert api.charge(epsilon=0.6).status_code == 201
        alerts_webhook.drain()
    finally:
        receiver.close()
    assert [d.method for d in receiver.deliveries] == ["POST"]  # a redirect is not followed
    dropped = [r for r in caplog.records if r.getMessage().startswith("alert webhook refused")]
    assert [vars(r)["status"] for r in dropped] == [status]


def test_signatures_match_the_specification_s_example(tmp_path: Path) -> None:
    """The example that the Standard Webhooks reference libraries sign in their tests (a
    24-byte secret, the shortest the specification allows)."""
    from accountant import webhook_signing

    path = tmp_path / "webhook-secret"
    path.write_text("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
    path.chmod(0o600)
    signer = webhook_signing.load(path)
    assert signer.headers("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}') == {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    assert "MfKQ" not in repr(signer)


def test_a_new_secret_is_added_beside_the_old_and_either_verifies(
    tmp_path: Path, verify: Verify
) -> None:
    from accountant import webhook_signing

    path = tmp_path / "hooks" / "webhook-secret"
    env = {**os.environ, "ACCOUNTANT_ALERT_WEBHOOK_SECRET_FILE": str(path)}

    def accountant(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([BIN, *args], env=env, capture_output=True, text=True, timeout=60)

    assert "no webhook secret" in accountant("webhook-secret", "show").stderr
    first = accountant("webhook-secret", "add").stdout.strip()
    second = accountant("webhook-secret", "add").stdout.strip()
    shown = accountant("webhook-secret", "show", "--reveal")
    assert shown.stdout == f"{second}\n{first}\n"  # the newest first
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    signer = webhook_signing.load(path)
    assert " ".join(signer.ids) in shown.stderr
    assert first not in shown.stderr and second not in shown.stderr
    headers = signer.headers("msg_1", int(time.time()), b"{}")
    assert len(headers["webhook-signature"].split()) == 2
    assert verify(first, headers, b"{}") and verify(second, headers, b"{}")
    assert not verify(_another_secret(), headers, b"{}")

    path.write_text("whsec_not-base64-s3cret\n")
    refused = accountant("webhook-secret", "show")
    assert refused.returncode == 1
    assert "does not hold a webhook signing secret" in refused.stderr
    assert "s3cret" not in refused.stderr


@pytest.mark.parametrize(
    "url", ["ftp://alerts.example.com/t0ken", "alerts.example.com/t0ken", "https:///t0ken"]
)
def test_a_webhook_url_no_alert_could_reach_is_refused(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"alert_webhook_url": url})
    assert str(refused.value).startswith(
        "ACCOUNTANT_ALERT_WEBHOOK_URL must be an http:// or https:// URL with a host name"
    )
    assert "t0ken" not in str(refused.value)


def test_a_secret_file_that_holds_no_secret_stops_the_start(
    database_url: str, signing_key_file: str
) -> None:
    """Never an alert that cannot be signed: the host refuses to start, naming the setting
    and never repeating what the file holds."""
    path = Path(signing_key_file).parent / "webhook-secret"
    path.write_text("whsec_s3cret-too-short\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError) as refused:
        prepared_app(
            {
                "database_url": database_url,
                "admin_key": ADMIN_KEY,
                "signing_key_file": signing_key_file,
                "alert_webhook_url": "https://alerts.example.com/budget",
            }
        )
    assert f"{path} (ACCOUNTANT_ALERT_WEBHOOK_SECRET_FILE) does not hold" in str(refused.value)
    assert "s3cret" not in str(refused.value)
