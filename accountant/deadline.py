"""One deadline for all of a request's waits for the database.

A request may wait for the database several times: for a pooled connection,
for a connection to open, for each statement, commit and rollback, and for
other threads' charges that share its transaction to commit. Each wait has
a bound of its own; this module gives the request one bound for all of them
together, so that the slowest answer a stalled database can cause is one
deadline, not a sum of them (``pg_deadline`` applies it on PostgreSQL).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

#: What is left of the current request's time for waiting on the database, in seconds (a
#: one-item list, spent by ``spent``), if it has such a budget.
_LEFT: ContextVar[list[float] | None] = ContextVar("left", default=None)
#: When the server received the current request (``time.monotonic``), if it says so.
_ARRIVED: ContextVar[float | None] = ContextVar("arrived", default=None)
#: The least time a wait is given, so that a request past its deadline fails at once.
_AT_ONCE = 0.001


@contextmanager
def arrived(at: float | None) -> Iterator[None]:
    """The request handled within this block arrived ``at`` (the server's main loop saw it):
    its time waiting for a free thread counts against its budget."""
    token = _ARRIVED.set(at)
    try:
        yield
    finally:
        _ARRIVED.reset(token)


@contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Within this block, the request's waits for the database (and its wait for a thread,
    since it ``arrived``) add up to at most ``seconds``. Time spent computing, a mechanism
    running, is not waiting and does not count."""
    start = _ARRIVED.get()
    queued = 0.0 if start is None else max(0.0, time.monotonic() - start)
    token = _LEFT.set([seconds - queued])
    try:
        yield
    finally:
        _LEFT.reset(token)


def remaining(longest: float) -> float:
    """How long the next wait may last: ``longest``, or what is left of the request's
    budget if that is less (at least a millisecond, so that it ends at once)."""
    left = _LEFT.get()
    return longest if left is None else max(_AT_ONCE, min(longest, left[0]))


@contextmanager
def spent() -> Iterator[None]:
    """Count the time this block takes against the request's budget (a wait)."""
    left = _LEFT.get()
    start = time.monotonic()
    try:
        yield
    finally:
        if left is not None:
            left[0] -= time.monotonic() - start


def waited_since(start: float) -> float:
    """Count the time since ``start`` (``time.monotonic``) against the request's budget, as a
    wait that has ended now; the time now."""
    now = time.monotonic()
    left = _LEFT.get()
    if left is not None:
        left[0] -= now - start
    return now
