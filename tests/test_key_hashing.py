"""API keys are stored as HMAC-SHA256 under a server secret of the key's SHA-256: a leaked
table is not enough to test guesses of a key, older plain hashes are rehashed once, and a
host with another secret refuses to start."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from accountant import key_hashing
from accountant.app import prepared_app
from accountant.db import begin_write
from accountant.key_hashing import KeyHashSecretMismatch
from accountant.seals import NotSealed
from accountant.services import sealing
from tests.conftest import ADMIN_KEY, Api, run_sql


def _stored(database_url: str) -> list[str]:
    return [row[0] for row in run_sql(database_url, "SELECT key_hash FROM api_keys")]


def _secret(app: Flask) -> bytes:
    path = Path(app.extensions["accountant"].settings.key_hash_secret_file)
    return bytes.fromhex(path.read_text().strip())


def test_a_leaked_table_cannot_test_a_guess(app: Flask, api: Api, database_url: str) -> None:
    key = api.make_consumer("svc")
    stored = _stored(database_url)
    assert len(stored) == 2  # the admin's and the service's
    for plaintext in (ADMIN_KEY, key):
        plain = hashlib.sha256(plaintext.encode()).hexdigest()
        assert plain not in stored  # a guess hashed without the secret matches nothing
        keyed = hmac.new(
            _secret(app), hashlib.sha256(plaintext.encode()).digest(), hashlib.sha256
        ).hexdigest()
        assert keyed in stored
    assert api.as_key(key).get("/v1/consumers/me").status_code == 200
    assert (
        oct(Path(app.extensions["accountant"].settings.key_hash_secret_file).stat().st_mode & 0o777)
        == "0o600"
    )


def test_keys_hashed_before_are_rehashed_once_and_keep_working(
    app: Flask, api: Api, database_url: str, signing_key_file: str
) -> None:
    key = api.make_consumer("svc")
    # the database as a service before keyed hashing left it: plain SHA-256, no secret, and
    # (older than seals too) nothing sealed
    run_sql(database_url, "DELETE FROM key_hash_secrets")
    run_sql(database_url, "UPDATE consumers SET seal = NULL")
    for plaintext in (ADMIN_KEY, key):
        keyed = hmac.new(
            _secret(app), hashlib.sha256(plaintext.encode()).digest(), hashlib.sha256
        ).hexdigest()
        plain = hashlib.sha256(plaintext.encode()).hexdigest()
        run_sql(
            database_url, f"UPDATE api_keys SET key_hash = '{plain}' WHERE key_hash = '{keyed}'"
        )
    assert api.as_key(key).get("/v1/consumers/me").status_code == 401  # not yet rehashed
    config = {"database_url": database_url, "signing_key_file": signing_key_file}
    with pytest.raises(NotSealed):  # registered and rehashed, but never sealed unasked
        prepared_app(config)
    assert api.as_key(key).get("/v1/consumers/me").status_code == 200
    engine = create_engine(database_url)
    with Session(engine) as session:  # what 'accountant seals init' does
        begin_write(session)
        sealing.init(session, app.extensions["accountant"].key_hasher, 1, "operator@host")
        session.commit()
    engine.dispose()
    for _ in range(2):  # the second start changes nothing
        restarted = Api(prepared_app(config).test_client())
        for plaintext in (ADMIN_KEY, key):
            assert restarted.as_key(plaintext).get("/v1/consumers/me").status_code == 200
        assert hashlib.sha256(key.encode()).hexdigest() not in _stored(database_url)


def test_a_host_with_another_secret_refuses_to_start(
    app: Flask, database_url: str, tmp_path: Path
) -> None:
    other = {
        "database_url": database_url,
        "signing_key_file": str(tmp_path / "signing-key.pem"),
        "key_hash_secret_file": str(tmp_path / "elsewhere" / "key-hash-secret"),
    }
    key_hashing.load_or_create(Path(other["key_hash_secret_file"]))  # another host's secret
    with pytest.raises(KeyHashSecretMismatch, match="ACCOUNTANT_KEY_HASH_SECRET_FILE"):
        prepared_app(other)
    # the same secret, copied, starts
    copied = tmp_path / "copied-secret"
    copied.write_text(Path(app.extensions["accountant"].settings.key_hash_secret_file).read_text())
    prepared_app({**other, "key_hash_secret_file": str(copied)})
