"""The driver layer of the hot path, on each real backend: named and list parameters,
transactions it begins and ends itself, and errors in SQLAlchemy's family."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import bindparam, func, insert, literal_column, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from accountant.driver import Driver
from accountant.models import Dataset, Partition
from accountant.statements import Block, DependentWrites, Write, statement

PARTITION = "INSERT INTO partitions (dataset_id, key, created_at) VALUES (:d, :k, 0)"


@pytest.fixture
def driver(app: Flask) -> Iterator[Driver]:
    from tests.conftest import Api

    Api(app.test_client()).make_dataset()
    found = Driver.checkout(app.extensions["accountant"].engine)
    assert found.rows("SELECT id FROM datasets") == [(1,)]
    found.begin_write()
    yield found
    found.rollback()
    found.close()


def test_named_and_list_parameters_reach_the_database(driver: Driver) -> None:
    for key in ("a", "b", "c%"):
        driver.run(PARTITION, {"d": 1, "k": key})
    rows = driver.rows(
        "SELECT key FROM partitions WHERE dataset_id = :d AND key IN :keys ORDER BY key",
        {"d": 1, "keys": ["c%", "a", "zz"]},
    )
    assert rows == [("a",), ("c%",)]
    # A literal percent sign survives the translation to psycopg's parameter style.
    assert driver.row("SELECT key FROM partitions WHERE key LIKE 'c%'") == ("c%",)
    assert driver.row("SELECT key FROM partitions WHERE key = :k", {"k": "nope"}) is None


def test_an_empty_list_is_refused_before_it_reaches_the_database(driver: Driver) -> None:
    with pytest.raises(ValueError, match="empty list"):
        driver.rows("SELECT id FROM partitions WHERE id IN :ids", {"ids": []})


def test_a_rollback_discards_what_the_transaction_wrote(app: Flask, driver: Driver) -> None:
    driver.run(PARTITION, {"d": 1, "k": "gone"})
    driver.rollback()
    assert driver.rows("SELECT key FROM partitions WHERE key = :k", {"k": "gone"}) == []
    driver.begin_write()
    driver.run(PARTITION, {"d": 1, "k": "kept"})
    driver.commit()
    other = Driver.checkout(app.extensions["accountant"].engine)
    try:
        assert other.rows("SELECT key FROM partitions WHERE key = :k", {"k": "kept"}) == [("kept",)]
    finally:
        other.rollback()
        other.close()
    driver.begin_write()


def test_driver_errors_are_raised_as_sqlalchemy_errors(driver: Driver) -> None:
    driver.run(PARTITION, {"d": 1, "k": "twice"})
    with pytest.raises(IntegrityError):
        driver.run(PARTITION, {"d": 1, "k": "twice"})
    driver.rollback()
    driver.begin_write()
    with pytest.raises(DBAPIError) as raised:  # OperationalError on SQLite, ProgrammingError
        driver.run("SELECT no_such_column FROM partitions")  # on PostgreSQL
    assert raised.value.orig is not None


def _keys(rows: list[tuple[object, ...]]) -> list[object]:
    return [row[0] for row in rows]


def test_statements_sent_together_are_read_in_order_and_committed_once(
    app: Flask, driver: Driver
) -> None:
    with driver.pipeline():
        driver.run(PARTITION, {"d": 1, "k": "first"})
        before = driver.send("SELECT key FROM partitions ORDER BY key", None, _keys)
        driver.run(PARTITION, {"d": 1, "k": "second"})
        after = driver.send(
            "SELECT key FROM partitions WHERE key IN :keys ORDER BY key",
            {"keys": ["first", "second"]},
            _keys,
        )
        # Each statement saw what the ones sent before it wrote, whenever it is read.
        assert after.result() == ["first", "second"]
        assert before.result() == ["first"]
        assert before.result() is before.result()  # read once
        driver.commit()
    other = Driver.checkout(app.extensions["accountant"].engine)
    try:
        assert _keys(other.rows("SELECT key FROM partitions ORDER BY key")) == ["first", "second"]
    finally:
        other.rollback()
        other.close()
    driver.begin_write()


def test_an_error_in_a_statement_sent_ahead_fails_the_commit_and_writes_nothing(
    app: Flask, driver: Driver
) -> None:
    with pytest.raises(IntegrityError), driver.pipeline():
        driver.run(PARTITION, {"d": 1, "k": "kept?"})
        driver.run(PARTITION, {"d": 1, "k": "twice"})
        driver.run(PARTITION, {"d": 1, "k": "twice"})  # a unique key broken
        driver.commit()
    driver.rollback()
    assert driver.rows("SELECT key FROM partitions") == []
    with pytest.raises(DBAPIError), driver.pipeline():
        driver.send("SELECT no_such_column FROM partitions", None, list).result()
    driver.rollback()
    driver.begin_write()
    assert driver.rows("SELECT key FROM partitions") == []


def test_sqlite_writers_of_one_process_queue_and_give_up_after_the_lock_timeout(
    database_url: str, signing_key_file: str
) -> None:
    """A second writer waits in the process's write gate while the first holds it, is
    answered 503 once the lock timeout has passed (never left hanging), and writes as soon
    as the first is done."""
    from accountant.app import prepared_app
    from tests.conftest import ADMIN_KEY, Api

    if not database_url.startswith("sqlite"):
        pytest.skip("the write gate is SQLite's")
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
            "lock_timeout_ms": 300,
        }
    )
    api = Api(app.test_client())
    api.make_dataset(budget={"epsilon": 1})
    holder = Driver.checkout(app.extensions["accountant"].engine)
    holder.begin_write()  # holds the gate and SQLite's write lock
    try:
        waited = api.charge(epsilon=0.1)
        assert waited.status_code == 503, waited.get_json()
        assert waited.headers["Retry-After"] == "1"
    finally:
        holder.rollback()
        holder.close()
    assert api.charge(epsilon=0.1).status_code == 201  # the gate was left
    assert api.budget()["loss"]["epsilon"] == 0.1


def test_a_write_gate_that_cannot_open_its_file_lets_the_next_writer_try(tmp_path: Any) -> None:
    """A failed entry (here: no folder for the lock file) must not keep the process's queue
    locked, or every later writer of the process would wait out the lock timeout."""
    from accountant.sqlite_gate import WriteGate

    gate = WriteGate(0.2, str(tmp_path / "missing" / "db-writers"))
    for _ in range(2):  # the second attempt meets the same error, not a stuck queue
        with pytest.raises(FileNotFoundError):
            gate.enter()


@pytest.fixture
def postgres_engine(app: Flask) -> Any:
    """The engine of a service on PostgreSQL, with one dataset (id 1)."""
    from tests.conftest import Api

    engine = app.extensions["accountant"].engine
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's connections are in autocommit mode between transactions")
    Api(app.test_client()).make_dataset()
    return engine


def _psycopg(driver: Driver) -> Any:
    """The psycopg connection under ``driver``."""
    return driver._connection.driver_connection


def test_a_connection_comes_back_to_the_pool_without_a_rollback_and_keeps_its_prepared_statements(
    postgres_engine: Any,
) -> None:
    """Reads outside a write transaction leave nothing open, so the connection needs no
    rollback when it goes back to the pool, a rollback at which psycopg would forget its
    prepared statements, and PostgreSQL would parse and plan each statement again. It goes
    back out of autocommit mode, ready for a session's transaction."""
    driver = Driver.checkout(postgres_engine)
    raw = _psycopg(driver)
    driver.begin_write()
    driver.run(PARTITION, {"d": 1, "k": "kept"})
    driver.commit()
    for _ in range(8):  # psycopg prepares a statement at its 6th run
        driver.row("SELECT id FROM datasets WHERE name = :name", {"name": "census"})
    driver.close()
    assert raw.info.transaction_status == raw.info.transaction_status.IDLE
    assert raw.autocommit is False
    try:
        prepared = raw.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ("SELECT id FROM datasets WHERE name%",),
        ).fetchone()
        assert prepared == (1,)
        assert raw.execute("SELECT key FROM partitions").fetchall() == [("kept",)]
    finally:
        raw.rollback()


