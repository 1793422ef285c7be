"""Seals cannot be laundered: the service never seals rows that exist, a database without
its seals is DAMAGED wherever it is verified, and only `accountant seals init`, ledgered,
seals a database from before seals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flask import Flask

from accountant.app import prepared_app
from accountant.seals import NotSealed
from tests.conftest import ADMIN_KEY, Api, run_sql

BIN = Path(sys.executable).parent / "accountant"


def _accountant(
    database_url: str, signing_key_file: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """The command on the service's host: its database and its secret files."""
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
    }
    return subprocess.run([BIN, *args], env=env, capture_output=True, text=True, timeout=120)


def _seals(database_url: str) -> list[tuple[str, str | None]]:
    return (
        [
            (row[0], row[1])
            for row in run_sql(database_url, "SELECT name, seal FROM consumers ORDER BY id")
        ]
        + [
            (row[0], row[1])
            for row in run_sql(database_url, "SELECT name, terms_seal FROM datasets ORDER BY id")
        ]
        + [
            (f"{row[0]} head", row[1])
            for row in run_sql(database_url, "SELECT name, head_seal FROM datasets ORDER BY id")
        ]
    )


def _sealed_at(database_url: str) -> int | None:
    value = run_sql(database_url, "SELECT sealed_at FROM key_hash_secrets")[0][0]
    return None if value is None else int(value)


def _from_before_seals(database_url: str) -> None:
    """The database as migrations 0011 and 0016 leave one from before seals."""
    run_sql(database_url, "UPDATE datasets SET terms_seal = NULL, head_seal = NULL")
    run_sql(database_url, "UPDATE consumers SET seal = NULL")
    run_sql(database_url, "UPDATE key_hash_secrets SET sealed_at = NULL, heads_sealed_at = NULL")


@pytest.fixture
def books(api: Api) -> Api:
    api.make_dataset(budget={"epsilon": 10})
    api.make_dataset("other", budget={"epsilon": 2})
    api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 1}})
    assert api.charge(epsilon=0.5).status_code == 201
    return api


def test_a_laundered_seal_is_caught_and_never_resealed(
    app: Flask, books: Api, database_url: str, signing_key_file: str, tmp_path: Path
) -> None:
    """The attack: a service consumer made admin and the record of the seals cleared, so
    that the next start would seal everything as it stands. Every verify names the consumer,
    and neither `serve` nor `init` seals anything."""
    run_sql(database_url, "UPDATE consumers SET role = 'admin' WHERE name = 'svc'")
    run_sql(database_url, "UPDATE key_hash_secrets SET sealed_at = NULL")
    before = _seals(database_url)
    result = _accountant(database_url, signing_key_file, "ledger", "verify")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "DAMAGED" in result.stderr and "consumer 'svc'" in result.stderr
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["seals_checked"] is True
    assert "consumer 'svc'" in body["reason"]
    with app.test_client() as browser:
        page = browser.get("/dashboard/sign-in").get_data(as_text=True)
        csrf = page.split('name="csrf" value="')[1].split('"')[0]
        browser.post("/dashboard/sign-in", data={"api_key": ADMIN_KEY, "csrf": csrf})
        ledger_page = browser.get("/dashboard/ledger?verify=1").get_data(as_text=True)
    assert "damaged" in ledger_page and "svc" in ledger_page
    for command in (("serve", "--port", "0"), ("init",)):
        started = _accountant(database_url, signing_key_file, *command)
        assert started.returncode == 1, (command, started.stdout, started.stderr)
        assert "sealed_at" in started.stderr and "does not start" in started.stderr
    with pytest.raises(NotSealed):
        prepared_app({"database_url": database_url, "signing_key_file": signing_key_file})
    assert _seals(database_url) == before and _sealed_at(database_url) is None
    again = _accountant(database_url, signing_key_file, "ledger", "verify")
    assert again.returncode == 1 and "consumer 'svc'" in again.stderr
    refused = _accountant(database_url, signing_key_file, "seals", "init")
    assert refused.returncode == 1 and "refused" in refused.stderr
    assert _seals(database_url) == before and _sealed_at(database_url) is None


def test_a_database_from_before_seals_is_sealed_only_by_seals_init(
    books: Api, database_url: str, signing_key_file: str
) -> None:
    _from_before_seals(database_url)
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and "accountant seals init" in body["reason"]
    verify = _accountant(database_url, signing_key_file, "ledger", "verify")
    assert verify.returncode == 1 and "never sealed" in verify.stderr
    # nothing writes to it, so nothing is sealed before the operator says so
    with pytest.raises(NotSealed, match="accountant seals init"):
        prepared_app({"database_url": database_url, "signing_key_file": signing_key_file})
    create = _accountant(
        database_url, signing_key_file, "keys", "create", "--name", "late", "--role", "auditor"
    )
    assert create.returncode == 1 and "accountant seals init" in create.stderr
    assert all(seal is None for _, seal in _seals(database_url))
    assert _accountant(database_url, signing_key_file, "seals", "init", "--help").returncode == 0
    sealed = _accountant(database_url, signing_key_file, "seals", "init")
    assert sealed.returncode == 0, sealed.stderr
    assert "sealed 2 datasets and 2 consumers" in sealed.stdout
    assert "consumer svc: service on clicks, 1 live keys" in sealed.stdout
    assert "consumer admin: admin, 1 live keys" in sealed.stdout
    assert all(seal is not None for _, seal in _seals(database_url))
    # ledgered: each dataset's chain says who sealed it, and still verifies
    for name in ("clicks", "other"):
        last = books.ledger(dataset=name)[-1]
        assert last["kind"] == "limit_change" and last["detail"]["scope"] == "seals"
        assert "@" in last["detail"]["sealed_by"]
        assert last["detail"]["sealed_by"] in sealed.stdout
    verify = _accountant(database_url, signing_key_file, "ledger", "verify")
    assert verify.returncode == 0 and "note" not in verify.stderr, verify.stderr
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is True and body["seals_checked"] is True
    again = _accountant(database_url, signing_key_file, "seals", "init")
    assert again.returncode == 1 and "refused" in again.stderr
    # from now on a missing seal is a broken one, and a start never fills it in
    run_sql(database_url, "UPDATE consumers SET seal = NULL WHERE name = 'svc'")
    prepared_app({"database_url": database_url, "signing_key_file": signing_key_file})
    assert dict(_seals(database_url))["svc"] is None
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and "consumer 'svc' has no seal" in body["reason"]


