"""Budget alerts POSTed as JSON to ``ACCOUNTANT_ALERT_WEBHOOK_URL``.

Delivery happens on one background thread per process, so a slow or dead
receiver never delays a charge: each alert is tried 3 times with a bounded
timeout and exponential backoff (0.5 s, then 1 s), then dropped with a log
line. Alerts still queued when a process dies are lost; the ledger and the
budget report remain the record.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from accountant import hookimpl
from accountant.alerts import AlertSettings, BudgetAlert

log = logging.getLogger("accountant.alerts.webhook")
ATTEMPTS = 3
_queue: queue.Queue[tuple[str, float, dict[str, Any]]] = queue.Queue(maxsize=10_000)
_worker: threading.Thread | None = None
_lock = threading.Lock()


def _deliver(url: str, timeout: float, body: dict[str, Any]) -> bool:
    data = json.dumps(body).encode()
    for attempt in range(ATTEMPTS):
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                if 200 <= response.status < 300:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if attempt + 1 < ATTEMPTS:
            time.sleep(0.5 * 2**attempt)
    log.error("alert webhook failed; alert dropped", extra={"url": url, "alert": body})
    return False


def _run() -> None:
    while True:
        url, timeout, body = _queue.get()
        try:
            _deliver(url, timeout, body)
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
    try:
        _queue.put_nowait(
            (alerting.webhook_url, alerting.webhook_timeout_ms / 1000, alert.as_json())
        )
    except queue.Full:
        log.error("alert queue full; alert dropped", extra={"alert": alert.as_json()})


def drain(timeout: float = 30) -> None:
    """Wait until every queued alert was delivered or dropped (tests, shutdown)."""
    deadline = time.monotonic() + timeout
    while _queue.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.01)
