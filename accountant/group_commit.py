"""Group commit: the charges that queue for one dataset share one transaction.

Every charge of a dataset takes the same lock (the dataset's row), so a
dataset's charges run one at a time, and each pays for a commit of its own:
an fsync of SQLite's WAL, or a flush and a round trip on PostgreSQL, while
the next charges wait. So, within one process, the charges waiting for a
dataset share the transaction of the one running, on its connection, and
one commit.

A unit of work is a function of the transaction it runs in (``Transaction``:
its connection, and ``apply`` for its writes)::

    def unit(tx):
        reads = read(tx.driver, ...)
        ...                       # decide, run the mechanism
        tx.apply(plan)            # the writes
        return ...

    value = group.run(dataset, driver, unit)  # committed when it returns

The first unit of a dataset leads: its thread begins the transaction on its
own connection and runs its unit, then the units queued meanwhile, one after
the other, up to ``MAX_BATCH`` in all, each in its own thread's context (its
request's deadline: ``contextvars``), and commits. A unit queued behind it
does not run in its own thread: its thread sleeps until its outcome is known,
so that no thread has to be woken, and wait for a CPU, while the dataset's
lock is held. Then every unit's ``run`` returns (none before the commit:
until then a unit of work may still fail), and the first unit queued since
leads the next transaction. Each unit is what it would be alone: it reads the
totals as the ones before it left them, and writes or is refused.

How a unit ends decides what happens to the transaction:

- it returns: its writes wait for the commit;
- it raises before ``apply`` (a 403, a 400, a failed mechanism): it wrote
  nothing, so that is its own outcome alone, and the transaction goes on;
- it raises after ``apply``, or a database error ends the transaction
  (whichever unit meets it): every unit of the transaction has failed. In a
  shared transaction, a duplicate key that another transaction committed
  meanwhile (``IntegrityError``), or a unit that raised after its writes,
  sends each unit that was not refused back to run again, in a transaction
  of its own on its own thread's connection, before any other: the one at
  fault fails again by itself, and what it wrote never reaches anyone's
  commit. A duplicate key that a lone unit meets sends it back once if its
  work expects one (an idempotency key committed by another transaction
  between its read and its write). Any other database error is every
  unit's. Such errors are rare (a denial is not one), and savepoints, which
  would undo one unit alone, would cost every grouped charge two statements
  more.

A unit not taken into a transaction within the lock timeout is refused as
one that waits that long for the lock is (a 503); the leader takes the units
queued one at a time, as it is about to run each, so a unit queued behind a
slow one still gives up in time. Once taken, it waits for the leader, whose
every wait for the database has a deadline. A unit's waits, in the queue and
for the commit, count against its own request's budget (``deadline``) before
its unit runs and once its outcome is known, so the statements the leader
runs for it have only what is left of that budget. A unit that no other
joins runs alone: one transaction, one commit.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from typing import Any, Generic, TypeVar

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from accountant.deadline import remaining, waited_since
from accountant.driver import Driver
from accountant.statements import WritePlan

T = TypeVar("T")
log = logging.getLogger(__name__)

#: At most this many units of work share a transaction, so that a long queue still
#: commits often.
MAX_BATCH = 32

#: A unit of work runs at most this many times: in a shared transaction, again alone
#: when that one failed through no fault of its own, and once more after a duplicate key
#: (which it then reads).
MAX_ATTEMPTS = 3


class Transaction:
    """What a unit of work sees of the transaction it runs in: its connection, and
    ``apply`` for its writes."""

    __slots__ = ("applied", "driver")

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.applied = False

    def apply(self, plan: WritePlan) -> None:
        """Run ``plan``'s writes in the transaction. From here on, an error ends the
        transaction, and with it every unit of work in it."""
        self.applied = True
        self.driver.apply(plan)


class GroupCommit:
    """The queues of one process's units of work, by dataset; see the module's notes."""

    def __init__(
        self,
        wait_s: float,
        max_batch: int = MAX_BATCH,
        observe: Callable[[str, float, int], None] | None = None,
    ) -> None:
        """``observe(dataset, seconds, units)``: told of each transaction that committed a
        unit of work that was not refused, once it has ended, how long it took from the end
        of ``begin_write`` (SQLite: the write lock taken; PostgreSQL: before BEGIN is sent)
        to the end of COMMIT, and how many units of work it ran; its failure is logged,
        never the transaction's."""
        self._wait_s = wait_s
        self._max_batch = max_batch
        self._observe = observe
        self._mutex = threading.Lock()
        self._queues: dict[str, _Queue] = {}

    def run(
        self,
        dataset: str,
        driver: Driver,
        work: Callable[[Transaction], T],
        *,
        duplicates: bool = False,
    ) -> T:
        """``work``'s value, once the transaction it ran in on ``dataset`` has committed;
        perhaps shared with other threads' work (see the module's notes). ``driver`` is this
        thread's connection, used when it leads. ``duplicates``: the work writes a unique
        key that another transaction may commit between its read and its write (an
        idempotency key), so a duplicate key it meets alone sends it back once, to read what
        was committed; any other is an error."""
        context = contextvars.copy_context()
        unit: _Unit[T] = _Unit(work, context, driver, MAX_ATTEMPTS - 1, duplicates=duplicates)
        while True:
            unit.since = time.monotonic()
            self._wait_turn(dataset, unit)
            if not unit.lead:  # taken: its outcome, or placed: its turn to lead
                unit.ready.wait()
            if unit.lead:
                self._lead(dataset, unit)
            else:  # waiting for the commit since its unit ran (or for ever) is waiting
                waited_since(unit.since)
            if unit.again is None:
                return unit.outcome()
            unit = unit.again

    def waiting(self, dataset: str) -> int:
        """How many units of work on ``dataset`` wait to be taken into a transaction."""
        with self._mutex:
            queue = self._queues.get(dataset)
            return 0 if queue is None else len(queue.waiting)

    def _wait_turn(self, dataset: str, unit: _Unit[Any]) -> None:
        """Queue ``unit`` (unless a failed transaction placed it first already), and wait
        until it leads a transaction or is taken into one; refused (a 503) if neither
        happens within the lock timeout."""
        with self._mutex:
            queue = self._queues.setdefault(dataset, _Queue())
            if not unit.placed:
                if queue.leading:
                    queue.waiting.append(unit)
                else:
                    queue.leading = unit.lead = True
        if unit.lead or unit.taken:
            return
        # The wait counts against the request's budget as its unit runs (``_Unit._counted``),
        # or once its outcome is known (``run``).
        if unit.ready.wait(remaining(self._wait_s)):
            return
        with self._mutex:
            if not (unit.taken or unit.lead):
                queue.waiting.remove(unit)
                raise OperationalError(
                    "BEGIN",
                    None,
                    TimeoutError(f"database is locked: no write lock within {self._wait_s:g} s"),
                )

    def _take(self, dataset: str, members: list[_Unit[Any]]) -> _Unit[Any] | None:
        """The first unit queued for ``dataset``, taken into the transaction of ``members``,
        if it has room (one at a time: a unit not taken yet may still give up in time)."""
        with self._mutex:
            queue = self._queues[dataset]
            if not queue.waiting or len(members) >= self._max_batch:
                return None
            taken = queue.waiting.pop(0)
            taken.taken = True
        members.append(taken)
        return taken

    def _lead(self, dataset: str, leader: _Unit[Any]) -> None:
        """BEGIN on ``leader``'s connection; run its unit, then those queued meanwhile while
        there is room and nothing failed; then commit, or roll back, say what became of
        each, and pass the lead on."""
        waited_since(leader.since)  # for its turn to lead
        driver = leader.own
        stack = ExitStack()  # the pipeline the transaction's statements go through
        try:
            driver.begin_write()
            stack.enter_context(driver.pipeline())
        except BaseException as error:  # a failed BEGIN is this unit's failure alone
            leader.error = error
            self._pass_lead(dataset, [])
            return
        leader.since = begun = time.monotonic()  # BEGIN counted its own wait
        members = [leader]
        failed: BaseException | None = None
        try:
            running: _Unit[Any] | None = leader
            while running is not None:
                running.run_in(driver)
                # placed: a transaction of its own
                running = None if leader.placed else self._take(dataset, members)
            driver.commit()
            stack.close()  # PostgreSQL: waits for every statement, and the COMMIT
        except BaseException as error:
            failed = error
            # What ended the transaction is the answer, whatever ending it raises: a lost
            # connection fails its rollback too, and the pool discards it.
            with suppress(Exception):
                stack.__exit__(type(error), error, error.__traceback__)
            with suppress(Exception):
                driver.rollback()
        took = time.monotonic() - begun
        first = [] if failed is None else _after_failure(failed, members)
        self._pass_lead(dataset, first)
        for unit in members:
            unit.ready.set()
        # Only a transaction that committed a unit that found its dataset is told: one whose
        # every unit was refused (a 404 among them) would let a caller add a label of any name.
        found = failed is None and any(not unit.refused for unit in members)
        if self._observe is not None and found:  # after the others are woken, outside the lock
            try:
                self._observe(dataset, took, len(members))
            except Exception as error:  # a metric's file may fail to write; never the units
                log.error("could not observe a transaction", extra={"error": repr(error)[:200]})

    def _pass_lead(self, dataset: str, first: list[_Unit[Any]]) -> None:
        """Hand the dataset's lead to ``first`` (units to run again, in order) and then to
        the units queued, or let it go."""
        with self._mutex:
            queue = self._queues[dataset]
            queue.waiting[:0] = first
            if queue.waiting:
                leader = queue.waiting.pop(0)
                leader.lead = True
                leader.ready.set()
            else:
                queue.leading = False
                del self._queues[dataset]