def test_a_transaction_left_open_is_rolled_back_before_the_connection_goes_back(
    postgres_engine: Any,
) -> None:
    """A write transaction that an error cut short is undone, and the connection goes back
    in the pool's mode; one lost meanwhile is thrown away, never pooled."""
    left = Driver.checkout(postgres_engine)
    raw = _psycopg(left)
    left.begin_write()
    left.run(PARTITION, {"d": 1, "k": "undone"})
    left.close()
    assert raw.autocommit is False and not raw.closed
    lost = Driver.checkout(postgres_engine)
    lost_raw = _psycopg(lost)
    lost.begin_write()
    lost.run(PARTITION, {"d": 1, "k": "lost"})
    killer = Driver.checkout(postgres_engine)
    try:
        killer.run("SELECT pg_terminate_backend(:pid)", {"pid": lost_raw.info.backend_pid})
        lost.close()  # its rollback fails: the connection is discarded
        assert lost_raw.closed
        assert killer.rows("SELECT key FROM partitions") == []
    finally:
        killer.close()


def test_statements_run_together_each_take_effect(app: Flask, driver: Driver) -> None:
    """A block's writes all run, in the transaction; on PostgreSQL as one statement, so none
    of them sees what another wrote. Which is why a block is checked when it is built: it
    refuses two writes of one table, a write that reads a table another writes (unless
    that table is declared unaffected, with the reason), and a read."""
    partition = statement(
        insert(Partition).values(
            dataset_id=bindparam("d"), key=bindparam("k"), created_at=literal_column("0")
        )
    )
    head = statement(
        update(Dataset).where(Dataset.id == bindparam("d")).values(ledger_seq=bindparam("seq"))
    )
    driver.together(Block((Write(partition, {"d": 1, "k": "a"}), Write(head, {"seq": 7, "d": 1}))))
    assert _keys(driver.rows("SELECT key FROM partitions ORDER BY key")) == ["a"]
    assert driver.row("SELECT ledger_seq FROM datasets WHERE id = 1") == (7,)

    copy = statement(
        insert(Partition).from_select(
            ["dataset_id", "key", "created_at"],
            select(
                Partition.dataset_id,
                Partition.key + literal_column("'-copy'"),
                Partition.created_at,
            ).where(Partition.key == bindparam("k")),
        )
    )
    with pytest.raises(DependentWrites, match="two statements of one block write partitions"):
        Block((Write(partition, {"d": 1, "k": "b"}), Write(copy, {"k": "b"})))
    counted = update(Dataset).values(ledger_seq=select(func.count(Partition.id)).scalar_subquery())
    with pytest.raises(DependentWrites, match="reads partitions, which another"):
        Block((Write(partition, {"d": 1, "k": "b"}), Write(statement(counted), {})))
    with pytest.raises(DependentWrites, match="only writes"):
        Block((Write(statement(select(Partition.key)), {}),))

    # Declared unaffected, which here it is not: on PostgreSQL the count misses the insert.
    shown = statement(counted, unaffected={"partitions": "shows what the rule prevents"})
    driver.together(Block((Write(partition, {"d": 1, "k": "b"}), Write(shown, {}))))
    one_statement = driver.postgres
    assert driver.row("SELECT ledger_seq FROM datasets WHERE id = 1") == (
        (1,) if one_statement else (2,)
    )
    assert _keys(driver.rows("SELECT key FROM partitions ORDER BY key")) == ["a", "b"]


