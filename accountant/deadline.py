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

#: When the current request's waits for the database must end (``time.monotonic``), if any.
_REQUEST_ENDS: ContextVar[float | None] = ContextVar("request_ends", default=None)
#: The least time a wait is given, so that a request past its deadline fails at once.
_AT_ONCE = 0.001


#: When the server received the current request (``time.monotonic``), if it says so.
_ARRIVED: ContextVar[float | None] = ContextVar("arrived", default=None)


@contextmanager
def arrived(at: float | None) -> Iterator[None]:
    """The request handled within this block arrived ``at`` (the server's main loop saw it):
    its deadline counts from then, its wait for a free thread included."""
    token = _ARRIVED.set(at)
    try:
        yield
    finally:
        _ARRIVED.reset(token)


@contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Within this block, every wait for the database ends ``seconds`` after the request
    arrived (``arrived``), or after the block began."""
    start = _ARRIVED.get()
    token = _REQUEST_ENDS.set((time.monotonic() if start is None else start) + seconds)
    try:
        yield
    finally:
        _REQUEST_ENDS.reset(token)


def remaining(longest: float) -> float:
    """How long the next wait may last: ``longest``, or what is left of the request's
    deadline if that is less (at least a millisecond, so that it ends at once)."""
    ends = _REQUEST_ENDS.get()
    return longest if ends is None else max(_AT_ONCE, min(longest, ends - time.monotonic()))
