"""The hot path's connection: statements sent straight through the DBAPI, in transactions.

Building, compiling and caching a SQL expression costs the ORM and Core
layers 100-300 microseconds of Python per statement, several times what the
database spends on a charge's small indexed reads and writes. So the
statements a charge runs on every request (``accountant.statements``, compiled
once) go through the DBAPI cursor of one pooled connection: the request's own
(``Driver.checkout``, which begins and commits its transactions itself) or a
session's, inside the session's transaction (``Driver.of``). Driver errors
are re-raised as SQLAlchemy's (``IntegrityError``, ``OperationalError``, ...),
so callers handle one family of exceptions whichever layer sent the statement.

Round trips. On PostgreSQL every statement waits for the server, and a
charge holds its dataset's lock across all of them. Inside ``pipeline()``
(psycopg's pipeline mode) statements are sent without waiting: ``send``
returns a ``Pending`` whose rows are read later, ``run`` and ``commit`` do
not wait at all, and the end of the block waits once for everything. So
statements that do not depend on each other's results travel together, in
one round trip. The server still runs them in order, in the transaction,
and an error surfaces at the next read or as the block ends. On SQLite, in
process, there is no round trip to save: ``pipeline()`` does nothing and
``send`` reads at once.

Transactions on PostgreSQL. A connection checked out for the hot path is in
autocommit mode until it goes back to the pool: a read outside a write
transaction is a transaction of its own, and ``begin_write`` sends an
explicit ``BEGIN ISOLATION LEVEL READ COMMITTED`` with the next statement,
in its round trip. psycopg's implicit ``BEGIN`` would cost a round trip of
its own before a statement sent outside ``pipeline()``, and would leave the
request's authentication read open, for the pool to roll back; psycopg
forgets a connection's prepared statements at each rollback (``DEALLOCATE
ALL``), so PostgreSQL would parse and plan the next charges' statements
again. A connection goes back to the pool out of autocommit mode, for the
sessions that share the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from accountant.deadline import remaining, spent
from accountant.sqlite_gate import WRITE_GATES, WriteGate
from accountant.statements import SQL, Block, Params, WritePlan, record, render

Rows = list[Any]  # named tuples (``statements.record``)
T = TypeVar("T")


class Driver:
    """A cursor on one pooled DBAPI connection, for statements in the named style."""

    __slots__ = (
        "_begin",
        "_connection",
        "_cursor",
        "_dbapi",
        "_gate",
        "_in_gate",
        "_own",
        "_pipelined",
        "postgres",
    )

    def __init__(
        self, connection: Any, dialect: Dialect, gate: WriteGate | None = None, *, own: bool = False
    ) -> None:
        self._connection = connection
        self._pipelined = False
        self.postgres = dialect.name == "postgresql"
        self._dbapi = dialect.dbapi
        self._cursor = self._new_cursor()
        self._gate, self._in_gate = gate, False
        # PostgreSQL, a connection of its own: in autocommit mode, with the transactions
        # this driver begins itself (see ``begin_write``)
        self._own = own and self.postgres
        self._begin = False
        if self._own:
            self._call(setattr, connection.driver_connection, "autocommit", True)

    @classmethod
    def of(cls, session: Session) -> Driver:
        """The cursor of ``session``'s own connection, inside the session's transaction."""
        connection = session.connection()
        return cls(connection.connection, connection.dialect)

    @classmethod
    def checkout(cls, engine: Engine) -> Driver:
        """A connection of its own from ``engine``'s pool; give it back with ``close``."""
        dbapi = engine.dialect.dbapi
        gate = WRITE_GATES.get(engine)
        try:
            return cls(engine.raw_connection(), engine.dialect, gate, own=True)
        except dbapi.Error as error:  # type: ignore[union-attr]  # DB-API modules are untyped
            raise DBAPIError.instance(None, None, error, dbapi.Error) from error  # type: ignore[union-attr]  # DB-API modules are untyped

    def begin_write(self) -> None:
        """Start a write transaction. SQLite takes the database's write lock now (``BEGIN
        IMMEDIATE``, see ``accountant.db``), after this process's earlier writers
        (``WriteGate``). PostgreSQL: a connection of its own sends ``BEGIN`` with the next
        statement, in the same round trip inside ``pipeline()``; a session's connection is
        in the session's transaction already."""
        if self.postgres:
            self._begin = self._own
            return
        if self._gate is not None:
            self._gate.enter()
            self._in_gate = True
        try:
            if self._gate is not None:
                self._bound_busy_wait(self._gate.timeout_s)
            with spent():
                self.run("BEGIN IMMEDIATE")
        except BaseException:
            self._leave_gate()
            raise

    def _bound_busy_wait(self, longest: float) -> None:
        """Make SQLite's busy timeout, which ``BEGIN IMMEDIATE`` waits for a writer outside
        this service (the command line, a backup) to finish, at most what is left of the
        request's budget (``deadline.remaining``), not the whole lock timeout: a request
        that waited for a thread has less. Set only when it changes, so as a rule never
        (the connection starts at the lock timeout, ``accountant.db``)."""
        wanted = max(1, int(remaining(longest) * 1000))
        info = self._connection.info
        if info.get("busy_timeout_ms", round(longest * 1000)) != wanted:
            self.run(f"PRAGMA busy_timeout={wanted}")
            info["busy_timeout_ms"] = wanted

    def begin_read(self) -> None:
        """Start a read transaction: one snapshot for several statements on SQLite. Nothing
        on PostgreSQL: outside a write transaction each statement is one of its own, and
        sees what was committed when it began, as it would in a READ COMMITTED transaction
        (a session's connection is in the session's transaction already)."""
        if not self.postgres:
            self.run("BEGIN")

    def end_read(self) -> None:
        """End a transaction that has only read. SQLite: roll it back (it pins a snapshot, and
        a write transaction must begin with ``BEGIN IMMEDIATE``). PostgreSQL: nothing."""
        if not self.postgres:
            self.rollback()

    def commit(self) -> None:
        """Commit; inside ``pipeline()``, the end of the block waits for it (and raises what
        any statement sent before it failed with)."""
        if self._begin:  # PostgreSQL: no statement was sent, so no transaction began
            self._begin = False
            return
        if self._pipelined:
            self.run("COMMIT")  # psycopg's commit() would wait for a round trip of its own
        else:
            try:
                self._call(self._connection.commit)
            finally:
                self._leave_gate()

    def rollback(self) -> None:
        """End the current transaction, if any, discarding its writes."""
        self._begin = False
        try:
            self._call(self._connection.rollback)
        finally:
            self._leave_gate()

    def close(self) -> None:
        """Give the connection back to the pool (which rolls back what is left open)."""
        try:
            if self._own:
                self._end_autocommit()
            self._connection.close()
        finally:
            self._leave_gate()

    def _end_autocommit(self) -> None:
        """Leave autocommit mode before the pool lends the connection to a session.

        A transaction left open (an error cut it short) is rolled back first. That is the
        only rollback on this path: psycopg forgets the connection's prepared statements at
        each one, and then parses and plans every statement again."""
        raw = self._connection.driver_connection
        try:
            raw.rollback()  # nothing to send unless a transaction is open
            raw.autocommit = False
        except self._dbapi.Error:  # type: ignore[union-attr]  # DB-API modules are untyped
            self._connection.invalidate()  # lost: never pooled again, in whatever mode

    def _leave_gate(self) -> None:
        if self._in_gate:
            self._in_gate = False
            assert self._gate is not None
            self._gate.leave()

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        """Send statements without waiting for each (PostgreSQL; see the module's notes)."""
        if not self.postgres:
            yield
            return
        try:
            with self._connection.driver_connection.pipeline():
                self._pipelined = True
                yield
        except self._dbapi.Error as error:  # type: ignore[union-attr]  # DB-API modules are untyped
            # Raised as the block ends, by a statement that no read waited for.
            raise DBAPIError.instance(None, None, error, self._dbapi.Error) from error  # type: ignore[union-attr]  # DB-API modules are untyped
        finally:
            self._pipelined = False

    def send(self, sql: SQL, params: Params | None, then: Callable[[Rows], T]) -> Pending[T]:
        """Send a statement now; its rows, passed through ``then``, are read on demand."""
        cursor = self._new_cursor()
        self._execute(sql, params or {}, cursor)
        pending = Pending(self, cursor, then)
        if not self.postgres:
            pending.result()  # sqlite3 steps a statement as it is read: finish it now
        return pending

    def rows(self, sql: SQL, params: Params | None = None) -> Rows:
        self._execute(sql, params or {})
        return self.fetch(self._cursor)

    def row(self, sql: SQL, params: Params | None = None) -> Any:
        """The first row (a named tuple), or None."""
        found = self.rows(sql, params)
        return found[0] if found else None

    def run(self, sql: SQL, params: Params | None = None) -> None:
        self._execute(sql, params or {})

    def apply(self, plan: WritePlan) -> None:
        """Run ``plan``'s blocks in order, each as ``together`` runs it."""
        for block in plan.blocks:
            self.together(block)

    def together(self, block: Block) -> None:
        """Run the writes of ``block``, none of which depends on another's (``Block`` checked
        that when it was built): on PostgreSQL as one statement, on SQLite one by one.

        Each pipelined statement costs psycopg's Python and the server's dispatch, at
        every charge. So on PostgreSQL the block's statements are sent as one: all but the
        last as data-modifying ``WITH`` clauses of the last (their parameters renamed
        apart). PostgreSQL runs every such clause to completion, all against the snapshot
        the statement began with, so none sees what another wrote, which is why a block
        holds no two writes of one table and no read of a table another of its statements
        writes.
        """
        writes = block.writes
        if not self.postgres or len(writes) == 1:
            for write in writes:
                self._execute(write.statement, write.params)
            return
        self._execute(*block.one_statement())

    def fetch(self, cursor: Any) -> Rows:
        """The rows of the statement last executed on ``cursor``, as named tuples: read a
        column by its name (``row.total_epsilon``), never by its position."""
        rows: Rows = self._call(cursor.fetchall)
        if rows and not self.postgres:  # psycopg's cursors make named tuples themselves
            make = record(tuple(column[0] for column in cursor.description))._make
            return [make(row) for row in rows]
        return rows

    def _new_cursor(self) -> Any:
        if self.postgres:
            # named from the result's field names, without building psycopg's description
            # and given PostgreSQL's own $1, $2, ... placeholders (``statements.render``)
            return self._dbapi.RawCursor(  # type: ignore[union-attr]  # DB-API modules are untyped
                self._connection.driver_connection,
                row_factory=self._dbapi.rows.namedtuple_row,  # type: ignore[union-attr]  # as above
            )
        return self._connection.cursor()

    def _execute(self, sql: SQL, params: Params, cursor: Any = None) -> None:
        if self._begin:  # see begin_write
            self._begin = False
            self._call(self._cursor.execute, "BEGIN ISOLATION LEVEL READ COMMITTED")
        text, values = render(sql, params, self.postgres)
        self._call((cursor or self._cursor).execute, text, values)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(*args)
        except self._dbapi.Error as error:  # type: ignore[union-attr]  # DB-API modules are untyped
            statement, params = (*args, None, None)[:2]
            raise DBAPIError.instance(statement, params, error, self._dbapi.Error) from error  # type: ignore[union-attr]  # DB-API modules are untyped


class Pending(Generic[T]):
    """A statement sent with ``Driver.send``: its result, read when first asked for."""

    __slots__ = ("_cursor", "_driver", "_then", "_value")
    _UNREAD = object()

    def __init__(self, driver: Driver, cursor: Any, then: Callable[[Rows], T]) -> None:
        self._driver, self._cursor, self._then = driver, cursor, then
        self._value: Any = Pending._UNREAD

    def result(self) -> T:
        if self._value is Pending._UNREAD:
            self._value = self._then(self._driver.fetch(self._cursor))
        value: T = self._value
        return value
