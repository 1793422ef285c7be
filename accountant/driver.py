"""Statements sent straight through the database driver, for the charge's hot path.

Building, compiling and caching a SQL expression costs the ORM and Core
layers 100-300 microseconds of Python per statement, several times what the
database spends on a charge's small indexed reads and writes. So the
statements a charge runs on every request go through the DBAPI cursor of
one pooled connection: the request's own (``Driver.checkout``, which begins
and commits its transactions itself) or a session's, inside the session's
transaction (``Driver.of``).

Statements are built from the tables' metadata with SQLAlchemy Core and compiled once per
backend (``statement``, ``upsert``) into text in the named style (``:name``), translated
for psycopg into PostgreSQL's own placeholders (``$1``), which it sends without parsing
the text again; a few maintenance statements are plain text in that style. A list value
expands in place to ``(:name_0, :name_1, ...)``, for ``IN`` lists. Driver
errors are re-raised as SQLAlchemy's (``IntegrityError``, ``OperationalError``, ...), so
callers handle one family of exceptions whichever layer sent the statement.

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

import fcntl
import os
import re
import threading
import time
import weakref
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Generic, TypeVar, cast

from sqlalchemy import Engine, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.sql import ClauseElement, visitors
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import UpdateBase

_NAMED = re.compile(r"(?<![:\w]):(\w+)")
Params = Mapping[str, Any]
Rows = list[Any]  # named tuples (``_record``)
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
            self.run("BEGIN IMMEDIATE")
        except BaseException:
            self._leave_gate()
            raise

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
        params = {f"t{i}_{k}": v for i, write in enumerate(writes) for k, v in write.params.items()}
        texts = tuple(write.statement.postgresql for write in writes)
        self._execute(_together(texts), params)

    def fetch(self, cursor: Any) -> Rows:
        """The rows of the statement last executed on ``cursor``, as named tuples: read a
        column by its name (``row.total_epsilon``), never by its position."""
        rows: Rows = self._call(cursor.fetchall)
        if rows and not self.postgres:  # psycopg's cursors make named tuples themselves
            make = _record(tuple(column[0] for column in cursor.description))._make
            return [make(row) for row in rows]
        return rows

    def _new_cursor(self) -> Any:
        if self.postgres:
            # named from the result's field names, without building psycopg's description
            # and given PostgreSQL's own $1, $2, ... placeholders (``_render``)
            return self._dbapi.RawCursor(  # type: ignore[union-attr]  # DB-API modules are untyped
                self._connection.driver_connection,
                row_factory=self._dbapi.rows.namedtuple_row,  # type: ignore[union-attr]  # as above
            )
        return self._connection.cursor()

    def _execute(self, sql: SQL, params: Params, cursor: Any = None) -> None:
        if self._begin:  # see begin_write
            self._begin = False
            self._call(self._cursor.execute, "BEGIN ISOLATION LEVEL READ COMMITTED")
        sql = _text(sql, self.postgres)
        lists = tuple((name, len(v)) for name, v in params.items() if type(v) in _LISTS)
        text, order = _render(sql, self.postgres, lists)
        values: Any
        if order is not None:  # PostgreSQL: each placeholder's value, a list's item by index
            values = [params[name] if i is None else params[name][i] for name, i in order]
        else:
            values = _expand(params) if lists else params
        self._call((cursor or self._cursor).execute, text, values)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(*args)
        except self._dbapi.Error as error:  # type: ignore[union-attr]  # DB-API modules are untyped
            statement, params = (*args, None, None)[:2]
            raise DBAPIError.instance(statement, params, error, self._dbapi.Error) from error  # type: ignore[union-attr]  # DB-API modules are untyped


class WriteGate:
    """The queue of SQLite's writers, in front of ``BEGIN IMMEDIATE``.

    SQLite has no queue for its write lock: a writer that finds it taken
    sleeps in its busy handler for 1, 2, 5, ... up to 100 ms and tries again,
    so under load a waiter may sleep past many releases while later arrivals
    take the lock (a convoy: a p99 tens of times the median). So writers
    queue here first. A process's threads wait on a lock of their own, woken
    the moment the writer before them leaves; the one in front then takes an
    advisory lock on a file next to the database (``flock``), shared by every
    process of the service, polling for it every 0.1 ms, and only then
    begins. A writer waits at most ``timeout_s`` (the lock timeout,
    ``ACCOUNTANT_LOCK_TIMEOUT_MS``) in all, and is then refused (a 503).
    Writers outside the service (the command line) still meet SQLite's own
    lock and busy timeout.

    Only the front writer of each process polls, and the lock stands free
    while it sleeps. Measured with 2 processes under 6 clients: polling every
    0.5 ms, the lock stood free 0.53 ms (median) at each hand-over between
    processes and was held 77 % of the time; every 0.1 ms, 0.21 ms and 87 %,
    with 584 charges/s becoming 715, at the same CPU per charge (2.0 ms). A
    helper thread blocked in ``flock`` and woken by the kernel did worse
    (661/s): it must then wake the writer, a second hand-over of the GIL.
    """

    _POLL_S = 0.0001

    def __init__(self, timeout_s: float, path: str | None) -> None:
        self._lock = threading.Lock()
        self._timeout_s = timeout_s
        self._path = path
        self._file: tuple[int, int] | None = None  # (pid, descriptor): reopened after a fork

    def enter(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        if not self._lock.acquire(timeout=self._timeout_s):
            raise self._timed_out()
        if self._path is None:
            return
        try:
            descriptor = self._descriptor()
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise self._timed_out() from None
                    time.sleep(self._POLL_S)
        except BaseException:  # never keep this process's writers waiting on a failed entry
            self._lock.release()
            raise

    def leave(self) -> None:
        try:
            if self._file is not None:
                fcntl.flock(self._file[1], fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def _descriptor(self) -> int:
        """This process's descriptor of the lock file: a descriptor inherited through a fork
        shares its lock with the parent, so each process opens its own."""
        if self._file is None or self._file[0] != os.getpid():
            assert self._path is not None
            descriptor = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            self._file = (os.getpid(), descriptor)
            weakref.finalize(self, os.close, descriptor)
        return self._file[1]

    def _timed_out(self) -> OperationalError:
        return OperationalError(
            "BEGIN IMMEDIATE",
            None,
            TimeoutError(f"database is locked: no write lock within {self._timeout_s:g} s"),
        )


#: The write gate of each SQLite engine (``accountant.db.make_engine`` sets one up).
WRITE_GATES: weakref.WeakKeyDictionary[Engine, WriteGate] = weakref.WeakKeyDictionary()


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


@dataclass(frozen=True)
class Statement:
    """A SQLAlchemy Core statement built from the tables' metadata, compiled once for each
    backend into SQL text in the named style this driver sends, with the tables it writes
    and the other tables it reads (``statement`` finds them in the clause)."""

    sqlite: str
    postgresql: str
    writes: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()
    #: Tables it reads that another statement of its ``Block`` may write, each with the
    #: reason why that write cannot change what it reads (``Block``'s allow-list).
    unaffected: tuple[tuple[str, str], ...] = ()


#: What the driver runs: text in the named style, or a statement built from the metadata.
SQL = str | Statement


def statement(clause: ClauseElement, *, unaffected: Mapping[str, str] | None = None) -> Statement:
    """Compile ``clause`` for both backends (once, at import or in a cached builder). An
    expanding ``bindparam(name, expanding=True)`` becomes ``:name``, which the driver
    expands to a list in place. ``unaffected``: see ``Statement.unaffected``."""
    return Statement(
        _compiled(clause, _SQLITE),
        _compiled(clause, _POSTGRESQL),
        *_tables(clause),
        tuple(sorted((unaffected or {}).items())),
    )


def upsert(
    build: Callable[[Callable[..., Any]], ClauseElement],
    *,
    unaffected: Mapping[str, str] | None = None,
) -> Statement:
    """``statement`` for an ``INSERT ... ON CONFLICT``, which each dialect builds with its
    own ``insert``: ``build`` is called with SQLite's, then PostgreSQL's."""
    clause = build(sqlite.insert)
    return Statement(
        _compiled(clause, _SQLITE),
        _compiled(build(postgresql.insert), _POSTGRESQL),
        *_tables(clause),
        tuple(sorted((unaffected or {}).items())),
    )


def _tables(clause: ClauseElement) -> tuple[frozenset[str], frozenset[str]]:
    """(the table ``clause`` writes, if it is an INSERT, UPDATE or DELETE; every other table
    it names, which it reads)."""
    named = {element.name for element in visitors.iterate(clause) if isinstance(element, Table)}
    target = getattr(clause, "table", None) if isinstance(clause, UpdateBase) else None
    written = frozenset() if target is None else frozenset({target.name})
    return written, frozenset(named - written)


@dataclass(frozen=True)
class Write:
    """One statement that writes, with its parameters."""

    statement: Statement
    params: Params


class DependentWrites(ValueError):
    """A ``Block`` whose statements would depend on each other's writes."""


