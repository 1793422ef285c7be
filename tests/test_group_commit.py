"""Group commit on each real backend: charges that queue for a dataset while its transaction
runs join it; one that fails takes only itself down, as the others run again alone; a
duplicate key sends each back to a transaction of its own; one that is never taken is
refused in time."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from accountant.driver import Driver
from accountant.group_commit import GroupCommit

PARTITION = "INSERT INTO partitions (dataset_id, key, created_at) VALUES (1, :k, 0)"
Work = Callable[[Driver], Any]


@pytest.fixture
def engine(app: Flask) -> Any:
    from tests.conftest import Api

    Api(app.test_client()).make_dataset()
    return app.extensions["accountant"].engine


def _keys(engine: Any) -> list[str]:
    reader = Driver.checkout(engine)
    try:
        return [row.key for row in reader.rows("SELECT key FROM partitions ORDER BY key")]
    finally:
        reader.close()


class _Caller(threading.Thread):
    """A thread that runs ``work`` through ``group`` on a connection of its own."""

    def __init__(self, group: GroupCommit, engine: Any, work: Work) -> None:
        super().__init__()
        self.group, self.engine, self.work = group, engine, work
        self.value: Any = None
        self.error: BaseException | None = None
        self.driver: Driver | None = None
        self.ended = threading.Event()

    def run(self) -> None:
        self.driver = Driver.checkout(self.engine)
        try:
            self.value = self.group.run("clicks", self.driver, self.work)
        except BaseException as error:
            self.error = error
        finally:
            self.driver.close()
            self.ended.set()


def _insert(key: str) -> Work:
    def work(driver: Driver) -> tuple[str, int]:
        driver.run(PARTITION, {"k": key})
        return key, id(driver)

    return work


def _raise(key: str) -> Work:
    def work(driver: Driver) -> None:
        driver.run(PARTITION, {"k": key})
        raise ValueError(f"{key} refused")

    return work


@pytest.fixture
def queued() -> Iterator[Callable[..., list[_Caller]]]:
    """Start callers so that the first one's work waits until every other one is queued
    behind it (its ``first_work`` runs then)."""
    started: list[_Caller] = []

    def start(group: GroupCommit, engine: Any, first: Work, *others: Work) -> list[_Caller]:
        running, ready = threading.Event(), threading.Event()

        def first_work(driver: Driver) -> Any:
            running.set()
            assert ready.wait(30)
            return first(driver)

        callers = [_Caller(group, engine, first_work)]
        callers[0].start()
        assert running.wait(30)
        for count, work in enumerate(others, 1):  # queued in this order
            callers.append(_Caller(group, engine, work))
            callers[-1].start()
            _until(lambda: group.waiting("clicks") == count)  # noqa: B023  # called at once
        ready.set()
        started.extend(callers)
        return callers

    yield start
    for caller in started:
        caller.join(30)


def _until(condition: Callable[[], bool]) -> None:
    event = threading.Event()
    for _ in range(3000):
        if condition():
            return
        event.wait(0.01)
    raise AssertionError("the condition never held")


def test_charges_queued_behind_a_transaction_join_it_and_a_failing_one_rolls_back_alone(
    engine: Any, queued: Callable[..., list[_Caller]]
) -> None:
    group = GroupCommit(wait_s=30)
    leader, *others = queued(group, engine, _insert("a"), _insert("b"), _raise("c"), _insert("d"))
    for caller in (leader, *others):
        assert caller.ended.wait(30)
    assert leader.driver is not None
    # Every charge ran on the leader's connection: c's error ended the transaction, and
    # each ran again in one of its own.
    assert [c.value for c in (leader, others[0], others[2])] == [
        (key, id(leader.driver)) for key in "abd"
    ]
    assert isinstance(others[1].error, ValueError)
    assert _keys(engine) == ["a", "b", "d"]  # c's own write was rolled back with it
    assert group.waiting("clicks") == 0


def test_a_failing_first_charge_fails_alone_and_the_next_leads(
    engine: Any, queued: Callable[..., list[_Caller]]
) -> None:
    group = GroupCommit(wait_s=30)
    first, second, third = queued(group, engine, _raise("a"), _insert("b"), _insert("c"))
    for caller in (first, second, third):
        assert caller.ended.wait(30)
    assert isinstance(first.error, ValueError)
    assert second.driver is not None
    assert [second.value, third.value] == [("b", id(second.driver)), ("c", id(second.driver))]
    assert _keys(engine) == ["b", "c"]


def test_a_database_error_sends_each_charge_back_to_a_transaction_of_its_own(
    engine: Any, queued: Callable[..., list[_Caller]]
) -> None:
    group = GroupCommit(wait_s=30)
    callers = queued(
        group, engine, _insert("a"), _insert("twice"), _raise("c"), _insert("twice"), _insert("e")
    )
    for caller in callers:
        assert caller.ended.wait(30)
    # c's error ended the shared transaction; run again alone, c fails, and so does the
    # second "twice", on the first one's key.
    assert isinstance(callers[3].error, IntegrityError)
    assert isinstance(callers[2].error, ValueError)
    assert [callers[i].value[0] for i in (0, 1, 4)] == ["a", "twice", "e"]
    assert _keys(engine) == ["a", "e", "twice"]


def test_a_duplicate_key_met_in_a_shared_transaction_fails_only_its_own_charge(
    engine: Any, queued: Callable[..., list[_Caller]]
) -> None:
    group = GroupCommit(wait_s=30)
    callers = queued(group, engine, _insert("a"), _insert("twice"), _insert("twice"), _insert("d"))
    for caller in callers:
        assert caller.ended.wait(30)
    assert isinstance(callers[2].error, IntegrityError)
    assert [callers[i].value[0] for i in (0, 1, 3)] == ["a", "twice", "d"]
    assert _keys(engine) == ["a", "d", "twice"]


def test_a_charge_not_taken_within_the_wait_is_refused_and_never_runs(engine: Any) -> None:
    group = GroupCommit(wait_s=0.2)
    running, refused = threading.Event(), threading.Event()

    def slow(driver: Driver) -> str:
        driver.run(PARTITION, {"k": "slow"})
        running.set()
        assert refused.wait(30)  # holds the transaction until the other has given up
        return "slow"

    leader = _Caller(group, engine, slow)
    leader.start()
    assert running.wait(30)
    late = _Caller(group, engine, _insert("late"))
    late.start()
    assert late.ended.wait(30)
    refused.set()
    assert leader.ended.wait(30)
    assert isinstance(late.error, OperationalError)
    assert "no write lock within 0.2 s" in str(late.error)
    assert leader.value == "slow"
    assert _keys(engine) == ["slow"]
    assert group.waiting("clicks") == 0


def test_many_threads_each_get_their_own_results_and_every_write_is_committed(
    engine: Any,
) -> None:
    group = GroupCommit(wait_s=30, max_batch=4)
    results: dict[int, list[str]] = {}

    def caller(number: int) -> None:
        driver = Driver.checkout(engine)
        try:
            results[number] = [
                group.run("clicks", driver, _insert(f"t{number}-{i}"))[0] for i in range(25)
            ]
        finally:
            driver.close()

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {n: [f"t{n}-{i}" for i in range(25)] for n in range(8)}
    assert sorted(_keys(engine)) == sorted(f"t{n}-{i}" for n in range(8) for i in range(25))
    assert group.waiting("clicks") == 0


def test_a_connection_lost_before_the_commit_answers_no_charge_of_its_transaction(
    database_url: str, engine: Any, queued: Callable[..., list[_Caller]]
) -> None:
    """The server ends the leader's connection after every charge ran but before the commit:
    its rollback fails too, and still no caller is given a value, and nothing is written."""
    from tests.conftest import run_sql

    if not database_url.startswith("postgresql"):
        pytest.skip("a connection the server ends is PostgreSQL's")
    backend: list[int] = []

    def note_backend(driver: Driver) -> str:
        driver.run(PARTITION, {"k": "a"})
        backend.append(driver.row("SELECT pg_backend_pid() AS pid").pid)
        return "a"

    def end_connection(driver: Driver) -> str:
        driver.run(PARTITION, {"k": "c"})
        run_sql(database_url, f"SELECT pg_terminate_backend({backend[0]})")
        return "c"

    callers = queued(GroupCommit(wait_s=30), engine, note_backend, _insert("b"), end_connection)
    for caller in callers:
        assert caller.ended.wait(30)
    assert [caller.value for caller in callers] == [None, None, None]
    assert all(isinstance(caller.error, DBAPIError) for caller in callers)
    assert _keys(engine) == []
