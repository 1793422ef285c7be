"""Engines and sessions, with the transaction discipline the charge path relies on.

SQLite: WAL (readers never block the writer), ``synchronous=FULL`` by default
(a charge is acknowledged only once it is on disk), foreign keys on, and a
busy timeout so ordinary lock waits are absorbed. pysqlite begins
transactions lazily as DEFERRED; a deferred transaction that reads and then
writes can fail with SQLITE_BUSY that no timeout cures (REFERENCES.md,
section 4). So the driver's own BEGIN is switched off and we emit ours:
``BEGIN IMMEDIATE`` for write transactions (they take the write lock first
and then read a state nobody can change under them) and a plain ``BEGIN``
for reads.

PostgreSQL: READ COMMITTED (set explicitly, whatever the server's default)
with ``synchronous_commit=on``; write
transactions serialise per dataset with ``SELECT ... FOR UPDATE`` on the
dataset row (see ``services.charges``).
"""

from __future__ import annotations

import math
import select
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from accountant.config import Settings
from accountant.keyfiles import private_directory
from accountant.sqlite_gate import WRITE_GATES, WriteGate

WRITE = "accountant_write"
#: Every engine this process made, held until ``dispose_all`` so none is garbage-collected
#: with connections still open (a process normally makes one).
_ENGINES: list[Engine] = []


def dispose_all() -> None:
    """Close every pooled connection of every engine this process made (at shutdown)."""
    while _ENGINES:
        _ENGINES.pop().dispose()


def ensure_sqlite_directory(database_url: str) -> None:
    """Create the folder of a SQLite file (the default lives under ./var/, beside the secret
    files) as a private one: 0700, like every folder made for a secret."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        private_directory(Path(url.database).parent)


def make_engine(settings: Settings, *, service: bool = True) -> Engine:
    """The engine of ``settings``' database. A ``service`` engine answers within bounded time
    on PostgreSQL (see ``pg_deadline``); a command-line tool's may run long statements."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite":
        ensure_sqlite_directory(settings.database_url)
        engine = create_engine(url, connect_args={"timeout": settings.lock_timeout_ms / 1000})
        _configure_sqlite(engine, settings)
        database = url.database if url.database not in (None, "", ":memory:") else None
        WRITE_GATES[engine] = WriteGate(
            settings.lock_timeout_ms / 1000, None if database is None else database + "-writers"
        )
        _ENGINES.append(engine)
        return engine
    timeout_s = settings.database_timeout_ms / 1000
    statement_ms = settings.lock_timeout_ms + settings.database_timeout_ms
    deadline_s = settings.database_deadline_s  # the server ends a statement itself, first
    options = f"-c synchronous_commit=on -c lock_timeout={settings.lock_timeout_ms}"
    if service:  # the server ends what runs too long; the client, what never answers
        options += f" -c statement_timeout={statement_ms}"
    connect_args: dict[str, Any] = {
        "options": options,
        "connect_timeout": max(2, math.ceil(timeout_s)),  # libpq's minimum
        # a server host that vanished is noticed on idle connections too
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": settings.database_timeout_ms,
    }
    if settings.database_pooler == "pgbouncer":  # see deploy/README.md, "PgBouncer"
        del connect_args["options"]
        connect_args["prepare_threshold"] = None
    # The locking argument of the charge (services.charges) relies on READ COMMITTED: each
    # statement sent after the dataset's lock sees every charge committed before it.
    engine = create_engine(
        url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        pool_timeout=deadline_s,
        connect_args=connect_args,
        isolation_level="READ COMMITTED",
        **({"poolclass": _deadline_pool()} if service else {}),
    )
    if service:
        _connect_with_deadline(engine, deadline_s, timeout_s)
    event.listen(engine, "checkout", _refuse_if_closed_by_server)
    _ENGINES.append(engine)
    return engine


def _deadline_pool() -> Any:
    from accountant.pg_deadline import DeadlinePool

    return DeadlinePool


def _connect_with_deadline(engine: Engine, deadline_s: float, connect_s: float) -> None:
    from psycopg.errors import ConnectionTimeout

    from accountant.deadline import spent
    from accountant.pg_deadline import (
        STALL,
        DeadlineConnection,
        connect_timeout,
        refuse_while_stalled,
    )

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        refuse_while_stalled()
        cparams["connect_timeout"] = connect_timeout(connect_s)  # within the request's deadline
        try:
            with spent():
                connection = DeadlineConnection.connect(*cargs, **cparams)
        except ConnectionTimeout:
            STALL.timed_out()
            raise
        except BaseException:
            STALL.failed()
            raise
        connection.deadline_s = deadline_s
        return connection


def _refuse_if_closed_by_server(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Replace a pooled connection the server has closed, without a round trip.

    An idle connection has nothing to read, so a readable socket means the
    server hung up or is hanging up (a restart, a failover, a terminated
    backend): the pool then opens a new connection instead (SQLAlchemy's
    answer to ``DisconnectionError``). This does what ``pool_pre_ping`` does
    for these cases, without its ``SELECT 1`` round trip on every request. A
    connection lost otherwise fails its request with a 503, and the pool
    discards it when it comes back.
    """
    if dbapi_connection.closed or select.select([dbapi_connection.fileno()], [], [], 0)[0]:
        raise DisconnectionError("the database server closed this pooled connection")


def _configure_sqlite(engine: Engine, settings: Settings) -> None:
    synchronous = settings.sqlite_synchronous.upper()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={settings.lock_timeout_ms}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        write = connection.get_execution_options().get(WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def begin_write(session: Session) -> None:
    """Start ``session``'s transaction as a write transaction (call before any query)."""
    session.connection(execution_options={WRITE: True})


def begin_snapshot(session: Session) -> None:
    """End ``session``'s transaction and begin one whose reads all see one moment: on
    PostgreSQL a REPEATABLE READ transaction (its statements otherwise each see what was
    committed before them), on SQLite the read transaction every transaction is. For a
    read of many statements that must agree, as ``verify``'s walk of every chain."""
    session.commit()
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def schema_missing(error: DBAPIError) -> bool:
    """Whether the database lacks a table or column this release uses: no schema, or one
    behind its migrations (SQLite's wording; PostgreSQL's undefined_table and
    undefined_column codes)."""
    code = getattr(error.orig, "sqlstate", None)
    return code in {"42P01", "42703"} or str(error.orig).startswith(
        ("no such table", "no such column")
    )