def test_a_charge_reads_in_three_statements_with_or_without_a_partition_limit(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A charge's reads are the dataset's row, the charged partitions and the scope rows,
    sent together; a per-partition limit adds no statement: the charged partitions' s(p)
    come in the statement that reads the partitions, which reads them only when the
    dataset has such a limit."""
    from tests.conftest import Api

    api = Api(app.test_client())
    api.make_dataset("plain", budget={"epsilon": 10})
    api.make_dataset("limited", budget={"epsilon": 10}, partition_budget={"epsilon": 1})
    for name in ("plain", "limited"):  # the scope rows exist, the key is remembered
        assert api.charge(dataset=name).status_code == 201
    sent: list[str] = []
    execute = Driver._execute

    def recorded(self: Driver, sql: Any, params: Any, cursor: Any = None) -> None:
        sent.append(sql.sqlite if not isinstance(sql, str) else sql)
        execute(self, sql, params, cursor)

    monkeypatch.setattr(Driver, "_execute", recorded)
    statements = {}
    for name in ("plain", "limited"):
        sent.clear()
        assert api.charge(dataset=name).status_code == 201
        statements[name] = list(sent)
    assert statements["plain"] == statements["limited"]
    reads = [text for text in statements["plain"] if text.lstrip().startswith("SELECT")]
    assert len(reads) == 3
