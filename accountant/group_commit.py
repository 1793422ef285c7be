"""Group commit: the charges that queue for one dataset share one transaction.

Every charge of a dataset takes the same lock (the dataset's row), so a
dataset's charges run one at a time, and each pays for a commit of its own:
an fsync of SQLite's WAL, or a flush and a round trip on PostgreSQL, while
the next charges wait. So, within one process, the charges waiting for a
dataset run together, in one thread (the leader): one transaction, each
charge in turn as it would run alone, one commit for all of them.

Each charge is what it was alone: it takes the dataset's lock (which its
transaction already holds), reads the totals as the charges before it left
them, and writes or is refused (a refusal for want of budget is an outcome,
not an error). A charge's outcome is handed to its thread only once the
commit has returned: until then every charge of the transaction counts as
failed, so a commit that fails, or a connection lost before it, answers
none of them as granted.

A charge that raises (a 403, a 404, a failed mechanism) ends the
transaction, and with it whatever the charges before it wrote. Alone, it
has failed. With others, each of them runs again in a transaction of its
own, as if they had never met: the one that raised fails again by itself,
and what it may have written before it raised never reaches anyone's
commit. So does a duplicate key that another transaction committed
meanwhile (an ``IntegrityError``); any other database error is every
charge's. Such errors are rare (a denial is not one), and savepoints, which
would undo a charge alone, would cost every grouped charge two statements
more.

The leader begins with its own charge, then takes the charges that queued
meanwhile, again and again while any are queued, up to ``MAX_BATCH`` in all;
then it commits, hands each thread its outcome and passes the lead to the
first thread still queued. A thread whose charge is not taken within the
lock timeout is refused as one that waits that long for the lock is (a
503); once taken, it waits for the leader, whose every wait for the
database has a deadline. A lone charge runs exactly as before: one
transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from accountant.deadline import remaining, spent
from accountant.driver import Driver

T = TypeVar("T")

#: At most this many charges share a transaction, so that a long queue still commits often.
MAX_BATCH = 32


class _Slot(Generic[T]):
    """One charge in the queue: its work, and what became of it."""

    __slots__ = ("done", "error", "lead", "taken", "value", "work")

    def __init__(self, work: Callable[[Driver], T]) -> None:
        self.work = work
        self.done = threading.Event()  # set when its outcome is known, or it is to lead
        self.lead = False
        self.taken = False
        self.value: T | None = None
        # Until its transaction commits, a charge has failed: nothing it did is durable.
        self.error: BaseException | None = OperationalError(
            "COMMIT", None, RuntimeError("the transaction ended before the charge was committed")
        )

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set whenever no error is


class _Queue:
    __slots__ = ("leading", "waiting")

    def __init__(self) -> None:
        self.waiting: list[_Slot[object]] = []
        self.leading = False


class GroupCommit:
    """The queues of one process's charges, by dataset; see the module's notes."""

    def __init__(self, wait_s: float, max_batch: int = MAX_BATCH) -> None:
        self._wait_s = wait_s
        self._max_batch = max_batch
        self._mutex = threading.Lock()
        self._queues: dict[str, _Queue] = {}

    def run(self, dataset: str, driver: Driver, work: Callable[[Driver], T]) -> T:
        """``work(driver)`` inside a transaction on ``dataset``, committed before it returns,
        perhaps shared with other threads' work on the same dataset. ``driver`` is this
        thread's connection, used if this thread leads."""
        slot: _Slot[T] = _Slot(work)
        with self._mutex:
            queue = self._queues.setdefault(dataset, _Queue())
            queue.waiting.append(slot)  # type: ignore[arg-type]  # a queue holds any T
            if not queue.leading:
                queue.leading = slot.lead = True
        if not slot.lead:
            with spent():  # waiting for the lock, or for the leader's commit, is waiting
                if not slot.done.wait(remaining(self._wait_s)):
                    with self._mutex:
                        if not (slot.taken or slot.lead):
                            queue.waiting.remove(slot)  # type: ignore[arg-type]  # as above
                            raise self._timed_out()
                slot.done.wait()
        if slot.lead:  # its charge is first in the queue
            self._lead(dataset, queue, driver)
        return slot.outcome()

    def waiting(self, dataset: str) -> int:
        """How many charges of ``dataset`` wait to be taken into a transaction."""
        with self._mutex:
            queue = self._queues.get(dataset)
            return 0 if queue is None else len(queue.waiting)

    def _lead(self, dataset: str, queue: _Queue, driver: Driver) -> None:
        taken: list[_Slot[object]] = []

        def take(most: int) -> list[_Slot[object]]:
            """Up to ``most`` of the charges queued now, within the transaction's room."""
            with self._mutex:
                room = min(most, self._max_batch - len(taken))
                more = queue.waiting[:room]
                del queue.waiting[:room]
                for slot in more:
                    slot.taken = True
            taken.extend(more)
            return more

        try:
            if not _transaction(driver, take, taken):
                for slot in taken:  # each again, alone
                    _transaction(driver, _only(slot), [slot])
        finally:
            with self._mutex:
                if queue.waiting:
                    queue.waiting[0].lead = True
                    queue.waiting[0].done.set()
                else:
                    queue.leading = False
                    del self._queues[dataset]
            for slot in taken:
                slot.done.set()

    def _timed_out(self) -> OperationalError:
        return OperationalError(
            "BEGIN",
            None,
            TimeoutError(f"database is locked: no write lock within {self._wait_s:g} s"),
        )


Take = Callable[[int], list[_Slot[object]]]


def _transaction(driver: Driver, take: Take, taken: list[_Slot[object]]) -> bool:
    """Run in one transaction the charges ``take`` gives, until it gives none; ``taken``
    lists them. Each is given its value only once the commit has returned; until then, and
    whatever fails, each has failed. A charge that raises ends the transaction: alone, it
    has failed; with others, False says to run each again alone (``_again_alone``)."""
    decided: list[tuple[_Slot[object], object]] = []
    first = take(1)  # a failed BEGIN is its failure alone
    try:
        driver.begin_write()
        with driver.pipeline():
            for slot in first:
                decided.append((slot, slot.work(driver)))
            while more := take(MAX_BATCH):  # those queued meanwhile join, while there is room
                decided.extend((slot, slot.work(driver)) for slot in more)
            driver.commit()
    except BaseException as error:
        for slot in taken:  # before the rollback, which may fail too on a lost connection
            slot.value, slot.error = None, error
        driver.rollback()
        return len(taken) == 1 or not _again_alone(error)
    for slot, value in decided:
        slot.value, slot.error = value, None
    return True


def _again_alone(error: BaseException) -> bool:
    """Whether the charges of a transaction that ``error`` ended should each run again in
    one of their own: yes when a charge raised (its refusal or failure: it fails again
    alone, and what it wrote before it raised never reaches the others' commit) or met a
    duplicate key that another transaction committed meanwhile; no when the database failed,
    which is every charge's error."""
    if isinstance(error, DBAPIError):
        return isinstance(error, IntegrityError)
    return isinstance(error, Exception)


def _only(slot: _Slot[object]) -> Take:
    """A ``take`` that gives ``slot``, then nothing."""
    given = [slot]

    def take(_most: int) -> list[_Slot[object]]:
        more = given[:]
        given.clear()
        return more

    return take
