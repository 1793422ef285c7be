"""Group commit on each real backend: charges that queue for a dataset while its transaction
runs join it; one refused before its writes is refused alone and the others commit once;
one that fails after its writes takes only itself down, as the others run again alone; a
duplicate key sends each back to a transaction of its own; one that is never taken is
refused in time."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import bindparam, insert, literal_column
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from accountant.deadline import remaining, request_deadline
from accountant.driver import Driver
from accountant.group_commit import GroupCommit, Transaction
from accountant.models import Partition
from accountant.services import charges
from accountant.services.api_keys import authenticate
from accountant.services.evaluation import ChargeRequest
from accountant.statements import Block, Write, WritePlan, statement

PARTITION = statement(
    insert(Partition).values(
        dataset_id=literal_column("1"), key=bindparam("k"), created_at=literal_column("0")
    )
)
Work = Callable[[Transaction], Any]


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
    """A thread that runs ``work`` in ``group``'s transactions, with a connection of its own,
    as ``services.charges.submit`` runs a charge."""

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
            # the last run's value, once its transaction committed
            self.value = self.group.run("clicks", self.driver, self.work)
        except BaseException as error:
            self.error = error
        finally:
            self.driver.close()
            self.ended.set()


#: Every run of a unit of work: (its key, the connection it ran on), in order.
RUNS: list[tuple[str, int]] = []


def _writes(key: str) -> WritePlan:
    return WritePlan((Block((Write(PARTITION, {"k": key}),)),))


def _insert(key: str) -> Work:
    def work(tx: Transaction) -> tuple[str, int]:
        RUNS.append((key, id(tx.driver)))
        tx.apply(_writes(key))
        return key, id(tx.driver)

    return work


def _raise(key: str) -> Work:
    """Fails after its writes: the transaction ends with it."""

    def work(tx: Transaction) -> None:
        RUNS.append((key, id(tx.driver)))
        tx.apply(_writes(key))
        raise ValueError(f"{key} refused")

    return work


def _refuse(key: str) -> Work:
    """Refused before any write: its outcome alone."""

    def work(tx: Transaction) -> None:
        RUNS.append((key, id(tx.driver)))
        raise ValueError(f"{key} refused")

    return work


@pytest.fixture(autouse=True)
def _no_runs_yet() -> None:
    RUNS.clear()


@pytest.fixture
def queued() -> Iterator[Callable[..., list[_Caller]]]:
    """Start callers so that the first one's work waits until every other one is queued
    behind it (its ``first_work`` runs then)."""
    started: list[_Caller] = []

    def start(group: GroupCommit, engine: Any, first: Work, *others: Work) -> list[_Caller]:
        running, ready = threading.Event(), threading.Event()

        def first_work(tx: Transaction) -> Any:
            running.set()
            assert ready.wait(30)
            return first(tx)

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
    assert leader.driver is not None and others[2].driver is not None
    # a, b and c ran on the leader's connection; c's error after its writes ended the
    # transaction, and each ran again, alone, on its own, before d, which came after.
    shared = id(leader.driver)
    alone = [(key, id(c.driver)) for key, c in zip("abc", (leader, *others[:2]), strict=True)]
    d = ("d", id(others[2].driver))
    assert [("a", shared), ("b", shared), ("c", shared), *alone, d] == RUNS
    assert [c.value for c in (leader, others[0], others[2])] == [
        (key, id(c.driver)) for key, c in zip("abd", (leader, others[0], others[2]), strict=True)
    ]
    assert isinstance(others[1].error, ValueError)
    assert _keys(engine) == ["a", "b", "d"]  # c's own write was rolled back with it
    assert group.waiting("clicks") == 0


def test_charges_refused_before_their_writes_leave_the_others_to_commit_once(
    engine: Any, queued: Callable[..., list[_Caller]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal is its own outcome: it ends nothing and reruns nothing."""
    commits: list[int] = []
    commit = Driver.commit

    def counted(self: Driver) -> None:
        commits.append(1)
        commit(self)

    monkeypatch.setattr(Driver, "commit", counted)
    observed: list[tuple[str, float, int]] = []
    group = GroupCommit(wait_s=30, observe=lambda *seen: observed.append(seen))
    callers = queued(
        group, engine, _insert("a"), _refuse("b"), _insert("c"), _refuse("d"), _insert("e")
    )
    for caller in callers:
        assert caller.ended.wait(30)
    # one transaction of five units, begun before the first waited for the rest
    assert [(dataset, units) for dataset, _, units in observed] == [("clicks", 5)]
    assert observed[0][1] > 0
    assert callers[0].driver is not None
    assert [(key, id(callers[0].driver)) for key in "abcde"] == RUNS  # each ran once
    assert [callers[i].value[0] for i in (0, 2, 4)] == ["a", "c", "e"]
    assert all(isinstance(callers[i].error, ValueError) for i in (1, 3))
    assert len(commits) == 1
    assert _keys(engine) == ["a", "c", "e"]


