"""Windows on a clock held still and moved on: rollover, several windows, and a lock wait
longer than a window, with no sleeping."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from accountant.app import prepared_app
from accountant.clock import FrozenClock
from tests.conftest import ADMIN_KEY, FROZEN_AT_US, Api, run_sql

#: 10:30:00 UTC on a Monday: half an hour into its hour window.
START = FROZEN_AT_US
HOUR = 3600


class ScriptedClock(FrozenClock):
    """A frozen clock that gives the readings in ``script`` first, one per call."""

    def __init__(self, at_us: int) -> None:
        super().__init__(at_us)
        self.script: list[int] = []

    def now_us(self) -> int:
        return self.script.pop(0) if self.script else super().now_us()


@pytest.fixture
def clock() -> ScriptedClock:
    return ScriptedClock(START)


@pytest.fixture
def api(database_url: str, signing_key_file: str, clock: ScriptedClock) -> Iterator[Api]:
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
        },
        clock=clock,
    )
    with app.test_client() as client:
        yield Api(client)


def _window(api: Api, period: str) -> dict[str, Any]:
    return next(w for w in api.budget()["windows"] if w["period"] == period)


def test_a_window_resets_when_the_clock_reaches_its_end(api: Api, clock: ScriptedClock) -> None:
    api.make_dataset(budget={"epsilon": 10}, windows=[{"period": "1h", "epsilon": 0.5}])
    assert api.charge(epsilon=0.4).status_code == 201
    denied = api.charge(epsilon=0.2)
    assert denied.status_code == 429
    assert denied.headers["Retry-After"] == "1800"  # exactly: the clock stands at :30
    assert denied.get_json()["resets_at"] == "2026-03-02T11:00:00Z"
    clock.advance(1799)
    assert api.charge(epsilon=0.2).status_code == 429  # one second before the reset
    clock.advance(1)
    assert api.charge(epsilon=0.2).status_code == 201  # a new window
    window = _window(api, "1h")
    assert window["start"] == "2026-03-02T11:00:00Z" and window["loss"]["epsilon"] == 0.2
    assert api.budget()["loss"]["epsilon"] == pytest.approx(0.6)  # the lifetime keeps it all


def test_several_windows_roll_over_each_on_its_own_period(api: Api, clock: ScriptedClock) -> None:
    api.make_dataset(
        budget={"epsilon": 100},
        windows=[{"period": "1h", "epsilon": 1}, {"period": "1d", "epsilon": 2.5}],
    )
    for _ in range(3):  # 10:30, 11:30, 12:30: one hour window each, one day window
        assert api.charge(epsilon=0.8).status_code == 201
        clock.advance(HOUR)
    assert _window(api, "1d")["loss"]["epsilon"] == pytest.approx(2.4)
    assert _window(api, "1h")["loss"]["epsilon"] == 0  # 13:30: nothing yet this hour
    denied = api.charge(epsilon=0.2)  # fits the hour, not the day
    assert denied.status_code == 429 and denied.get_json()["resets_at"] == "2026-03-03T00:00:00Z"
    clock.set(int(datetime(2026, 3, 3, 0, 0, tzinfo=UTC).timestamp()) * 1_000_000)
    assert api.charge(epsilon=0.9).status_code == 201  # a new day, a new hour
    assert _window(api, "1d")["loss"]["epsilon"] == pytest.approx(0.9)


def test_a_lock_wait_longer_than_a_window_reads_the_window_it_ends_in(
    api: Api, clock: ScriptedClock
) -> None:
    """The scope rows are sent before the lock is granted, for the windows around the
    clock's reading then. A charge whose lock came two windows later must read the window
    it is charged in: here another charge spent 0.4 of its 0.5 meanwhile."""
    api.make_dataset(budget={"epsilon": 10}, windows=[{"period": "1h", "epsilon": 0.5}])
    clock.advance(2 * HOUR)
    assert api.charge(epsilon=0.4).status_code == 201  # 12:30, in the 12:00 window
    # The next charge reads the clock at 10:30 before its lock, at 12:30 once it holds it.
    clock.script = [START]
    denied = api.charge(epsilon=0.2)
    assert denied.status_code == 429, denied.get_json()
    assert denied.get_json()["spent"]["epsilon"] == 0.4
    assert _window(api, "1h")["loss"]["epsilon"] == 0.4
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True


def test_window_tallies_older_than_the_longest_window_are_pruned(
    api: Api, clock: ScriptedClock, database_url: str
) -> None:
    api.make_dataset(budget={"epsilon": 100}, windows=[{"period": "1h", "epsilon": 1}])

    def windows() -> list[int]:
        return sorted(
            row[0]
            for row in run_sql(
                database_url, "SELECT window_start FROM tallies WHERE kind = 'window'"
            )
        )

    for _ in range(3):
        assert api.charge(epsilon=0.1).status_code == 201
        clock.advance(HOUR)
    assert len(windows()) == 3  # each hour's tally is kept while it may still matter
    clock.advance(30 * 86_400)  # past the longest window (30 days) after the last one
    assert api.charge(epsilon=0.1).status_code == 201
    assert windows() == [START // 1_000_000 - 1800 + 3 * HOUR + 30 * 86_400]
    assert api.budget()["loss"]["epsilon"] == pytest.approx(0.4)  # the lifetime keeps it all
    assert len([e for e in api.ledger() if e["kind"] == "charge"]) == 4
