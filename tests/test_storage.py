"""What the service stores: hashed keys, exact integers, migrations both ways, private folders
for its secret files."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from flask import Flask
from sqlalchemy import create_engine, inspect
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from accountant.app import prepared_app
from accountant.db import dispose_all
from accountant.migrate import downgrade, upgrade
from accountant.services import totals
from tests.conftest import ADMIN_KEY, Api, dump, run_sql


def test_api_keys_are_stored_hashed(api: Api, database_url: str) -> None:
    key = api.make_consumer("svc", role="auditor")
    everything = dump(database_url)
    assert key not in everything and ADMIN_KEY not in everything
    # no part of a secret either: not the 8 characters after "pba_", not the admin key's start
    assert key[4:16] not in everything and ADMIN_KEY[:12] not in everything


def test_amounts_are_integers_in_the_database(api: Api, database_url: str) -> None:
    api.make_dataset(budget={"epsilon": 1})
    for _ in range(10):
        api.charge(epsilon=0.1)
    spends = run_sql(database_url, "SELECT epsilon FROM tally_spends")
    costs = run_sql(
        database_url, "SELECT cost_epsilon FROM ledger_entries WHERE status = 'granted'"
    )
    assert all(type(row[0]) is int for row in spends + costs)
    assert sum(row[0] for row in spends) == 2 * 10**9  # lifetime and consumer scopes, 1.0 each
    assert sum(row[0] for row in costs) == 10**9


def _tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=NullPool)
    names = set(inspect(engine).get_table_names())
    engine.dispose()
    return names


def test_migrations_downgrade_to_empty_and_upgrade_again(database_url: str) -> None:
    assert {
        "datasets",
        "partitions",
        "tallies",
        "tally_spends",
        "ledger_entries",
        "consumers",
        "api_keys",
        "grants",
        "window_budgets",
        "signing_keys",
        "idempotency_keys",
    } <= _tables(database_url)
    downgrade(database_url, "base")
    assert _tables(database_url) == {"alembic_version"}
    upgrade(database_url)
    assert "ledger_entries" in _tables(database_url)


def test_models_and_migrations_agree(database_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from accountant.models import Base

    with create_engine(database_url, poolclass=NullPool).connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_server_default": _defaults_differ}
        )
        differences = compare_metadata(context, Base.metadata)
    assert differences == []


def _defaults_differ(*args: Any) -> bool:
    """Server defaults compared as SQL text without its quotes and parentheses (SQLite
    reflects an empty string default as '' and PostgreSQL adds casts such as ::bigint)."""

    def plain(text: str | None) -> str:
        return "" if text is None else text.split("::")[0].strip("()'\"")

    # alembic passes (context, inspected column, metadata column, inspected default,
    # metadata default, rendered metadata default)
    inspected_default, rendered_metadata_default = args[3], args[5]
    return plain(inspected_default) != plain(rendered_metadata_default)


def test_readyz_is_503_until_the_schema_is_at_head(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    app: Flask = prepared_app({"database_url": url})
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.content_type == "application/problem+json"
    upgrade(url)
    assert client.get("/readyz").status_code == 200


def test_first_admin_from_the_environment_is_created_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    for _ in range(3):
        app = prepared_app({"database_url": url, "admin_key": ADMIN_KEY})
        dispose_all()
    consumers = Api(app.test_client()).get("/v1/consumers").get_json()["consumers"]
    assert [(c["name"], c["role"]) for c in consumers] == [("admin", "admin")]


def test_folders_made_for_secrets_are_private_under_any_umask(tmp_path: Path) -> None:
    """Under umask 000 every folder the service makes for its secret files and its SQLite
    database is 0700, and every secret file 0600: no other user may list, read or replace
    them."""
    root = tmp_path / "state"
    settings = {
        "database_url": f"sqlite:///{root / 'db' / 'accountant.db'}",
        "signing_key_file": str(root / "keys" / "signing" / "signing-key.pem"),
        "noise_secret_file": str(root / "noise" / "noise-secret"),
        "key_hash_secret_file": str(root / "keys" / "hash" / "key-hash-secret"),
    }
    previous = os.umask(0)
    try:
        prepared_app(settings)
    finally:
        os.umask(previous)
    dispose_all()
    folders = [root, *(path for path in root.rglob("*") if path.is_dir())]
    assert len(folders) == 6
    assert {str(path): oct(stat.S_IMODE(path.stat().st_mode)) for path in folders} == {
        str(path): "0o700" for path in folders
    }
    for name in ("signing_key_file", "noise_secret_file", "key_hash_secret_file"):
        assert stat.S_IMODE(Path(settings[name]).stat().st_mode) == 0o600, name


def test_the_joint_and_parallel_parts_are_filled_from_the_ledger(
    api: Api, database_url: str
) -> None:
    """Migration 0014 on a database with charges: a tally that equals its ledger gets the
    ledger's exact division into joint and parallel releases; one edited outside the service
    counts all of its spend as parallel, so its loss is the old rule's, never below it."""
    parallel: dict[str, Any] = {"release": "parallel", "input": {"values": [1, 2]}}
    for name in ("kept", "edited"):
        api.make_dataset(
            name,
            privacy_unit="user",
            max_partitions_per_user=2,
            budget={"epsilon": 10},
            windows=[{"period": "30d", "epsilon": 10}],
        )
        assert api.charge(dataset=name, partitions=["a", "b", "c"], epsilon=0.2).status_code == 201
        for partitions, epsilon in ((["a", "c"], 0.2), (["b", "c"], 0.1)):
            response = api.charge(dataset=name, partitions=partitions, epsilon=epsilon, **parallel)
            assert response.status_code == 201
    # s(c) of the edited dataset's lifetime scope raised by one unit (1e-9) in the database
    run_sql(
        database_url,
        "UPDATE tally_spends SET epsilon = epsilon + 1 WHERE tally_id = "
        "(SELECT t.id FROM tallies t JOIN datasets d ON d.id = t.dataset_id "
        "WHERE d.name = 'edited' AND t.kind = 'lifetime') AND partition_id = "
        "(SELECT p.id FROM partitions p JOIN datasets d ON d.id = p.dataset_id "
        "WHERE d.name = 'edited' AND p.key = 'c')",
    )
    api.client.application.extensions["accountant"].engine.dispose()  # its pooled connections
    downgrade(database_url, "0013")
    upgrade(database_url)
    # min(T_J, top-2 s_J) + min(T_P, top-2 s_P) = 0.2 + 0.5, against min(T, top-2 s) = 0.8
    assert api.budget("kept")["loss"]["epsilon"] == 0.7
    assert api.budget("edited")["loss"]["epsilon"] == 0.8
    engine = create_engine(database_url, poolclass=NullPool)
    with Session(engine) as session:
        differences = totals.check(session)[1]
    engine.dispose()
    assert {(d.dataset, d.scope) for d in differences} == {("edited", "lifetime")}
    assert sorted(d.what for d in differences) == [
        "T_J",
        "T_P",
        "s(c)",
        *(f"s_J({key})" for key in "abc"),
        *(f"s_P({key})" for key in "abc"),
    ]
