"""Fixtures: a real database per test (a SQLite file, and a PostgreSQL database when
``ACCOUNTANT_TEST_POSTGRES_URL`` names a server), each a copy of one migrated by Alembic
once per test process, and a Flask client."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from accountant.accounting.modes import LABELS
from accountant.app import prepared_app
from accountant.clock import Clock, FrozenClock, SystemClock
from accountant.db import dispose_all
from accountant.migrate import upgrade

ADMIN_KEY = "test-admin-key-" + "k" * 32
POSTGRES_URL = os.environ.get("ACCOUNTANT_TEST_POSTGRES_URL")
BACKENDS = ["sqlite", "postgresql"] if POSTGRES_URL else ["sqlite"]
_TEMPLATE = f"accountant_template_{os.getpid()}"
# Every read a batch folds in memory is read from the database too, and must equal it
# (services/folded_reads.py): here, and in every server the tests start.
os.environ["ACCOUNTANT_CHECK_FOLDED_READS"] = "1"
PGBOUNCER = shutil.which("pgbouncer") or os.path.exists("/usr/sbin/pgbouncer")


def _admin_engine() -> Any:
    assert POSTGRES_URL is not None
    return create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str | None]:
    """A migrated database that each test's database is cloned from."""
    if POSTGRES_URL is None:
        yield None
        return
    with _admin_engine().connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {_TEMPLATE}"))
        connection.execute(text(f"CREATE DATABASE {_TEMPLATE}"))
    upgrade(make_url(POSTGRES_URL).set(database=_TEMPLATE).render_as_string(False))
    yield _TEMPLATE
    with _admin_engine().connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {_TEMPLATE} WITH (FORCE)"))


class _Clones:
    """PostgreSQL test databases cloned from the template one test ahead, and dropped
    behind, by one thread of the test process: a clone takes a few tenths of a second of
    the server's, which the test before it covers."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clones")
        self.next = self.thread.submit(self._clone)

    def take(self) -> str:
        """A new database's name, cloned from the template; the next one begins."""
        name = self.next.result()
        self.next = self.thread.submit(self._clone)
        return name

    def drop(self, name: str) -> None:
        self.thread.submit(_drop, name)

    def close(self) -> None:
        _drop(self.next.result())
        self.thread.shutdown(wait=True)

    def _clone(self) -> str:
        name = f"accountant_test_{uuid.uuid4().hex[:12]}"
        with _admin_engine().connect() as connection:
            connection.execute(text(f"CREATE DATABASE {name} TEMPLATE {self.template}"))
        return name


def _drop(name: str) -> None:
    with _admin_engine().connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(scope="session")
def postgres_clones(postgres_template: str | None) -> Iterator[_Clones]:
    assert postgres_template is not None
    clones = _Clones(postgres_template)
    yield clones
    clones.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file that each test's database is a copy of, as each PostgreSQL
    database is a clone of ``postgres_template``: migrating takes about a second, copying
    the file a millisecond. Tests of migrating itself migrate databases of their own."""
    path = tmp_path_factory.mktemp("sqlite-template") / "accountant.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(autouse=True, scope="session")
def _key_files_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Commands and apps that name no key file use this folder, not ./var of the checkout."""
    folder = tmp_path_factory.mktemp("default-keys")
    os.environ.setdefault("ACCOUNTANT_SIGNING_KEY_FILE", str(folder / "signing-key.pem"))


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    dispose_all()


@pytest.fixture(scope="session")
def pgbouncer_port() -> Iterator[int]:
    """A PgBouncer in transaction pooling mode in front of the test server."""
    from tests.pgbouncer import pgbouncer

    assert POSTGRES_URL is not None
    url = make_url(POSTGRES_URL)
    with pgbouncer(url.host or "127.0.0.1", url.port or 5432) as port:
        yield port


#: Backends for tests that must also pass through PgBouncer (pass as ``indirect``).
POOLED_BACKENDS = BACKENDS + (["pgbouncer"] if POSTGRES_URL and PGBOUNCER else [])


