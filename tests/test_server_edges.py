"""What gunicorn itself answers under `accountant serve`: problem+json for requests it refuses
before the application sees them, 413 for a chunked body over the limit, JSON log lines, and
liveness probes answered while every thread is busy."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from accountant.serving import REQUEST_LINE_BYTES
from tests.conftest import ADMIN_KEY
from tests.server import Server, SlowClients, running_service

BIN = Path(sys.executable).parent / "accountant"

HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def server(database_url: str, signing_key_file: str, tmp_path: Path) -> Iterator[Server]:
    if database_url.startswith("postgresql"):
        pytest.skip("gunicorn answers these before any database is involved")
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_MAX_BODY_BYTES": str(1024 * 1024),
    }
    with running_service(env, tmp_path / "serve.log", "--workers", "1") as running:
        yield running


def _raw(server: Server, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as it is; the status, headers and body of the answer."""
    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"GET /v1/datasets HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"GET /v1/" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (
            b"GET /v1/datasets HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-H%d: 1\r\n" % n for n in range(150))
            + b"\r\n",
            431,
        ),
    ],
    ids=["long-header", "long-url", "many-headers"],
)
def test_requests_gunicorn_refuses_are_answered_with_problem_json(
    server: Server, request_bytes: bytes, status: int
) -> None:
    code, headers, body = _raw(server, request_bytes)
    assert code in (400, status)
    assert headers["content-type"] == "application/problem+json"
    problem = json.loads(body)
    assert problem["status"] == code and problem["detail"] and problem["type"]


def test_the_request_line_limit_is_the_one_the_document_states(server: Server) -> None:
    """/openapi.json's 414 names the request line limit gunicorn enforces: a line of that
    many bytes reaches the application, one byte more is a 414 in problem+json."""
    paths = requests.get(f"{server.base}/openapi.json", timeout=10).json()["paths"]
    assert (
        f"{REQUEST_LINE_BYTES} bytes"
        in paths["/v1/datasets"]["get"]["responses"]["414"]["description"]
    )

    def request_line(size: int) -> bytes:
        start, end = b"GET /v1/datasets?pad=", b" HTTP/1.1"
        line = start + b"a" * (size - len(start) - len(end)) + end
        assert len(line) == size
        return line + b"\r\nHost: x\r\nConnection: close\r\n\r\n"

    assert _raw(server, request_line(REQUEST_LINE_BYTES))[0] == 401  # the application's
    code, headers, body = _raw(server, request_line(REQUEST_LINE_BYTES + 1))
    assert code == 414 and headers["content-type"] == "application/problem+json"
    assert json.loads(body)["status"] == 414


def test_a_chunked_body_over_the_limit_is_a_413_and_charges_nothing(server: Server) -> None:
    created = requests.post(
        f"{server.base}/v1/datasets",
        headers=HEADERS,
        json={
            "name": "big",
            "privacy_unit": "record",
            "accounting": "pure",
            "budget": {"epsilon": 1},
        },
    )
    assert created.status_code == 201

    def chunks() -> Iterator[bytes]:
        yield b'{"dataset": "big", "partitions": ["p"], "mechanism": "laplace", '
        yield b'"params": {"epsilon": 0.1, "sensitivity": 1}, "input": {"values": ['
        for _ in range(10 * 1024):
            yield b"1.0," * 256
        yield b"1.0]}}"

    reply = requests.post(
        f"{server.base}/v1/charges",
        data=chunks(),
        headers={**HEADERS, "Content-Type": "application/json"},
        timeout=60,
    )
    assert reply.status_code == 413
    assert reply.headers["Content-Type"] == "application/problem+json"
    assert "1048576 bytes" in reply.json()["detail"]
    budget = requests.get(f"{server.base}/v1/datasets/big/budget", headers=HEADERS).json()
    assert budget["loss"]["epsilon"] == 0


