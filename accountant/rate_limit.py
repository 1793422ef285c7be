"""A request-rate limit per API key, in each worker process (API.md: "a configured one
answers 429 with ``"scope": "rate"``").

A token bucket per key: it holds at most ``per_second`` requests and refills at that rate,
so a key may send a burst of ``per_second`` requests and then ``per_second`` a second. The
buckets live in the process: a host of W workers admits at most W times the rate. The
check follows authentication (``api.auth.principal``) and comes before anything else the
request would do, so a refused request charges and runs nothing. It protects the service
from a runaway client; budgets, not this, bound what is released.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

#: Buckets kept before the full ones (idle keys) are first dropped.
_KEPT = 10_000


class RateLimiter:
    def __init__(self, per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._prune_at = _KEPT  # how many buckets before the full ones are dropped again
        self._lock = threading.Lock()

    def wait(self, key: str) -> int | None:
        """None, taking one request from ``key``'s bucket; or, when it is empty, the whole
        seconds (at least 1) until it holds one again."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.per_second), now))
            tokens = min(float(self.per_second), tokens + (now - at) * self.per_second)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                if len(self._buckets) > self._prune_at:
                    self._drop_full(now)
                return None
            self._buckets[key] = (tokens, now)
            return max(1, math.ceil((1 - tokens) / self.per_second))

    def _drop_full(self, now: float) -> None:
        """Forget the buckets that have refilled: a new one starts full, the same. The next
        drop waits until the buckets kept have doubled, so that many busy keys do not make
        every request walk them all."""
        self._buckets = {
            key: (tokens, at)
            for key, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * self.per_second < self.per_second
        }
        self._prune_at = max(_KEPT, 2 * len(self._buckets))
