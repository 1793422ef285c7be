"""Group commit: the charges that queue for one dataset share one transaction.

Every charge of a dataset takes the same lock (the dataset's row), so a
dataset's charges run one at a time, and each pays for a commit of its own:
an fsync of SQLite's WAL, or a flush and a round trip on PostgreSQL, while
the next charges wait. So, within one process, the charges waiting for a
dataset share the transaction of the one running, on its connection, and
one commit.

A unit of work runs in a ``with`` block, in its own thread::

    for tx in group.transactions(dataset, driver):
        with tx:                  # BEGIN, or join the transaction running
            reads = read(tx.driver, ...)
            ...                   # decide, run the mechanism
            tx.apply(plan)        # the writes
                                  # the block ends: COMMIT, or ROLLBACK

The first unit of work of a dataset leads: its ``with`` begins the
transaction on its own connection. Those that arrive meanwhile queue; as
each block ends, the next one queued runs its block in the same
transaction, in its own thread, one at a time, up to ``MAX_BATCH`` in all.
When none is left, the leader commits, every block's ``with`` returns (none
before the commit: until its ``with`` returns, a unit of work may still
fail), and the first unit queued since leads the next transaction. Each unit is what it
would be alone: it reads the totals as the ones before it left them, and
writes or is refused.

How a block ends decides what happens to the transaction:

- it ends normally: its writes wait for the commit;
- it raises before ``apply`` (a 403, a 400, a failed mechanism): it wrote
  nothing, so that is its own outcome alone, and the transaction goes on;
- it raises after ``apply``, or a database error ends the transaction
  (whichever block meets it): every unit of the transaction has failed. In a
  shared transaction, a duplicate key that another transaction committed
  meanwhile (``IntegrityError``), or a block that raised after its writes,
  sends each unit that was not refused back to run again, in a transaction
  of its own, before any other (``transactions`` gives it that
  transaction): the one at fault fails again by itself, and what it wrote
  never reaches anyone's commit. A duplicate key that a lone unit meets sends it back once if its
  work expects one (an idempotency key committed by another transaction
  between its read and its write). Any other database error is every
  unit's. Such errors are rare (a
  denial is not one), and savepoints, which would undo one unit alone, would
  cost every grouped charge two statements more.

A unit not taken into a transaction within the lock timeout is refused as
one that waits that long for the lock is (a 503); once taken, it waits for
the leader, whose every wait for the database has a deadline. A unit that no
other joins runs alone: one transaction, one commit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from types import TracebackType

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from accountant.deadline import remaining, spent
from accountant.driver import Driver
from accountant.statements import WritePlan

#: At most this many units of work share a transaction, so that a long queue still
#: commits often.
MAX_BATCH = 32

#: A unit of work runs at most this many times: in a shared transaction, again alone
#: when that one failed through no fault of its own, and once more after a duplicate key
#: (which it then reads).
MAX_ATTEMPTS = 3


class GroupCommit:
    """The queues of one process's units of work, by dataset; see the module's notes."""

    def __init__(self, wait_s: float, max_batch: int = MAX_BATCH) -> None:
        self._wait_s = wait_s
        self._max_batch = max_batch
        self._mutex = threading.Lock()
        self._queues: dict[str, _Queue] = {}

    def transactions(
        self, dataset: str, driver: Driver, *, duplicates: bool = False
    ) -> Iterator[Transaction]:
        """The transactions to run one unit of work on ``dataset`` in, one after the other
        (each in a ``with`` block): the first perhaps shared with other threads' work, and
        another only when that one failed in a way that running again may mend (see the
        module's notes). ``driver`` is this thread's connection, used when it leads.
        ``duplicates``: the work writes a unique key that another transaction may commit
        between its read and its write (an idempotency key), so a duplicate key it meets
        alone sends it back once, to read what was committed; any other is an error."""
        tx = Transaction(self, dataset, driver, MAX_ATTEMPTS - 1, duplicates=duplicates)
        try:
            while True:
                yield tx
                if tx.again is None:
                    return
                tx = tx.again
        finally:
            if tx.again is None and not tx.entered:
                self._abandon(tx)

    def waiting(self, dataset: str) -> int:
        """How many units of work on ``dataset`` wait to be taken into a transaction."""
        with self._mutex:
            queue = self._queues.get(dataset)
            return 0 if queue is None else len(queue.waiting)

    def _queue_up(self, tx: Transaction) -> None:
        """Lead ``tx``'s dataset's next transaction, or queue for it."""
        with self._mutex:
            queue = self._queues.setdefault(tx.dataset, _Queue())
            if queue.leading:
                queue.waiting.append(tx)
            else:
                queue.leading = tx.lead = True

    def _take(self, run: _Run) -> Transaction | None:
        """The first unit queued for ``run``'s dataset, taken into it, if it has room."""
        with self._mutex:
            queue = self._queues[run.dataset]
            if not queue.waiting or len(run.members) >= self._max_batch:
                return None
            taken = queue.waiting.pop(0)
            taken.taken, taken.run = True, run
        run.members.append(taken)
        return taken

    def _pass_lead(self, dataset: str, first: list[Transaction]) -> None:
        """Hand the dataset's lead to ``first`` (units to run again, in order) and then to
        the units queued, or let it go."""
        with self._mutex:
            queue = self._queues[dataset]
            queue.waiting[:0] = first
            if queue.waiting:
                leader = queue.waiting.pop(0)
                leader.lead = True
                leader.turn.set()
            else:
                queue.leading = False
                del self._queues[dataset]

    def _abandon(self, tx: Transaction) -> None:
        """``tx`` will never be entered (its thread stopped between two attempts): take it
        out of the queue, or pass on the lead it was given."""
        with self._mutex:
            queue = self._queues.get(tx.dataset)
            if queue is not None and tx in queue.waiting:
                queue.waiting.remove(tx)
            if queue is None or not tx.lead:
                return
        self._pass_lead(tx.dataset, [])

    def _timed_out(self) -> OperationalError:
        return OperationalError(
            "BEGIN",
            None,
            TimeoutError(f"database is locked: no write lock within {self._wait_s:g} s"),
        )


class _Queue:
    __slots__ = ("leading", "waiting")

    def __init__(self) -> None:
        self.waiting: list[Transaction] = []
        self.leading = False


class _Run:
    """One transaction: its connection, the units in it, and what ended it, if anything."""

    __slots__ = ("back", "broken", "dataset", "driver", "members", "stack")

    def __init__(self, dataset: str, driver: Driver, leader: Transaction) -> None:
        self.dataset = dataset
        self.driver = driver
        self.members = [leader]
        self.broken: BaseException | None = None
        self.back = threading.Event()  # set when the units taken have run their blocks
        self.stack = ExitStack()  # the pipeline the transaction's statements go through


class Transaction:
    """One unit of work's place in a transaction on its dataset: enter it to begin or join
    the transaction, ``apply`` its writes, and leave it to commit (``GroupCommit``)."""

    __slots__ = (
        "again",
        "applied",
        "attempts_left",
        "dataset",
        "done",
        "duplicates",
        "entered",
        "error",
        "group",
        "lead",
        "own",
        "placed",
        "refused",
        "run",
        "taken",
        "turn",
    )

    def __init__(
        self,
        group: GroupCommit,
        dataset: str,
        own: Driver,
        attempts_left: int,
        *,
        duplicates: bool,
        placed: bool = False,
    ) -> None:
        self.group, self.dataset, self.own = group, dataset, own
        self.attempts_left, self.duplicates = attempts_left, duplicates
        # ``placed``: put in the queue by the transaction that failed, to run again alone
        self.placed = placed
        self.turn = threading.Event()  # set when it is taken into a transaction, or leads
        self.done = threading.Event()  # set when its transaction has ended
        self.lead = self.taken = self.entered = self.applied = self.refused = False
        self.run: _Run | None = None
        self.error: BaseException | None = None  # what ended its transaction, for it
        self.again: Transaction | None = None  # the transaction to run its work in again

    @property
    def driver(self) -> Driver:
        """The transaction's connection (its leader's)."""
        assert self.run is not None, "enter the transaction first"
        return self.run.driver

    def apply(self, plan: WritePlan) -> None:
        """Run ``plan``'s writes in the transaction. From here on, an error ends the
        transaction, and with it every unit of work in it."""
        self.applied = True
        self.driver.apply(plan)

    def __enter__(self) -> Transaction:
        self.entered = True
        group = self.group
        if not self.placed:
            group._queue_up(self)
        if not self.lead:
            with spent():  # waiting for the lock, or for the leader, is waiting
                if not self.turn.wait(remaining(group._wait_s)):
                    with group._mutex:
                        queue = group._queues[self.dataset]
                        if not (self.taken or self.lead):
                            queue.waiting.remove(self)
                            raise group._timed_out()
                self.turn.wait()
        if self.lead:
            self._begin()
        return self

    def _begin(self) -> None:
        """BEGIN on this unit's own connection, which the transaction's units share."""
        run = self.run = _Run(self.dataset, self.own, self)
        try:
            self.own.begin_write()
            run.stack.enter_context(self.own.pipeline())
        except BaseException:  # a failed BEGIN is this unit's failure alone
            self.group._pass_lead(self.dataset, [])
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> bool:
        run = self.run
        assert run is not None
        if error is not None:
            if isinstance(error, Exception) and not (self.applied or isinstance(error, DBAPIError)):
                self.refused = True  # it wrote nothing: its own outcome, and no other's
            elif run.broken is None:
                run.broken = error
        if self.lead:
            self._lead(run)
        else:
            following = None if run.broken is not None else self.group._take(run)
            if following is not None:
                following.turn.set()
            else:
                run.back.set()
            with spent():
                self.done.wait()
        if self.refused or self.again is not None:
            return self.again is not None  # its refusal stands; or it runs again
        if self.error is not None and self.error is not error:
            raise self.error
        return False

    def _lead(self, run: _Run) -> None:
        """Take the units queued meanwhile, while there is room and nothing failed; then
        commit, or roll back, and say what became of each."""
        group = self.group
        while run.broken is None and not self.placed:
            following = group._take(run)
            if following is None:
                break
            run.back.clear()
            following.turn.set()
            run.back.wait()  # each ran its block, and took the next
        failed = run.broken
        if failed is None:
            try:
                run.driver.commit()
                run.stack.close()  # PostgreSQL: waits for every statement, and the COMMIT
            except BaseException as error:
                failed = error
        if failed is not None:
            # What ended the transaction is the answer, whatever ending it raises: a lost
            # connection fails its rollback too, and the pool discards it.
            with suppress(Exception):
                run.stack.__exit__(type(failed), failed, failed.__traceback__)
            with suppress(Exception):
                run.driver.rollback()
        again = _again(failed, len(run.members) > 1) if failed is not None else None
        first = []
        for member in run.members:
            if member.refused or failed is None:
                continue
            if (
                again is None
                or member.attempts_left == 0
                or (again == "queued" and not member.duplicates)
            ):
                member.error = failed
            else:
                alone = again == "alone"
                member.again = Transaction(
                    group,
                    self.dataset,
                    member.own,
                    member.attempts_left - 1,
                    duplicates=member.duplicates,
                    placed=alone,
                )
                if alone:
                    member.again.taken = True
                    first.append(member.again)
        group._pass_lead(self.dataset, first)
        for member in run.members:
            member.done.set()


def _again(error: BaseException, shared: bool) -> str | None:
    """Whether the units of a transaction that ``error`` ended should run again: each
    ``"alone"`` when it was shared and a unit raised after its writes (it fails again by
    itself, and what it wrote never reaches the others' commit) or met a duplicate key;
    ``"queued"`` for a lone unit that met a duplicate key (another transaction may have
    committed the same key meanwhile: its work, run again, reads it; ``transactions``'
    ``duplicates`` says whether it may); None when the database failed, which is every
    unit's error, or a lone unit's work did."""
    if isinstance(error, DBAPIError):
        if isinstance(error, IntegrityError):
            return "alone" if shared else "queued"
        return None
    return "alone" if shared and isinstance(error, Exception) else None
