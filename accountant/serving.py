"""What `accountant serve` changes in gunicorn: its own error answers and its log lines.

gunicorn answers a request it cannot parse (a header or request line over its limits, a
malformed chunk) itself, before the application sees it, with an HTML page. Those answers are
problem+json here, like every other error of the service; and gunicorn's log lines are JSON
objects, like the service's own. The service writes no access log, and gunicorn builds no
request lines for one (``Logger``).
"""

from __future__ import annotations

import json
from typing import Any

from gunicorn import glogging, util

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


class Logger(glogging.Logger):  # type: ignore[misc]  # gunicorn ships no type hints
    """gunicorn's logger, without request lines unless an access log is configured.

    The service writes no access log. But since its logging configuration is set
    (``LOGGING``), gunicorn would still build each request line's fields, and a log
    record that nothing writes: measured at 3.6 % of a worker's CPU under load."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.cfg.accesslog:
            super().access(resp, req, environ, request_time)


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