@pytest.fixture(params=BACKENDS)
def database_url(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    postgres_template: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:
    if request.param == "sqlite":
        path = tmp_path / "accountant.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    assert POSTGRES_URL is not None
    clones: _Clones = request.getfixturevalue("postgres_clones")
    name = clones.take()
    database = make_url(POSTGRES_URL).set(database=name)
    if request.param == "pgbouncer":  # every app of the test, and its child processes
        monkeypatch.setenv("ACCOUNTANT_DATABASE_POOLER", "pgbouncer")
        database = database.set(port=request.getfixturevalue("pgbouncer_port"))
    yield database.render_as_string(False)
    clones.drop(name)


def unlabelled(amount: dict[str, Any]) -> dict[str, Any]:
    """An amount as ``Mode.report`` states it, without what ``Mode.labelled`` adds."""
    return {k: v for k, v in amount.items() if k not in LABELS}


def run_sql(database_url: str, statement: str) -> list[Any]:
    """Run one statement directly on the database, as an intruder or an operator would."""
    engine = create_engine(database_url, poolclass=NullPool)
    with engine.begin() as connection:
        result = connection.execute(text(statement))
        rows = list(result) if result.returns_rows else []
    engine.dispose()
    return rows


def dump(database_url: str) -> str:
    """Every row of every table, as text."""
    from accountant.models import Base

    return "\n".join(
        repr(row)
        for table in Base.metadata.sorted_tables
        for row in run_sql(database_url, f"SELECT * FROM {table.name}")
    )


def charge_authenticated_before(app: Flask, key: str, change: Callable[[], Any]) -> Any:
    """Submit a charge of 0.1 on clicks/p1 as ``key``'s principal, read before ``change``
    runs: what a request sees whose key was read just before an admin's change and whose
    transaction began just after it."""
    from decimal import Decimal

    from accountant.driver import Driver
    from accountant.services import charges
    from accountant.services.api_keys import authenticate
    from accountant.services.evaluation import ChargeRequest

    runtime = app.extensions["accountant"]
    connection = Driver.checkout(runtime.engine)
    try:
        caller = authenticate(connection, runtime.key_hasher(key))
        connection.end_read()
        assert caller is not None
        change()
        request = ChargeRequest(
            dataset="clicks",
            partitions=["p1"],
            release="joint",
            mechanism=runtime.registry.get("laplace"),
            params={"epsilon": Decimal("0.1"), "sensitivity": Decimal(1)},
            sensitivity_unit=None,
            principal=caller,
            data={"values": [1.0]},
            noise_secret=runtime.charging.noise.id,
            fingerprint="x",
        )
        return charges.submit(connection, request, runtime.charging)
    finally:
        connection.close()


@pytest.fixture
def signing_key_file(tmp_path: Path) -> str:
    return str(tmp_path / "signing-key.pem")


#: Where the clock of a test marked ``frozen_clock`` stands until the test moves it: 10:30:00
#: UTC on Monday 2 March 2026, half an hour into its hour window, 10.5 hours into its day,
#: 4.4 days into its 7-day window and 5.6 days before its 30-day window ends.
FROZEN_AT_US = int(datetime(2026, 3, 2, 10, 30, tzinfo=UTC).timestamp()) * 1_000_000


@pytest.fixture
def clock(request: pytest.FixtureRequest) -> Clock:
    """The ``app``'s clock. A test whose assertions need its requests in one window (a
    window's loss read after charges, a 429 after a grant) is marked ``frozen_clock``: it
    gets a ``FrozenClock`` at ``FROZEN_AT_US``, which only ``advance`` moves, so that it
    passes at any time of day, an hour's or a day's end included. Other tests get the
    system clock."""
    if request.node.get_closest_marker("frozen_clock") is None:
        return SystemClock()
    return FrozenClock(FROZEN_AT_US)


@pytest.fixture
def app(database_url: str, signing_key_file: str, clock: Clock) -> Flask:
    return prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
        },
        clock=clock,
    )


@pytest.fixture
def server(database_url: str, signing_key_file: str, tmp_path: Path) -> Iterator[str]:
    """The base URL of ``accountant serve`` on the test's database, with the test admin key
    (a module may define its own ``server``)."""
    from tests.server import running_service

    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
    }
    with running_service(env, tmp_path / "serve.log") as running:
        yield running.base


@pytest.fixture
def client(app: Flask) -> Iterator[FlaskClient]:
    with app.test_client() as test_client:
        yield test_client


class Reply:
    """A response as an ordinary HTTP client sees it: JSON numbers parse as floats."""

    def __init__(self, response: Any) -> None:
        self.status_code: int = response.status_code
        self.headers = response.headers
        self.text: str = response.get_data(as_text=True)
        self.content_type: str = response.content_type

    def get_json(self) -> Any:
        return json.loads(self.text) if self.text else None


class Api:
    """A thin JSON client over the Flask test client, acting with one key."""

    def __init__(self, client: FlaskClient, key: str = ADMIN_KEY) -> None:
        self.client = client
        self.key = key

    def as_key(self, key: str) -> Api:
        return Api(self.client, key)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        sent = {"Authorization": f"Bearer {self.key}", **(headers or {})}
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        return Reply(
            self.client.open(
                path, method=method, data=data, headers=sent, content_type="application/json"
            )
        )

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.call("POST", path, body, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.call("GET", path, **kw)

    def patch(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.call("PATCH", path, body, **kw)

    def make_dataset(self, name: str = "clicks", **fields: Any) -> dict[str, Any]:
        body = {
            "name": name,
            "privacy_unit": "record",
            "accounting": "pure",
            "budget": {"epsilon": 1.0},
            **fields,
        }
        response = self.post("/v1/datasets", body)
        assert response.status_code == 201, response.get_json()
        return dict(response.get_json())

    def make_consumer(self, name: str, role: str = "service", **fields: Any) -> str:
        response = self.post("/v1/consumers", {"name": name, "role": role, **fields})
        assert response.status_code == 201, response.get_json()
        return str(response.get_json()["api_key"])

    def charge(
        self,
        dataset: str = "clicks",
        partitions: Any = ("p1",),
        epsilon: Any = 0.1,
        release: str = "joint",
        mechanism: str = "laplace",
        **extra: Any,
    ) -> Any:
        headers = extra.pop("headers", None)
        params = extra.pop("params", {"epsilon": epsilon, "sensitivity": 1})
        body = {
            "dataset": dataset,
            "partitions": partitions if isinstance(partitions, str) else list(partitions),
            "release": release,
            "mechanism": mechanism,
            "params": params,
            "input": extra.pop("input", {"values": [10.0]}),
            **extra,
        }
        return self.post("/v1/charges", body, headers=headers)

    def budget(self, dataset: str = "clicks") -> dict[str, Any]:
        response = self.get(f"/v1/datasets/{dataset}/budget")
        assert response.status_code == 200, response.get_json()
        return dict(response.get_json())

    def ledger(self, **query: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        cursor = ""
        while True:
            params = "&".join(f"{k}={v}" for k, v in {**query, "limit": "1000"}.items())
            page = f"&cursor={cursor}" if cursor else ""
            response = self.get(f"/v1/ledger?{params}{page}")
            assert response.status_code == 200, response.get_json()
            body = response.get_json()
            entries += body["entries"]
            if body["next_cursor"] is None:
                return entries
            cursor = body["next_cursor"]


@pytest.fixture
def api(client: FlaskClient) -> Api:
    return Api(client)
