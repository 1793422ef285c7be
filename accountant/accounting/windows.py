"""Time windows of window budgets, aligned to whole multiples of their length from the epoch.

DESIGN.md: "Windows are aligned to whole multiples of their length counted
from 1970-01-01T00:00:00Z". A 7-day window therefore starts on a Thursday,
and a 30-day window is not a calendar month.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

PERIODS: dict[str, int] = {"1h": 3600, "1d": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}
PERIOD_NAMES: dict[int, str] = {seconds: name for name, seconds in PERIODS.items()}


@dataclass(frozen=True)
class Window:
    """The window of length ``period`` seconds that contains a moment."""

    period: int
    start: int

    @classmethod
    def containing(cls, period: int, now: float) -> Window:
        moment = math.floor(now)
        return cls(period, moment - moment % period)

    @property
    def end(self) -> int:
        return self.start + self.period

    @property
    def name(self) -> str:
        return PERIOD_NAMES[self.period]

    def seconds_until_end(self, now: float) -> int:
        """Whole seconds, rounded up, until the window resets (at least 1)."""
        return max(1, math.ceil(self.end - now))


def isoformat(epoch_seconds: float) -> str:
    """RFC 3339 UTC with a ``Z`` suffix, as every timestamp of the API."""
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return moment.isoformat().replace("+00:00", "Z")