def test_an_observer_that_fails_fails_no_unit_of_work(
    engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def observe(dataset: str, seconds: float, units: int) -> None:
        raise OSError("the metrics folder is gone")

    group = GroupCommit(wait_s=30, observe=observe)
    driver = Driver.checkout(engine)
    try:
        assert group.run("clicks", driver, _insert("a")) == ("a", id(driver))
    finally:
        driver.close()
    assert _keys(engine) == ["a"]
    assert "could not observe a transaction" in caplog.text


def test_a_transaction_that_failed_is_not_observed(engine: Any) -> None:
    """A database error is not a refusal: the unit that met it (reading a dataset that may
    not exist) must still name no label of its caller's choice."""
    observed: list[tuple[str, float, int]] = []

    def broken(tx: Transaction) -> None:
        raise OperationalError("SELECT", None, Exception("disk I/O error"))

    group = GroupCommit(wait_s=30, observe=lambda *seen: observed.append(seen))
    driver = Driver.checkout(engine)
    try:
        with pytest.raises(OperationalError):
            group.run("no-such-dataset", driver, broken)
    finally:
        driver.close()
    assert observed == []


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

    def slow(tx: Transaction) -> str:
        tx.apply(_writes("slow"))
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
            results[number] = []
            for i in range(25):
                key, _ = group.run("clicks", driver, _insert(f"t{number}-{i}"))
                results[number].append(key)
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

    def note_backend(tx: Transaction) -> str:
        backend.append(tx.driver.row("SELECT pg_backend_pid() AS pid").pid)
        tx.apply(_writes("a"))
        return "a"

    def end_connection(tx: Transaction) -> str:
        tx.apply(_writes("c"))
        run_sql(database_url, f"SELECT pg_terminate_backend({backend[0]})")
        return "c"

    callers = queued(GroupCommit(wait_s=30), engine, note_backend, _insert("b"), end_connection)
    for caller in callers:
        assert caller.ended.wait(30)
    assert [caller.value for caller in callers] == [None, None, None]
    assert all(isinstance(caller.error, DBAPIError) for caller in callers)
    assert _keys(engine) == []


def test_a_403_and_a_400_in_the_middle_of_a_group_leave_the_others_to_commit_once(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real charges, queued behind one whose mechanism is still running: a caller without
    a grant (403) and a request that cannot be priced (400) are refused alone; every other
    charge runs its mechanism once, and one commit makes them all durable."""
    from tests.conftest import ADMIN_KEY, Api

    api = Api(app.test_client())
    api.make_dataset(budget={"epsilon": 10})
    stranger = api.make_consumer("stranger")  # a service with no grant on clicks
    runtime = app.extensions["accountant"]
    laplace = runtime.registry.get("laplace")
    runs: list[int] = []
    running, ready = threading.Event(), threading.Event()

    def run(params: Any, data: Any, source: Any) -> Any:
        runs.append(int(data["values"][0]))
        if len(runs) == 1:
            running.set()
            assert ready.wait(30)
        return laplace.run(params, data, source)

    mechanism = replace(laplace, run=run)
    commits: list[int] = []
    commit = Driver.commit

    def counted(self: Driver) -> None:
        commits.append(1)
        commit(self)

    monkeypatch.setattr(Driver, "commit", counted)
    reader = Driver.checkout(runtime.engine)
    admin = authenticate(reader, runtime.key_hasher(ADMIN_KEY))
    other = authenticate(reader, runtime.key_hasher(stranger))
    reader.end_read()
    reader.close()

    def request(number: int, caller: Any, unit: str | None = None) -> ChargeRequest:
        return ChargeRequest(
            dataset="clicks",
            partitions=["p1"],
            release="joint",
            mechanism=mechanism,
            params={"epsilon": Decimal("0.1"), "sensitivity": Decimal(1)},
            sensitivity_unit=unit,
            principal=caller,
            data={"values": [float(number)]},
            noise_secret=runtime.charging.noise.id,
            fingerprint=str(number),
        )

    outcomes: dict[int, Any] = {}

    def submit(number: int, charge: ChargeRequest) -> None:
        connection = Driver.checkout(runtime.engine)
        try:
            outcomes[number] = charges.submit(connection, charge, runtime.charging)
        except Exception as error:
            outcomes[number] = error
        finally:
            connection.close()

    group = runtime.charging.group
    requests = [
        request(1, admin),
        request(2, admin),
        request(3, other),  # 403: no grant
        request(4, admin, unit="record"),  # 400: record-level sensitivity on a record dataset
        request(5, admin),
    ]
    threads = [threading.Thread(target=submit, args=(n, r)) for n, r in enumerate(requests, 1)]
    threads[0].start()
    assert running.wait(30)
    for count, thread in enumerate(threads[1:], 1):
        thread.start()
        _until(lambda: group.waiting("clicks") == count)  # noqa: B023  # called at once
    ready.set()
    for thread in threads:
        thread.join(30)
    assert [type(outcomes[n]).__name__ for n in range(1, 6)] == [
        "Granted",
        "Granted",
        "Forbidden",
        "InvalidRequest",
        "Granted",
    ]
    assert runs == [1, 2, 5]  # each mechanism ran once
    assert len(commits) == 1  # one transaction, committed once
    assert [e["status"] for e in api.ledger() if e["kind"] == "charge"] == ["granted"] * 3
    assert api.budget()["loss"]["epsilon"] == pytest.approx(0.3)  # three grants on p1


def test_a_queued_unit_run_by_the_leader_has_only_what_its_own_deadline_left(
    engine: Any,
) -> None:
    """A unit that waited in the queue runs, in the leader's thread, with its own request's
    budget less that wait: a stalled database cannot give it a whole deadline more."""
    group = GroupCommit(wait_s=30)
    running, release = threading.Event(), threading.Event()
    seen: dict[str, float] = {}

    def hold(tx: Transaction) -> Any:
        running.set()
        assert release.wait(30)
        return _insert("a")(tx)

    def measured(tx: Transaction) -> Any:
        seen["inside"] = remaining(100.0)
        return _insert("b")(tx)

    def follow() -> None:
        driver = Driver.checkout(engine)
        try:
            with request_deadline(1.0):
                group.run("clicks", driver, measured)
                seen["after"] = remaining(100.0)
        finally:
            driver.close()

    leader = _Caller(group, engine, hold)
    leader.start()
    assert running.wait(30)
    follower = threading.Thread(target=follow)
    follower.start()
    _until(lambda: group.waiting("clicks") == 1)
    threading.Event().wait(0.5)  # the follower waits half its budget in the queue
    release.set()
    follower.join(30)
    assert leader.ended.wait(30)
    assert seen["inside"] <= 0.6  # 1.0 s less the wait, not its whole budget
    assert 0 < seen["after"] <= seen["inside"]  # and never more after it
    assert _keys(engine) == ["a", "b"]


def test_units_are_taken_one_at_a_time_so_one_queued_behind_a_slow_one_still_gives_up(
    engine: Any, queued: Callable[..., list[_Caller]]
) -> None:
    """The leader takes the next queued unit only when it is about to run it: a unit behind a
    slow one is not held past the lock timeout, it is refused (a 503) and never runs."""
    group = GroupCommit(wait_s=0.3)

    def slow(tx: Transaction) -> Any:
        threading.Event().wait(0.9)  # longer than the lock timeout of the units behind it
        return _insert("b")(tx)

    callers = queued(group, engine, _insert("a"), slow, _insert("c"))
    for caller in callers:
        assert caller.ended.wait(30)
    assert [callers[0].value[0], callers[1].value[0]] == ["a", "b"]
    assert isinstance(callers[2].error, OperationalError)
    assert "no write lock within 0.3 s" in str(callers[2].error)
    assert _keys(engine) == ["a", "b"]
    assert group.waiting("clicks") == 0
