"""``web.unit_of_work``, the transaction of a view that changes the database: what its block
writes is committed as the block ends, rolled back if the block raises or finds nothing
to keep, and it begins as a write transaction after the request's reads."""

from __future__ import annotations

import pytest
from flask import Flask
from sqlalchemy import select

from accountant.models import Consumer
from accountant.web import db, unit_of_work
from tests.conftest import run_sql


def _names(database_url: str) -> list[str]:
    """The consumers' names, read on a connection of its own."""
    return sorted(row.name for row in run_sql(database_url, "SELECT name FROM consumers"))


def test_what_the_block_wrote_is_committed_as_it_ends(app: Flask, database_url: str) -> None:
    with app.test_request_context():
        with unit_of_work() as session:
            session.add(Consumer(name="svc", role="service", created_at=1))
            session.flush()
            assert _names(database_url) == ["admin"]  # not before the block ends
        assert not session.in_transaction()
        assert _names(database_url) == ["admin", "svc"]


def test_a_block_that_raises_writes_nothing_and_its_error_goes_on(
    app: Flask, database_url: str
) -> None:
    with app.test_request_context():
        with pytest.raises(LookupError), unit_of_work() as session:
            session.add(Consumer(name="svc", role="service", created_at=1))
            session.flush()
            raise LookupError("the view's own error")
        assert not session.in_transaction()  # rolled back at once, not at teardown
        assert _names(database_url) == ["admin"]


def test_a_block_that_rolls_back_itself_writes_nothing(app: Flask, database_url: str) -> None:
    with app.test_request_context():
        with unit_of_work() as session:
            session.add(Consumer(name="svc", role="service", created_at=1))
            session.flush()
            session.rollback()  # what a PATCH that changes nothing does
        assert _names(database_url) == ["admin"]


def test_the_reads_of_the_request_end_before_it_begins(app: Flask, database_url: str) -> None:
    """A request that read before it writes (the dashboard's sign-in reads the key) gets a
    write transaction all the same: SQLAlchemy would ignore, with a warning, the write
    option of a transaction already begun, and SQLite's would stay a read one."""
    with app.test_request_context():
        assert db().execute(select(Consumer.name)).scalars().all() == ["admin"]
        with unit_of_work() as session:
            session.add(Consumer(name="svc", role="service", created_at=1))
        assert _names(database_url) == ["admin", "svc"]
