"""What `accountant serve` changes in gunicorn: its own error answers, its log lines, and
liveness probes answered without a worker thread (``Worker``).

gunicorn answers a request it cannot parse (a header or request line over its limits, a
malformed chunk) itself, before the application sees it, with an HTML page. Those answers are
problem+json here, like every other error of the service; and gunicorn's log lines are JSON
objects, like the service's own. The service writes no access log, and gunicorn builds no
request lines for one (``Logger``).
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import time
from functools import partial
from typing import Any

from gunicorn import glogging, util
from gunicorn.workers.gthread import DEFAULT_WORKER_DATA_TIMEOUT, ThreadWorker

from accountant import deadline
from accountant.problems import PROBLEM_BASE

#: The request limits ``accountant serve`` sets in gunicorn (its defaults, stated here so that
#: /openapi.json can say them): the request line, one header line, and the number of headers.
REQUEST_LINE_BYTES = 4094
REQUEST_FIELD_BYTES = 8190
REQUEST_FIELDS = 100

_WHAT_TO_DO = {
    414: "the request line is too long; send a shorter URL",
    431: "a request header is too long or there are too many; send fewer or shorter headers",
}


def write_problem(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's ``util.write_error``, answering with problem+json instead of HTML."""
    detail = _WHAT_TO_DO.get(status_int, "the request is malformed; fix it and send it again")
    body = json.dumps(
        {
            "type": PROBLEM_BASE + reason.lower().replace(" ", "-"),
            "title": reason,
            "status": status_int,
            "detail": f"{detail} ({mesg[:200]})" if mesg else detail,
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/problem+json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


def install() -> None:
    """Make gunicorn's workers answer their own errors with ``write_problem``."""
    util.write_error = write_problem


_ACCESS = logging.getLogger("accountant.access")


class Logger(glogging.Logger):  # type: ignore[misc]  # gunicorn ships no type hints
    """gunicorn's logger, with the service's own access log.

    Off by default (``ACCOUNTANT_ACCESS_LOG``), it builds nothing per request: since the
    logging configuration is set (``LOGGING``), gunicorn's own access log would still build
    each request line's fields, and a record that nothing writes (3.6 % of a worker's CPU
    under load). On, it writes one JSON line per request through the service's formatter:
    method, path, status, bytes sent and seconds, never a header or the query string, so
    never an API key."""

    #: Set by ``accountant serve`` before the workers fork.
    access_log = False

    def access(self, resp: Any, _req: Any, environ: Any, request_time: Any) -> None:
        if Logger.access_log:
            _ACCESS.info(
                "request",
                extra={
                    "method": environ.get("REQUEST_METHOD"),
                    "path": environ.get("PATH_INFO"),
                    "status": resp.status_code,
                    "bytes": getattr(resp, "sent", None),
                    "seconds": round(request_time.total_seconds(), 6),
                },
            )


#: gunicorn's loggers write through the service's JSON formatter, on standard error.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "accountant.logging.JSONFormatter"}},
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "stream": "ext://sys.stderr",
        }
    },
    "root": {"level": "INFO", "handlers": ["stderr"]},
    "loggers": {"gunicorn.error": {"level": "WARNING", "handlers": ["stderr"], "propagate": False}},
}


#: The request lines of a liveness probe (``GET /healthz``), answered by ``Worker`` itself.
_LIVENESS = (b"GET /healthz ", b"GET /healthz?", b"HEAD /healthz ", b"HEAD /healthz?")
_ALIVE = b'{"status":"ok"}\n'
_ALIVE_HEAD = (
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    f"Content-Length: {len(_ALIVE)}\r\nX-Content-Type-Options: nosniff\r\n"
    "Connection: close\r\n\r\n"
).encode("latin-1")
#: A probe's request is read whole from the socket's buffer, or handed to a thread.
_LONGEST_PROBE = 8192


class Worker(ThreadWorker):  # type: ignore[misc]  # gunicorn ships no type hints
    """gunicorn's threaded worker, answering liveness probes (``GET /healthz``) in its main
    loop, never in a worker thread.

    Liveness asks whether the process still serves, not whether the database answers
    (that is ``/readyz``). When every thread waits on a stalled database, or on clients
    that send slowly, a probe queued for a thread would wait as long as they do, and an
    orchestrator would restart workers that are fine. So a new connection is first
    watched by the main loop, as gunicorn does with a connection whose data is late; when
    its first bytes are a whole ``GET /healthz`` request without a body, the main loop
    answers it and closes the connection, and any other request goes to a thread as
    before. A kept-alive connection's later requests, and TLS, always go to a thread
    (Flask's ``/healthz`` answers the same).

    Each request's budget for waiting on the database (``accountant.deadline``) starts
    when the main loop hands it on, so that the time it waits for a free thread counts."""

    def handle(self, conn: Any) -> Any:
        with deadline.arrived(getattr(conn, "arrived", None)):
            return super().handle(conn)

    def enqueue_req(self, conn: Any) -> None:
        conn.arrived = time.monotonic()  # its data is here: the request's deadline starts
        if conn.initialized or self.cfg.is_ssl:
            super().enqueue_req(conn)
            return
        try:
            first = conn.sock.recv(_LONGEST_PROBE, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            if not conn.data_ready:  # nothing sent yet: wait on the main loop, not a thread
                self._watch(conn)
                return
            first = b""
        except OSError:
            first = b""
        if first.startswith(_LIVENESS) and _whole_without_body(first):
            self._answer_alive(conn, first)
            return
        super().enqueue_req(conn)

    def _watch(self, conn: Any) -> None:
        """Hand ``conn`` back to the main loop until it is readable (``pending_conns``: closed
        if nothing comes within the time a thread would have waited, then kept waiting)."""
        conn.timeout = time.monotonic() + DEFAULT_WORKER_DATA_TIMEOUT + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(
            conn.sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn)
        )

    def _answer_alive(self, conn: Any, request: bytes) -> None:
        head_end = request.index(b"\r\n\r\n") + 4
        try:
            conn.sock.recv(head_end)  # take the request off the socket, then answer it
            answer = _ALIVE_HEAD if request.startswith(b"HEAD") else _ALIVE_HEAD + _ALIVE
            conn.sock.send(answer)
        except OSError:
            pass
        self.nr_conns -= 1
        conn.close()


def _whole_without_body(request: bytes) -> bool:
    """Whether ``request`` holds a whole request head that announces no body."""
    if b"\r\n\r\n" not in request:
        return False
    head = request[: request.index(b"\r\n\r\n")].lower()
    return b"\ncontent-length:" not in head and b"\ntransfer-encoding:" not in head
