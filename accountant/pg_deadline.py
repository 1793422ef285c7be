"""A psycopg connection that never waits for the server longer than a deadline.

A PostgreSQL server that stops answering (frozen by SIGSTOP, a stalled disk, a
network path that drops packets) leaves its clients' sockets open: the kernel
still acknowledges what they send, so neither TCP keepalives nor
``tcp_user_timeout`` notice, and the server's own ``statement_timeout`` cannot
fire in a server that does not run. A request would wait as long as the
server is frozen, and with it the worker thread that holds it.

So every wait of the service's connections has a deadline on the client side.
psycopg sends each statement, commit and rollback through ``Connection.wait``;
this subclass gives that wait a timeout, and when it passes, the connection is
closed (its state is unknown: half a statement may be on the wire) and an
``OperationalError`` is raised, which the service answers with a 503. The pool
sees the closed connection and replaces it. A connection that is being opened
is bounded by libpq's ``connect_timeout`` instead.

The deadline is the lock timeout plus a margin, because a statement may
legitimately wait for a lock that long, and the server ends that wait itself.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors

#: What ``Connection.wait`` raises when its timeout passes (psycopg >= 3.3; an import error
#: here, rather than a wait without a deadline, if a release renames it).
_WAIT_TIMEOUT = errors._WaitTimeout


class DeadlineConnection(psycopg.Connection[Any]):
    """A connection whose waits for the server end after ``deadline_s`` seconds."""

    #: Seconds; set for each connection by the engine that opens it.
    deadline_s: float = 10.0

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        try:
            return super().wait(gen, interval, self.deadline_s if timeout is None else timeout)
        except _WAIT_TIMEOUT:
            self.pgconn.finish()  # the protocol state is unknown: never reuse it
            raise psycopg.OperationalError(
                f"the database did not answer within {self.deadline_s:g} s"
            ) from None
