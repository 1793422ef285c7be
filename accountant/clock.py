"""The service's one clock: wall time in microseconds since the epoch.

Everything that stamps a charge, picks its window or says when a window
resets reads the runtime's clock, so a test can hold it still and move it
on (``FrozenClock``) instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_us(self) -> int:
        """Microseconds since the epoch."""


class SystemClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000


class FrozenClock:
    """A clock that stands still until ``advance`` moves it (tests)."""

    def __init__(self, at_us: int) -> None:
        self._at = at_us
        self._lock = threading.Lock()

    def now_us(self) -> int:
        with self._lock:
            return self._at

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._at += round(seconds * 1_000_000)

    def set(self, at_us: int) -> None:
        with self._lock:
            self._at = at_us
