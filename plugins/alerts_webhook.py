"""Budget alerts POSTed as signed JSON to ``ACCOUNTANT_ALERT_WEBHOOK_URL``.

Each alert is one Standard Webhooks message (``accountant.webhook_signing``):
its body is the alert's fields, as ever, with ``type``, ``id`` (``msg_`` and a
random UUID) and ``timestamp`` (the charge's time) beside them; its headers
carry the same id, the attempt's Unix time and the signatures over both and
the body. Delivery happens on one background thread per process, so a slow
or dead receiver never delays a charge. An attempt that may succeed later (no
answer, a 5xx, a 429) is retried with the same id and body and a fresh
timestamp and signature, up to ``ATTEMPTS`` in all, after a wait that doubles
each time with random jitter (``backoff``); any other answer (a 3xx, which is
never followed, or a 4xx) ends the delivery at once. A dropped alert is
logged; alerts still queued when a process dies are lost; the ledger and the
budget report remain the record.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from accountant import hookimpl, webhook_signing
from accountant.alerts import AlertSettings, BudgetAlert
from accountant.config import ConfigError
from accountant.keyfiles import MissingKeyFile

log = logging.getLogger("accountant.alerts.webhook")
EVENT_TYPE = "budget.threshold_crossed"
ATTEMPTS = 5
FIRST_WAIT_S = 1.0
_queue: queue.Queue[tuple[AlertSettings, dict[str, Any]]] = queue.Queue(maxsize=10_000)
_worker: threading.Thread | None = None
_lock = threading.Lock()


def backoff(attempt: int, jitter: float) -> float:
    """The wait after attempt ``attempt`` (1, 2, ...) failed, ``jitter`` in [0, 1):
    ``FIRST_WAIT_S * 2**(attempt - 1) * (1 + jitter / 2)``, so 1-1.5 s, 2-3 s, 4-6 s and
    8-12 s, 15-22.5 s in all; each wait is longer than any before it whatever the jitter,
    which spreads the retries of many hosts."""
    return FIRST_WAIT_S * 2.0 ** (attempt - 1) * (1 + jitter / 2)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is the answer: a signed POST is never re-sent elsewhere, nor turned into a GET."""

    def redirect_request(self, *args: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def _post(url: str, timeout: float, headers: dict[str, str], body: bytes) -> int | None:
    """The status of one POST, or None when no answer came."""
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with _opener.open(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return error.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _deliver(alerting: AlertSettings, event: dict[str, Any]) -> bool:
    url = alerting.webhook_url or ""
    where = {"event": event["id"], "host": urlsplit(url).hostname}  # the path may hold a token
    body = json.dumps(event).encode()
    try:
        signer = webhook_signing.load(Path(alerting.webhook_secret_file))
    except (MissingKeyFile, ConfigError, OSError) as error:
        log.error("alert not signed; alert dropped", extra={**where, "error": str(error)})
        return False
    for attempt in range(1, ATTEMPTS + 1):
        signed = signer.headers(event["id"], int(time.time()), body)
        headers = {"Content-Type": "application/json", **signed}
        status = _post(url, alerting.webhook_timeout_ms / 1000, headers, body)
        if status is not None and 200 <= status < 300:
            return True
        if status is not None and status < 500 and status != 429:
            log.error(
                "alert webhook refused the alert; alert dropped",
                extra={**where, "status": status, "alert": event},
            )
            return False
        if attempt < ATTEMPTS:
            wait = backoff(attempt, random.random())
            log.warning(
                "alert webhook attempt failed; retrying",
                extra={**where, "attempt": attempt, "status": status, "retry_in_s": round(wait, 3)},
            )
            time.sleep(wait)
    log.error(
        f"alert webhook failed {ATTEMPTS} times; alert dropped", extra={**where, "alert": event}
    )
    return False


def _run() -> None:
    while True:
        alerting, event = _queue.get()
        try:
            _deliver(alerting, event)
        finally:
            _queue.task_done()


def _ensure_worker() -> None:
    global _worker
    with _lock:
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_run, name="alert-webhook", daemon=True)
            _worker.start()


@hookimpl
def accountant_budget_alert(alert: BudgetAlert, alerting: AlertSettings) -> None:
    if not alerting.webhook_url:
        return
    _ensure_worker()
    event = {"type": EVENT_TYPE, "id": f"msg_{uuid.uuid4().hex}", "timestamp": alert.at}
    try:
        _queue.put_nowait((alerting, {**event, **alert.as_json()}))
    except queue.Full:
        log.error("alert queue full; alert dropped", extra={"alert": alert.as_json()})


def drain(timeout: float = 30) -> None:
    """Wait until every queued alert was delivered or dropped (tests, shutdown)."""
    deadline = time.monotonic() + timeout
    while _queue.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.01)