class _Queue:
    __slots__ = ("leading", "waiting")

    def __init__(self) -> None:
        self.waiting: list[_Unit[Any]] = []
        self.leading = False


class _Unit(Generic[T]):
    """One attempt of a unit of work: the work, its thread's context and connection, its
    place in the queue, and what became of it."""

    __slots__ = (
        "again",
        "attempts_left",
        "context",
        "duplicates",
        "error",
        "lead",
        "own",
        "placed",
        "ready",
        "refused",
        "since",
        "taken",
        "value",
        "work",
    )

    def __init__(
        self,
        work: Callable[[Transaction], T],
        context: contextvars.Context,
        own: Driver,
        attempts_left: int,
        *,
        duplicates: bool,
        placed: bool = False,
    ) -> None:
        self.work, self.context, self.own = work, context, own
        self.attempts_left, self.duplicates = attempts_left, duplicates
        # ``placed``: put first in the queue by the transaction that failed, to run alone
        self.placed = self.taken = placed
        self.lead = self.refused = False
        self.ready = threading.Event()  # set when it is to lead, or its outcome is known
        self.value: T | None = None
        self.error: BaseException | None = None
        self.again: _Unit[T] | None = None  # the attempt to run its work in again
        #: since when it waits (``time.monotonic``), as yet uncounted against its budget
        self.since = time.monotonic()

    def run_in(self, driver: Driver) -> None:
        """Run the work in the transaction on ``driver``, in its own thread's context. An
        exception before its writes is its own outcome (``refused``); any other ends the
        transaction."""
        tx = Transaction(driver)
        try:
            self.value = self.context.run(self._counted, tx)
        except Exception as error:
            if tx.applied or isinstance(error, DBAPIError):
                raise
            self.refused, self.error = True, error  # it wrote nothing: its own outcome

    def _counted(self, tx: Transaction) -> T:
        """The work, in the unit's context, its wait until now counted against its budget
        first, and its wait for the commit timed from its end."""
        waited_since(self.since)
        try:
            return self.work(tx)
        finally:
            self.since = time.monotonic()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set whenever no error is