@pytest.mark.parametrize(
    "chunks",
    [b"zz\r\nabc\r\n0\r\n\r\n", b'7\r\n{"a":1}XX0\r\n\r\n'],
    ids=["bad-size", "no-terminator"],
)
def test_a_body_with_broken_chunked_framing_is_a_400(server: Server, chunks: bytes) -> None:
    for path in (b"/v1/charges", b"/v1/charges/preview", b"/v1/datasets"):
        code, headers, body = _raw(
            server,
            b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks,
        )
        assert code == 400, body
        assert headers["content-type"] == "application/problem+json"
        assert "chunk" in json.loads(body)["detail"]


def test_every_log_line_is_json(database_url: str, signing_key_file: str, tmp_path: Path) -> None:
    if database_url.startswith("postgresql"):
        pytest.skip("the log format does not depend on the database")
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
    }
    log = tmp_path / "serve.log"
    with running_service(env, log, "--workers", "1") as running:
        _raw(running, b"GET /v1/" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        requests.get(f"{running.base}/v1/datasets", headers=HEADERS)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines, "gunicorn logged nothing: the refused request should be logged"
    for line in lines:
        assert isinstance(json.loads(line), dict), line
    messages = [json.loads(line)["message"] for line in lines]
    assert any("Invalid request" in message for message in messages)  # gunicorn's
    # the service's, once its socket is bound, naming it
    assert f"serving on {running.base} with 1 worker" in messages


def test_gunicorn_builds_no_request_line_for_an_access_log_the_service_does_not_write(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The service's logging configuration makes gunicorn count its access log as enabled,
    so it would build every request's access-log fields and record, which nothing writes.
    Without ACCOUNTANT_ACCESS_LOG nothing is built; with it, the service's own JSON record is
    written, and gunicorn's request-line atoms are never built."""
    from datetime import timedelta
    from types import SimpleNamespace

    from gunicorn import glogging
    from gunicorn.config import Config

    from accountant import serving

    monkeypatch.setattr(glogging.Logger, "access_log_enabled", True, raising=False)
    built: list[object] = []

    def atoms(*args: object) -> dict[str, str]:
        built.append(args)
        return {}

    response = SimpleNamespace(status_code=200, sent=16)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/healthz"}
    for enabled in (False, True):
        monkeypatch.setattr(serving.Logger, "access_log", enabled)
        logger = serving.Logger(Config())
        monkeypatch.setattr(logger, "atoms", atoms)
        with caplog.at_level("INFO", logger="accountant.access"):
            logger.access(response, None, environ, timedelta(milliseconds=2))
    assert built == []
    records = [r for r in caplog.records if r.name == "accountant.access"]
    assert len(records) == 1 and getattr(records[0], "path", None) == "/healthz"


def test_liveness_is_answered_while_slow_clients_hold_every_thread(server: Server) -> None:
    """/healthz is answered by the worker's main loop (``serving.Worker``): 20 clients that
    never finish their headers hold its 4 threads, and probes are still answered; before,
    they waited for a thread as long as the slow clients kept sending."""
    slow = SlowClients(server.base, 20)
    try:
        probes = [
            _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
            _raw(server, b"GET /healthz?probe=1 HTTP/1.0\r\n\r\n"),
            _raw(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
        ]
    finally:
        slow.close()
    assert [status for status, _, _ in probes] == [200, 200, 200]
    assert [json.loads(body) for _, _, body in probes[:2]] == [{"status": "ok"}] * 2
    assert probes[2][2] == b"" and probes[2][1]["content-length"] == "16"
    assert all(headers["x-content-type-options"] == "nosniff" for _, headers, _ in probes)
    assert requests.get(f"{server.base}/healthz", timeout=30).json() == {"status": "ok"}


def test_serve_on_a_port_in_use_never_says_it_is_serving(
    database_url: str, signing_key_file: str
) -> None:
    """README: the log runs from 'serving on ...' to 'stopped: ...'. A port another process
    holds is never served, so the first line must not say it is."""
    if database_url.startswith("postgresql"):
        pytest.skip("binding does not depend on the database")
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = subprocess.run(
            [BIN, "serve", "--port", str(port), "--workers", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert refused.returncode != 0
    messages = [json.loads(line)["message"] for line in refused.stderr.splitlines() if line]
    assert not [m for m in messages if m.startswith("serving on")], messages
    assert any("Address already in use" in m for m in messages), messages