@dataclass(frozen=True)
class Block:
    """Writes that run together (``Driver.together``), none depending on another's writes:
    checked when the block is built. Each statement writes a table (a block holds no
    read), no two write the same table, and none reads a table another writes, unless it
    declares that table ``unaffected``, with the reason."""

    writes: tuple[Write, ...]

    def __post_init__(self) -> None:
        writer: dict[str, int] = {}
        for index, write in enumerate(self.writes):
            tables = write.statement.writes
            if not tables:
                raise DependentWrites(
                    "a block only writes; read before it. Statement: "
                    + write.statement.sqlite[:200]
                )
            for table in tables:
                if table in writer:
                    raise DependentWrites(
                        f"two statements of one block write {table}; put them in blocks of "
                        "their own, in the order they must run"
                    )
                writer[table] = index
        for index, write in enumerate(self.writes):
            allowed = dict(write.statement.unaffected)
            for table in sorted(write.statement.reads):
                if writer.get(table, index) != index and table not in allowed:
                    raise DependentWrites(
                        f"a statement of the block reads {table}, which another of its "
                        "statements writes: on PostgreSQL it would not see that write. Put "
                        "the write in an earlier block, or declare the table unaffected with "
                        "the reason"
                    )


@dataclass(frozen=True)
class WritePlan:
    """The writes of a unit of work, in blocks run in order (``Driver.apply``): a block may
    depend on what the blocks before it wrote, never on its own."""

    blocks: tuple[Block, ...]