def test_seals_init_refuses_a_ledger_that_does_not_verify(
    books: Api, database_url: str, signing_key_file: str
) -> None:
    _from_before_seals(database_url)
    run_sql(database_url, "UPDATE ledger_entries SET cost_epsilon = 1 WHERE seq = 1")
    refused = _accountant(database_url, signing_key_file, "seals", "init")
    assert refused.returncode == 1 and "does not verify" in refused.stderr
    assert all(seal is None for _, seal in _seals(database_url))


def test_a_new_database_is_sealed_as_it_is_written(
    database_url: str, signing_key_file: str
) -> None:
    """Not laundering: on a database with no dataset and no key, seals begin with the first
    key, whether `keys create` or the service makes it."""
    created = _accountant(
        database_url, signing_key_file, "keys", "create", "--name", "root", "--role", "admin"
    )
    assert created.returncode == 0, created.stderr
    assert _sealed_at(database_url) is not None
    api = Api(
        prepared_app(
            {"database_url": database_url, "signing_key_file": signing_key_file}
        ).test_client(),
        created.stdout.strip(),
    )
    api.make_dataset(budget={"epsilon": 1})
    api.make_consumer("svc", datasets=["clicks"])
    verify = _accountant(database_url, signing_key_file, "ledger", "verify")
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    assert all(seal is not None for _, seal in _seals(database_url))
    body = api.get("/v1/ledger/verify").get_json()
    assert body["ok"] is True and body["seals_checked"] is True


def test_a_change_through_the_service_never_seals_an_edit(
    books: Api, database_url: str, signing_key_file: str
) -> None:
    """A key issued, a quota changed or a limit changed reseals its consumer or dataset as
    it then stands: on rows edited in the database that would vouch for the edit, so each
    is refused (409) and nothing changes; revoking a key is allowed and leaves the seal
    broken."""
    run_sql(database_url, "UPDATE consumers SET role = 'admin' WHERE name = 'svc'")
    before = _seals(database_url)
    issued = books.post("/v1/consumers/svc/keys", {})
    assert issued.status_code == 409 and "consumer 'svc'" in issued.get_json()["detail"]
    patched = books.patch("/v1/consumers/svc", {"quotas": {"clicks": {"epsilon": 2}}})
    assert patched.status_code == 409, patched.get_json()
    create = _accountant(
        database_url, signing_key_file, "keys", "create", "--name", "svc", "--role", "admin"
    )
    assert create.returncode == 1 and "consumer 'svc'" in create.stderr
    [key] = [
        k
        for c in books.get("/v1/consumers").get_json()["consumers"]
        for k in c["keys"]
        if c["name"] == "svc"
    ]
    assert books.call("DELETE", f"/v1/keys/{key['id']}").status_code == 204
    assert _seals(database_url) == before  # revoked, not resealed
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and "consumer 'svc'" in body["reason"]
    # a dataset's limit raised with its digest, before its first entry: only its seal shows
    run_sql(database_url, "UPDATE consumers SET role = 'service' WHERE name = 'svc'")
    run_sql(database_url, "UPDATE consumers SET seal = NULL WHERE name = 'svc'")
    _raise_limit(database_url, "other")
    entries = len(books.ledger(dataset="other"))
    changed = books.patch("/v1/datasets/other", {"windows": [{"period": "1d", "epsilon": 1}]})
    assert changed.status_code == 409 and "dataset 'other'" in changed.get_json()["detail"]
    assert len(books.ledger(dataset="other")) == entries
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "other"
    issued = books.post("/v1/consumers/svc/keys", {})  # a missing seal is a broken one
    assert issued.status_code == 409


def _raise_limit(database_url: str, name: str) -> None:
    """Raise a dataset's lifetime limit tenfold with the matching digest, as someone who
    can write the database but holds no secret can."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from accountant.models import Dataset
    from accountant.services import terms

    engine = create_engine(database_url)
    with Session(engine) as session:
        dataset = session.execute(select(Dataset).where(Dataset.name == name)).scalar_one()
        assert dataset.limit_epsilon is not None
        dataset.limit_epsilon = dataset.limit_epsilon * 10
        dataset.terms_sha256 = terms.digest(dataset)
        session.commit()
    engine.dispose()
