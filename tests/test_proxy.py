"""deploy/nginx.conf in front of `accountant serve`: clients that send their headers slowly
hold gunicorn's threads when they reach it directly, never when the buffering proxy is in
between; nginx's own refusals are problem+json."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import ADMIN_KEY
from tests.server import Server, SlowClients, free_port, running_service, wait_ready

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
CONF = Path(__file__).resolve().parent.parent / "deploy" / "nginx.conf"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NGINX is None, reason="needs nginx (Debian's package)"),
]
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}
SLOW_CLIENTS = 100


@pytest.fixture
def service(database_url: str, signing_key_file: str, tmp_path: Path) -> Iterator[Server]:
    if database_url.startswith("postgresql"):
        pytest.skip("the proxy does not depend on the database")
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
    }
    with running_service(env, tmp_path / "serve.log", "--workers", "2", "--threads", "4") as server:
        yield server


@pytest.fixture
def proxy(service: Server, tmp_path: Path) -> Iterator[str]:
    """deploy/nginx.conf as shipped, with only its two ports changed."""
    with _nginx(service.base.removeprefix("http://"), tmp_path) as base:
        wait_ready(base, "/healthz")
        yield base


@contextmanager
def _nginx(upstream: str, tmp_path: Path) -> Iterator[str]:
    assert NGINX is not None
    port = free_port()
    text = CONF.read_text().replace("server 127.0.0.1:8000;", f"server {upstream};")
    text = re.sub(r"listen 8080;", f"listen 127.0.0.1:{port};", text)
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(text)
    user = "user root; " if os.geteuid() == 0 else ""  # its files live in the test's folder
    process = subprocess.Popen(
        [
            NGINX,
            "-p",
            str(prefix),
            "-c",
            str(prefix / "nginx.conf"),
            "-g",
            f"daemon off; {user}pid {prefix / 'nginx.pid'}; error_log {prefix / 'error.log'};",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # listening: the upstream may not answer (a test of that)
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "nginx did not listen within 30 s"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answered(url: str) -> int | str:
    try:
        return requests.get(url, headers=HEADERS, timeout=10).status_code
    except requests.Timeout:
        return "no answer within 10 s"


def test_slow_clients_do_not_starve_the_service_behind_the_proxy(proxy: str) -> None:
    """Without the proxy, 100 such clients held every gunicorn thread (2 workers x 4) and
    API requests went unanswered for 10 s in most runs; whether a probe slips in first depends on
    scheduling, so only the proxy's half is asserted."""
    slow = SlowClients(proxy, SLOW_CLIENTS)
    try:
        through = [_answered(f"{proxy}{path}") for path in ("/healthz", "/v1/datasets") * 5]
    finally:
        slow.close()
    assert through == [200] * 10


def test_the_proxys_own_refusals_are_problem_json(proxy: str) -> None:
    long_url = requests.get(f"{proxy}/v1/{'a' * 9000}", headers=HEADERS)
    over = requests.post(f"{proxy}/v1/charges", headers=HEADERS, data=b"x" * (4 << 20) + b"x")
    for reply, status in ((long_url, 414), (over, 413)):
        assert reply.status_code == status
        assert reply.headers["Content-Type"] == "application/problem+json"
        assert reply.json()["status"] == status
    at_limit = requests.post(f"{proxy}/v1/charges", headers=HEADERS, data=b"x" * (4 << 20))
    assert at_limit.status_code == 400  # passed on whole; the service finds it is not JSON


def test_a_ledger_export_of_many_chains_passes_the_proxy(service: Server, proxy: str) -> None:
    """Its signature header names each chain's head while it fits 8 KiB, which the shipped
    proxy takes (its default, one page, would answer 502 from about 30 chains on), then
    their digest: with a head each, 150 datasets would make it 18 KiB."""
    with requests.Session() as session:
        session.headers.update(HEADERS)
        for n in range(150):
            body: dict[str, Any] = {
                "name": f"d{n:03d}",
                "privacy_unit": "record",
                "budget": {"epsilon": 1},
            }
            assert session.post(f"{service.base}/v1/datasets", json=body).status_code == 201
            charge: dict[str, Any] = {
                "dataset": f"d{n:03d}",
                "partitions": ["p1"],
                "mechanism": "laplace",
                "params": {"epsilon": 0.1, "sensitivity": 1},
                "input": {"values": [1.0]},
            }
            assert session.post(f"{service.base}/v1/charges", json=charge).status_code == 201
            if n + 1 not in (60, 150):
                continue
            for kind in ("csv", "jsonl"):
                exported = session.get(f"{proxy}/v1/ledger/export?format={kind}")
                assert exported.status_code == 200, exported.text
                assert len(exported.text.splitlines()) == n + 1 + (kind == "csv")
                signature = exported.headers["Accountant-Export-Signature"]
                assert (len(signature) > 4096) == (n + 1 == 60), len(signature)


def test_a_service_that_does_not_answer_is_a_503_problem(tmp_path: Path) -> None:
    """nginx's 502 (nothing listens upstream) is the 503 its body states, with Retry-After."""
    with _nginx(f"127.0.0.1:{free_port()}", tmp_path) as base:
        reply = requests.get(f"{base}/v1/datasets", headers=HEADERS, timeout=10)
    assert reply.status_code == 503 and reply.json()["status"] == 503
    assert reply.headers["Content-Type"] == "application/problem+json"
    assert reply.headers["Retry-After"] == "1"