def _compiled(clause: ClauseElement, dialect: Dialect) -> str:
    compiled = cast(SQLCompiler, clause.compile(dialect=dialect))
    bound = sorted(name for name, param in compiled.binds.items() if param.value is not None)
    if bound:  # the text would need values this driver is never given
        raise ValueError(f"write constants as literal_column, not as parameters: {bound}")
    return _POSTCOMPILE.sub(r":\1", str(compiled))


_SQLITE = sqlite.dialect(paramstyle="named")
# the base dialect, without a driver's bind casts
_POSTGRESQL = PGDialect(paramstyle="named")  # type: ignore[no-untyped-call]  # unannotated
_POSTCOMPILE = re.compile(r"\(__\[POSTCOMPILE_(\w+)\]\)")


def _text(sql: SQL, postgres: bool) -> str:
    if isinstance(sql, Statement):
        return sql.postgresql if postgres else sql.sqlite
    return sql


@lru_cache(maxsize=256)
def _together(texts: tuple[str, ...]) -> str:
    """One PostgreSQL statement that runs ``texts`` (see ``Driver.together``): the i-th
    one's parameters are renamed ``t{i}_name``."""
    renamed = [_NAMED.sub(rf":t{i}_\1", text) for i, text in enumerate(texts)]
    if any(text.lstrip()[:4].upper() == "WITH" for text in renamed):
        raise ValueError("a statement with a WITH clause of its own cannot be run together")
    clauses = ", ".join(f"t{i} AS ({text})" for i, text in enumerate(renamed[:-1]))
    return f"WITH {clauses} {renamed[-1]}"


@lru_cache(maxsize=256)
def _record(columns: tuple[str, ...]) -> Any:
    """The named-tuple type of a result with these columns (aliases make every name
    unique and an identifier)."""
    return namedtuple("Record", columns)


#: The types of a list parameter, expanded in place for ``IN``.
_LISTS = (list, tuple)


def _expand(params: Params) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in params.items():
        if type(value) in _LISTS:
            flat.update((f"{name}_{i}", item) for i, item in enumerate(value))
        else:
            flat[name] = value
    return flat


@lru_cache(maxsize=1024)
def _render(
    sql: str, postgres: bool, lists: tuple[tuple[str, int], ...]
) -> tuple[str, tuple[tuple[str, int | None], ...] | None]:
    """``sql`` with list parameters expanded in place (``:keys`` to ``(:keys_0, ...)``).
    For PostgreSQL, in its own placeholders (``$1``, ``$2``, ...), which psycopg sends as
    they are, and what each number stands for: a parameter's name, with an index into it
    for a list's item. For sqlite3, in the named style, and None."""
    items: dict[str, tuple[str, int | None]] = {}
    for name, length in lists:
        if length == 0:
            raise ValueError(f"empty list for :{name}; an IN list needs one value at least")
        items.update((f"{name}_{i}", (name, i)) for i in range(length))
        expanded = ", ".join(f":{name}_{i}" for i in range(length))
        sql = re.sub(rf"(?<![:\w]):{name}\b", f"({expanded})", sql)
    if not postgres:
        return sql, None
    numbers: dict[str, int] = {}
    text = _NAMED.sub(lambda m: f"${numbers.setdefault(m.group(1), len(numbers) + 1)}", sql)
    return text, tuple(items.get(name, (name, None)) for name in numbers)
