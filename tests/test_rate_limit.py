"""A configured request-rate limit (API.md: "There is no request-rate limit by default; a
configured one answers 429 with "scope": "rate"")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from accountant.app import prepared_app
from accountant.config import ConfigError, load_settings
from accountant.rate_limit import RateLimiter
from tests.conftest import ADMIN_KEY, Api


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_may_send_a_burst_of_the_rate_then_the_rate_a_second() -> None:
    clock = _Clock()
    limiter = RateLimiter(2, clock)
    assert [limiter.wait("a"), limiter.wait("a"), limiter.wait("a")] == [None, None, 1]
    assert limiter.wait("b") is None  # each key has its own bucket
    clock.now += 0.5  # one request's worth refilled
    assert limiter.wait("a") is None and limiter.wait("a") == 1
    clock.now += 60  # a bucket never holds more than the burst
    assert [limiter.wait("a") for _ in range(3)] == [None, None, 1]


def test_a_slow_rate_says_how_many_seconds_until_the_next_request() -> None:
    clock = _Clock()
    limiter = RateLimiter(1, clock)
    assert limiter.wait("a") is None and limiter.wait("a") == 1
    clock.now += 0.25
    assert limiter.wait("a") == 1  # 0.75 s, rounded up


def test_idle_keys_are_forgotten_and_start_again_with_a_full_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("accountant.rate_limit._KEPT", 3)
    clock = _Clock()
    limiter = RateLimiter(1, clock)
    for key in "abc":
        assert limiter.wait(key) is None
    clock.now += 10  # a, b and c refilled
    assert limiter.wait("d") is None and limiter.wait("e") is None
    assert set(limiter._buckets) <= {"d", "e"}
    assert limiter.wait("a") is None  # a full bucket, as if kept


def test_a_key_past_the_rate_gets_a_429_with_scope_rate_and_nothing_is_charged(
    database_url: str, signing_key_file: str
) -> None:
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
            "rate_limit": 3,
        }
    )
    clock = _Clock()  # the buckets' clock stands still until the test moves it
    runtime = app.extensions["accountant"]
    assert runtime.rate_limiter.per_second == 3
    app.extensions["accountant"] = replace(runtime, rate_limiter=RateLimiter(3, clock))
    admin = Api(app.test_client())
    admin.make_dataset(budget={"epsilon": 10})
    service = admin.as_key(admin.make_consumer("svc", datasets=["clicks"]))
    answers = [service.charge(epsilon=0.1) for _ in range(4)]
    assert [a.status_code for a in answers] == [201, 201, 201, 429]
    refused = answers[-1]
    assert refused.content_type == "application/problem+json"
    body = refused.get_json()
    assert body["scope"] == "rate" and body["limit"] == 3 and body["status"] == 429
    assert refused.headers["Retry-After"] == "1" and "retry in 1 s" in body["detail"]
    # the admin's key has its own bucket: two requests made, one left, then none
    assert [admin.get("/v1/datasets").status_code for _ in range(2)] == [200, 429]
    assert admin.client.get("/healthz").status_code == 200  # no key, no limit
    clock.now += 1  # a second later each key may send 3 more
    # the refused charge ran nothing and charged nothing
    assert admin.budget()["loss"]["epsilon"] == pytest.approx(0.3)
    assert len([e for e in admin.ledger() if e["kind"] == "charge"]) == 3
    assert service.charge(epsilon=0.1).status_code == 201


def test_no_rate_limit_unless_configured(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    assert {api.charge(epsilon=0.01).status_code for _ in range(30)} == {201}


@pytest.mark.parametrize("raw", ["0", "-1", "fast"])
def test_a_rate_limit_that_is_not_a_positive_integer_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("ACCOUNTANT_RATE_LIMIT", raw)
    with pytest.raises(ConfigError, match="ACCOUNTANT_RATE_LIMIT"):
        load_settings()


def test_many_busy_keys_are_walked_again_only_once_they_have_doubled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("accountant.rate_limit._KEPT", 2)
    limiter = RateLimiter(1, _Clock())  # the clock stands still: no bucket refills
    for key in "abc":
        assert limiter.wait(key) is None
    assert len(limiter._buckets) == 3 and limiter._prune_at == 6  # none full, none dropped
    for key in "def":
        assert limiter.wait(key) is None
    assert limiter._prune_at == 6  # six buckets: no walk until a seventh