def _after_failure(failed: BaseException, members: list[_Unit[Any]]) -> list[_Unit[Any]]:
    """Say what became of each unit of a transaction that ``failed`` ended: failed too,
    or to run again (``_again``). The units to run again alone, first, in order."""
    again = _again(failed, len(members) > 1)
    first: list[_Unit[Any]] = []
    for unit in members:
        if unit.refused:
            continue
        unit.value = None
        if again is None or unit.attempts_left == 0 or (again == "queued" and not unit.duplicates):
            unit.error = failed
            continue
        alone = again == "alone"
        unit.again = _Unit(
            unit.work,
            unit.context,
            unit.own,
            unit.attempts_left - 1,
            duplicates=unit.duplicates,
            placed=alone,
        )
        if alone:
            first.append(unit.again)
    return first


def _again(error: BaseException, shared: bool) -> str | None:
    """Whether the units of a transaction that ``error`` ended should run again: each
    ``"alone"`` when it was shared and a unit raised after its writes (it fails again by
    itself, and what it wrote never reaches the others' commit) or met a duplicate key;
    ``"queued"`` for a lone unit that met a duplicate key (another transaction may have
    committed the same key meanwhile: its work, run again, reads it; ``run``'s
    ``duplicates`` says whether it may); None when the database failed, which is every
    unit's error, or a lone unit's work did."""
    if isinstance(error, DBAPIError):
        if isinstance(error, IntegrityError):
            return "alone" if shared else "queued"
        return None
    return "alone" if shared and isinstance(error, Exception) else None
