"""Signed receipts: offline verification with the public key alone, rotation, tampering."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from flask.testing import FlaskClient

from accountant.app import create_app, prepared_app
from accountant.db import begin_write
from accountant.services.consumers import ensure_first_admin
from tests.conftest import ADMIN_KEY, Api


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _verify_offline(token: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """What any holder of the public key can do, with no code from the service."""
    header_b64, claims_b64, signature_b64 = token.split(".")
    header = json.loads(_unb64(header_b64))
    assert header["alg"] == "EdDSA"
    jwk = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    public = Ed25519PublicKey.from_public_bytes(_unb64(jwk["x"]))
    public.verify(_unb64(signature_b64), f"{header_b64}.{claims_b64}".encode())
    claims: dict[str, Any] = json.loads(_unb64(claims_b64))
    return claims


def test_a_receipt_verifies_offline_and_binds_the_output(api: Api, client: FlaskClient) -> None:
    api.make_dataset()
    charged = api.charge(partitions=["a", "b"], epsilon=0.25, input={"values": [3.0, 4.0]})
    body = charged.get_json()
    jwks = client.get("/v1/receipts/public-key").get_json()  # no API key needed
    claims = _verify_offline(body["receipt"], jwks)
    assert claims["charge_id"] == body["charge_id"]
    assert claims["dataset"] == "clicks" and claims["partitions"] == ["a", "b"]
    assert claims["mechanism"] == "laplace" and claims["cost"]["epsilon"] == 0.25
    digest = hashlib.sha256(
        json.dumps(body["output"], sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert claims["output_sha256"] == digest
    online = api.post("/v1/receipts/verify", {"receipt": body["receipt"]}).get_json()
    assert online["valid"] is True and online["charge_id"] == body["charge_id"]


def test_a_tampered_receipt_is_invalid(api: Api) -> None:
    api.make_dataset()
    token = api.charge().get_json()["receipt"]
    header, claims, signature = token.split(".")
    forged = json.loads(_unb64(claims)) | {"cost": {"epsilon": 0.0001, "delta": 0}}
    forged_b64 = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    for bad in (f"{header}.{forged_b64}.{signature}", "not-a-token", token[:-4] + "AAAA"):
        result = api.post("/v1/receipts/verify", {"receipt": bad}).get_json()
        assert result["valid"] is False and result["reason"]


def test_the_key_file_is_private_and_old_receipts_verify_after_rotation(
    api: Api, database_url: str, signing_key_file: str
) -> None:
    api.make_dataset()
    old_receipt = api.charge().get_json()["receipt"]
    assert stat.S_IMODE(os.stat(signing_key_file).st_mode) == 0o600
    rotated = Path(signing_key_file).with_name("rotated.pem")
    app = prepared_app({"database_url": database_url, "signing_key_file": str(rotated)})
    new_api = Api(app.test_client(), ADMIN_KEY)
    new_receipt = new_api.charge().get_json()["receipt"]
    keys = new_api.client.get("/v1/receipts/public-key").get_json()["keys"]
    assert len(keys) == 2
    for token in (old_receipt, new_receipt):
        assert new_api.post("/v1/receipts/verify", {"receipt": token}).get_json()["valid"]


def test_the_output_hash_is_the_documented_one_for_non_ascii_outputs(
    api: Api, client: FlaskClient
) -> None:
    """README: sha256 of json.dumps(output, sort_keys=True, separators=(",", ":")), whose
    default escapes non-ASCII characters."""
    api.make_dataset()
    body = api.charge(
        mechanism="randomized_response",
        params={"epsilon": 1},
        input={"values": ["é", "ß"], "categories": ["é", "ß", "日本"]},
    ).get_json()
    claims = _verify_offline(body["receipt"], client.get("/v1/receipts/public-key").get_json())
    digest = hashlib.sha256(
        json.dumps(body["output"], sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert claims["output_sha256"] == digest


def test_a_key_first_used_before_it_could_be_published_still_verifies_after_rotation(
    tmp_path: Path,
) -> None:
    """The service starts while the database cannot take the key (no schema yet); the first
    charge publishes it in its own transaction, so its receipts verify after a rotation."""
    from accountant.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'late.db'}"
    early = prepared_app(
        {
            "database_url": url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": str(tmp_path / "first.pem"),
        }
    )
    upgrade(url)
    runtime = early.extensions["accountant"]
    with runtime.sessions() as session:  # the admin only: the key stays unpublished
        begin_write(session)
        ensure_first_admin(session, ADMIN_KEY, 0, runtime.key_hasher)
        session.commit()
    api = Api(early.test_client())
    assert api.get("/v1/receipts/public-key").status_code == 200
    assert api.make_dataset()
    receipt = api.charge().get_json()["receipt"]
    rotated = Api(
        prepared_app(
            {
                "database_url": url,
                "admin_key": ADMIN_KEY,
                "signing_key_file": str(tmp_path / "second.pem"),
            }
        ).test_client()
    )
    assert rotated.post("/v1/receipts/verify", {"receipt": receipt}).get_json()["valid"] is True


def test_building_the_app_creates_nothing_and_says_what_to_run(tmp_path: Path) -> None:
    """create_app reads the key files and writes nothing: no file, no admin, no key
    published; a missing file is an error naming the command that creates it."""
    from accountant.keyfiles import MissingKeyFile
    from accountant.migrate import upgrade
    from tests.conftest import run_sql

    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    settings = {
        "database_url": url,
        "admin_key": ADMIN_KEY,
        "signing_key_file": str(tmp_path / "keys" / "signing.pem"),
    }
    with pytest.raises(MissingKeyFile, match="accountant init"):
        create_app(settings)
    assert not (tmp_path / "keys").exists()
    prepared_app(settings)  # creates the files, the admin, and publishes the key
    for table in ("consumers", "signing_keys", "noise_secrets", "key_hash_secrets"):
        run_sql(url, f"DELETE FROM {table}")
    app = create_app(settings)
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "key-hash-secret",
        "noise-secret",
        "signing.pem",
    ]
    assert app.extensions["accountant"].settings.admin_key == ADMIN_KEY
    for table in ("consumers", "signing_keys", "noise_secrets", "key_hash_secrets"):
        assert run_sql(url, f"SELECT COUNT(*) FROM {table}") == [(0,)], table


def test_a_secret_file_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    settings = {"database_url": url, "signing_key_file": str(tmp_path / "signing.pem")}
    prepared_app(settings)
    assert not [r for r in caplog.records if "readable" in r.getMessage()]
    (tmp_path / "signing.pem").chmod(0o644)
    (tmp_path / "noise-secret").chmod(0o640)
    create_app(settings)
    warned = [r.getMessage() for r in caplog.records if "readable" in r.getMessage()]
    assert len(warned) == 2 and all("chmod 600" in message for message in warned)


def test_the_response_and_the_receipt_state_multiplicity_and_the_amount_charged(
    api: Api, client: FlaskClient
) -> None:
    """A parallel release over 3 partitions of a user dataset (at most 2 per user) costs 0.1
    per release and grows the running total by 0.2: both figures are stated and signed."""
    api.make_dataset(
        "people", privacy_unit="user", max_partitions_per_user=2, budget={"epsilon": 10}
    )
    body = api.charge(
        dataset="people",
        partitions=["a", "b", "c"],
        release="parallel",
        epsilon=0.1,
        input={"values": [1.0, 2.0, 3.0]},
    ).get_json()
    assert body["cost"]["epsilon"] == 0.1 and body["multiplicity"] == 2
    assert body["charged"]["epsilon"] == 0.2 == api.budget("people")["loss"]["epsilon"]
    claims = _verify_offline(body["receipt"], client.get("/v1/receipts/public-key").get_json())
    assert claims["multiplicity"] == 2 and claims["charged"] == {"epsilon": 0.2, "delta": 0.0}
