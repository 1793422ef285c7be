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

A request has one such deadline for all its waits together, not one per wait
(``accountant.deadline``): checking a connection out of the pool, connecting,
and every statement, commit and rollback it sends wait only for what is left
of it. A request that waited for a pooled connection, or for another thread's
charges to commit, therefore never waits a whole deadline more afterwards.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import psycopg
from psycopg import errors
from sqlalchemy.pool import QueuePool

from accountant.deadline import remaining, spent

#: What ``Connection.wait`` raises when its timeout passes (psycopg >= 3.3; an import error
#: here, rather than a wait without a deadline, if a release renames it).
_WAIT_TIMEOUT = errors._WaitTimeout


#: libpq's least ``connect_timeout``, in seconds.
_SHORTEST_CONNECT = 2


def connect_timeout(longest: float) -> int:
    """libpq's ``connect_timeout`` for a connection opened now, in whole seconds: what is
    left of the request's deadline, rounded down. With less than libpq's minimum left, the
    request gives up instead of overrunning its deadline."""
    left = remaining(max(_SHORTEST_CONNECT, math.ceil(longest)))
    if left < _SHORTEST_CONNECT:
        raise psycopg.OperationalError(
            f"{left:.3g} s of the request's deadline are left, too few to connect"
        )
    return math.floor(left)


class DeadlinePool(QueuePool):
    """A pool whose checkout waits at most what is left of the request's deadline."""

    @property
    def _timeout(self) -> float:
        return remaining(self._longest_checkout)

    @_timeout.setter
    def _timeout(self, seconds: float) -> None:
        self._longest_checkout = seconds

    def _do_get(self) -> Any:
        with spent():
            return super()._do_get()


class _Stall:
    """Whether this process found the database stalled, and which thread probes it.

    A request that waits its whole deadline tells the ones behind it nothing: each
    thread that picks up a request queued meanwhile would wait a whole deadline more,
    and its client twice as long. So once a wait times out, the database counts as
    stalled: every other thread's next wait fails at once (a 503 with Retry-After), and
    one thread at a time probes with a real wait. The first wait that is answered ends
    the stall."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stalled = False
        self._prober: int | None = None

    def admit(self) -> bool:
        """Whether this thread may wait for the database now."""
        if not self._stalled:  # read without the lock: a stale answer only delays a probe
            return True
        with self._lock:
            me = threading.get_ident()
            if not self._stalled or self._prober in (None, me):
                self._prober = me if self._stalled else None
                return True
            return False

    def answered(self) -> None:
        if self._stalled:
            with self._lock:
                self._stalled, self._prober = False, None

    def timed_out(self) -> None:
        with self._lock:
            self._stalled, self._prober = True, None

    def failed(self) -> None:
        """This thread's wait failed otherwise (a lost connection): another may probe."""
        if self._stalled:
            with self._lock:
                if self._prober == threading.get_ident():
                    self._prober = None


STALL = _Stall()


def refuse_while_stalled() -> None:
    """Raise unless this thread may wait for the database now (``_Stall``)."""
    if not STALL.admit():
        raise psycopg.OperationalError(
            "the database did not answer another request within its deadline a moment "
            "ago, and is being probed"
        )


class DeadlineConnection(psycopg.Connection[Any]):
    """A connection whose waits for the server end after ``deadline_s`` seconds, or when
    the request's deadline passes, whichever comes first."""

    #: Seconds; set for each connection by the engine that opens it.
    deadline_s: float = 10.0

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        allowed = remaining(self.deadline_s if timeout is None else timeout)
        try:
            refuse_while_stalled()
        except psycopg.OperationalError:
            self.pgconn.finish()  # nothing of ``gen`` was sent; its transaction ends here
            raise
        try:
            with spent():
                answer = super().wait(gen, interval, allowed)
        except _WAIT_TIMEOUT:
            STALL.timed_out()
            self.pgconn.finish()  # the protocol state is unknown: never reuse it
            raise psycopg.OperationalError(
                f"the database did not answer within {allowed:.3g} s"
            ) from None
        except BaseException:
            STALL.failed()
            raise
        STALL.answered()
        return answer
