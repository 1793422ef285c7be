"""A replay returns the first response byte for byte, or releases nothing: never new noise.

The noise of a charge is regenerated from the noise secret and the charge id.
These tests change what a replay depends on (the signing key, the noise
secret, the mechanism's implementation) and check that the answer is either
identical or a 409 that releases nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from accountant import hookimpl, noise
from accountant.app import prepared_app
from accountant.cli import main
from accountant.mechanism import Mechanism
from accountant.randomness import RandomSource
from accountant_plugins.laplace import LAPLACE
from tests.conftest import ADMIN_KEY, Api, run_sql

CHARGE: dict[str, Any] = {
    "input": {"values": [10.0, 20.0]},
    "headers": {"Idempotency-Key": "retry-me"},
}


def _app(
    database_url: str,
    folder: Path,
    *,
    key: str = "signing-key.pem",
    secret: str = "noise-secret",
    **extra: Any,
) -> Any:
    return prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": str(folder / key),
            "noise_secret_file": str(folder / secret),
        },
        **extra,
    )


def _first(database_url: str, tmp_path: Path) -> tuple[Api, Any]:
    api = Api(_app(database_url, tmp_path).test_client())
    api.make_dataset()
    first = api.charge(**CHARGE)
    assert first.status_code == 201
    return api, first


def test_rotating_the_signing_key_changes_no_replayed_byte(
    database_url: str, tmp_path: Path
) -> None:
    _, first = _first(database_url, tmp_path)
    rotated = Api(_app(database_url, tmp_path, key="rotated.pem").test_client())
    again = rotated.charge(**CHARGE)
    assert again.status_code == 201 and again.text == first.text
    # the old receipt still verifies, and the new key signs new charges
    check = rotated.post("/v1/receipts/verify", {"receipt": first.get_json()["receipt"]})
    assert check.get_json()["valid"] is True
    fresh = rotated.charge(input={"values": [10.0, 20.0]})
    assert fresh.get_json()["receipt"].split(".")[0] != first.get_json()["receipt"].split(".")[0]
    assert len(rotated.ledger()) == 2


def test_a_host_with_another_noise_secret_refuses_to_start(
    database_url: str, tmp_path: Path
) -> None:
    _first(database_url, tmp_path)
    noise.load_or_create(tmp_path / "other-secret")  # another host's secret
    with pytest.raises(noise.NoiseSecretMismatch, match="noise secret"):
        _app(database_url, tmp_path, secret="other-secret")
    env = {
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(tmp_path / "signing-key.pem"),
        "ACCOUNTANT_NOISE_SECRET_FILE": str(tmp_path / "other-secret"),
    }
    result = CliRunner().invoke(main, ["serve", "--port", "1"], env=env)
    assert result.exit_code != 0 and "is not the one this database is served with" in result.output


def test_after_the_secret_is_replaced_a_replay_is_refused_and_releases_nothing(
    database_url: str, tmp_path: Path
) -> None:
    api, first = _first(database_url, tmp_path)
    env = {
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(tmp_path / "signing-key.pem"),
        "ACCOUNTANT_NOISE_SECRET_FILE": str(tmp_path / "new-secret"),
    }
    adopted = CliRunner().invoke(main, ["noise-secret", "adopt", "--yes"], env=env)
    assert adopted.exit_code == 0, adopted.output
    replaced = Api(_app(database_url, tmp_path, secret="new-secret").test_client())
    refused = replaced.charge(**CHARGE)
    assert refused.status_code == 409
    assert refused.content_type == "application/problem+json"
    body = refused.get_json()
    assert body["type"].endswith("/replay-unavailable") and "output" not in body
    assert body["charge_id"] == first.get_json()["charge_id"]
    assert "noise secret" in body["detail"]
    for value in first.get_json()["output"]["values"]:
        assert repr(value) not in refused.text
    assert len(replaced.ledger()) == 1 and replaced.budget()["loss"]["epsilon"] == 0.1
    # and the old host may no longer serve
    with pytest.raises(noise.NoiseSecretMismatch):
        _app(database_url, tmp_path)
    assert api.get("/healthz").status_code == 200


class _Plugin:
    """A stand-in for a new release of the laplace plugin."""

    def __init__(self, mechanism: Mechanism) -> None:
        self.mechanism = mechanism

    @hookimpl
    def accountant_register_mechanisms(self) -> list[Mechanism]:
        return [self.mechanism]


def _upgraded(database_url: str, tmp_path: Path, mechanism: Mechanism) -> Api:
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": str(tmp_path / "signing-key.pem"),
            "noise_secret_file": str(tmp_path / "noise-secret"),
            "disabled_plugins": ("laplace",),
        },
        extra_plugins=[("laplace", _Plugin(mechanism))],
    )
    return Api(app.test_client())


def test_a_new_mechanism_version_refuses_the_replay(database_url: str, tmp_path: Path) -> None:
    _, first = _first(database_url, tmp_path)
    same = _upgraded(database_url, tmp_path, LAPLACE)
    assert same.charge(**CHARGE).text == first.text  # the same implementation replays
    newer = _upgraded(database_url, tmp_path, replace(LAPLACE, version="99"))
    refused = newer.charge(**CHARGE)
    assert refused.status_code == 409 and "laplace/laplace/99" in refused.get_json()["detail"]
    assert "output" not in refused.get_json()


def test_a_changed_sampler_without_a_new_version_is_caught_by_the_output_hash(
    database_url: str, tmp_path: Path
) -> None:
    _first(database_url, tmp_path)

    def shifted(
        params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource
    ) -> dict[str, Any]:
        out = LAPLACE.runner()(params, data, source)
        return {"values": [v + 1.0 for v in out["values"]]}

    changed = _upgraded(database_url, tmp_path, replace(LAPLACE, run=shifted))
    refused = changed.charge(**CHARGE)
    assert refused.status_code == 409 and "differs" in refused.get_json()["detail"]
    assert "output" not in refused.get_json()


def test_a_charge_recorded_without_provenance_is_not_replayed(
    database_url: str, tmp_path: Path
) -> None:
    api, _ = _first(database_url, tmp_path)
    body = (
        json.loads(run_sql(database_url, "SELECT facts FROM idempotency_keys")[0][0])
        if database_url.startswith("sqlite")
        else run_sql(database_url, "SELECT facts FROM idempotency_keys")[0][0]
    )
    body.pop("output_sha256")
    run_sql(
        database_url,
        "UPDATE idempotency_keys SET facts = '" + json.dumps(body).replace("'", "''") + "'",
    )
    refused = api.charge(**CHARGE)
    assert refused.status_code == 409 and "output" not in refused.get_json()


def test_the_ledger_records_what_produced_each_output(api: Api) -> None:
    api.make_dataset()
    assert api.charge().status_code == 201
    entry = api.ledger()[0]
    assert entry["implementation"] == f"laplace/laplace/{LAPLACE.version}"
    assert len(entry["noise_secret"]) == 32
    verified = api.get("/v1/ledger/verify").get_json()
    assert verified["ok"] is True


#: The output of each built-in version for one fixed secret, charge id and request. A change
#: of a sampler that changes these outputs needs a new version (``_common.SAMPLERS_VERSION`` or
#: the mechanism's own): replays of charges made before it are then refused, not re-noised.
GOLDEN: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "laplace": (
        {"epsilon": "0.5", "sensitivity": "1"},
        {"values": [1.5, 2.5, 1e6, Decimal("1152921504606847105.25")]},
        "3+samplers.3",
    ),
    "discrete_laplace": (
        {"epsilon": "0.5", "sensitivity": "1"},
        {"values": [3, 4]},
        "3+samplers.3",
    ),
    "gaussian": (
        {"epsilon": "0.5", "delta": "1e-6", "sensitivity": "1"},
        {"values": [Decimal("-2.5"), 10**18 + 1, Decimal("1e-7")]},
        "3+samplers.3",
    ),
    "discrete_gaussian": (
        {"sigma": "4000", "sensitivity": "1"},
        {"values": [3] * 40},
        "3+samplers.3",
    ),
    "exponential": (
        {"epsilon": "1e-9", "sensitivity": "1"},
        {"utilities": [1, 5, 2]},
        "3+samplers.3",
    ),
    "randomized_response": (
        {"epsilon": "0.5"},
        {"values": ["a", None, "b", "c"] * 5, "categories": ["a", "b", "c"]},
        "3+samplers.3",
    ),
}
GOLDEN_SHA256 = {
    "laplace": "5b0f25bef3a7f428fb9b372af9d4a822cc41169d2feeb8af3123c0054c13c1fa",
    "discrete_laplace": "caf136162cbee54d8b319c5a3a5914877a52048f6e7653e580bccc233da0a521",
    "gaussian": "cfa63bb8bcc30bdd1929b640bd83e6c10b730ee340acb1de5add1218eb023648",
    "discrete_gaussian": "64e37651c6d0ee65efef2c30d9c7bb3168b45631d9e9fc999dc512731701bbfe",
    "exponential": "498664be952a5e21d7df82566a947a140292f109313b41dcb5bd1c7b2ec14e0d",
    "randomized_response": "90813fbbe7faacf2e93445810c92f9e08dc27a8c8965f1b1532d1ce16a29425c",
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_each_builtin_version_reproduces_its_outputs(name: str) -> None:
    from accountant.plugins import MechanismRegistry, make_plugin_manager

    mechanism = MechanismRegistry(*make_plugin_manager()).get(name)
    assert mechanism is not None
    params, data, version = GOLDEN[name]
    assert mechanism.version == version, "a new version: update GOLDEN and GOLDEN_SHA256"
    digest = _output_digest(mechanism, params, data, "00000000-0000-4000-8000-000000000000")
    assert digest == GOLDEN_SHA256[name], (
        f"{name} {version} no longer reproduces its outputs: give it a new version"
    )


#: The same, for releases long enough to take the samplers' vectorised path (32 values or
#: more): the goldens above have fewer, and reach only the scalar one.
GOLDEN_VECTORS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "laplace": ({"epsilon": "0.5", "sensitivity": "1"}, {"values": [1.5] * 50 + [2.5e6] * 50}),
    "discrete_laplace": ({"epsilon": "0.5", "sensitivity": "1"}, {"size": 200}),
    "gaussian": ({"sigma": "3", "sensitivity": "1"}, {"values": [0.25] * 100}),
    "discrete_gaussian": ({"sigma": "4", "sensitivity": "1"}, {"size": 200}),
}
GOLDEN_VECTORS_SHA256 = {
    "laplace": "517326e9760136b09a755667de12ccd1879dccb25e7130c50b4ea8aef003e7b5",
    "discrete_laplace": "86909f8545a5244bf17969e3aa32cd79b36a44b3b58572025229fe21c0a1839b",
    "gaussian": "ce9c10253959085fdcc205df39c68b1a897bf770733375536d318a91bc4e01fb",
    "discrete_gaussian": "94e50038a25c7839c8c1fc7c0567f7a67e05aaa964a60f06e1c0ba228c008ae5",
}


@pytest.mark.parametrize("name", sorted(GOLDEN_VECTORS))
def test_each_builtin_version_reproduces_its_vectorised_outputs(name: str) -> None:
    from accountant.plugins import MechanismRegistry, make_plugin_manager

    mechanism = MechanismRegistry(*make_plugin_manager()).get(name)
    assert mechanism is not None
    assert mechanism.version == GOLDEN[name][2], "a new version: update the goldens"
    params, data = GOLDEN_VECTORS[name]
    digest = _output_digest(mechanism, params, data, "00000000-0000-4000-8000-000000000001")
    assert digest == GOLDEN_VECTORS_SHA256[name], (
        f"{name} {mechanism.version} no longer reproduces its outputs: give it a new version"
    )


def _output_digest(
    mechanism: Any, params: dict[str, Any], data: dict[str, Any], charge: str
) -> str:
    """The SHA-256 of ``mechanism``'s output for a fixed noise secret and charge id."""
    secret = noise.from_bytes(bytes(range(32)))
    output = mechanism.runner()(
        {k: Decimal(v) for k, v in params.items()}, data, secret.source_for(charge)
    )
    return hashlib.sha256(json.dumps(output, sort_keys=True).encode()).hexdigest()


def _restarted(database_url: str, tmp_path: Path, **settings: Any) -> Api:
    """The same database and secrets, served again with ``settings`` changed."""
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": str(tmp_path / "signing-key.pem"),
            "noise_secret_file": str(tmp_path / "noise-secret"),
            **settings,
        }
    )
    return Api(app.test_client())


def test_a_retry_that_would_now_be_refused_as_it_stands_gets_its_first_answer(
    database_url: str, tmp_path: Path
) -> None:
    """API.md: the same key with the same body returns the first response again. A retry
    of a committed request whose mechanism was disabled since, or whose input is over a
    vector limit lowered since, never gets a 400 (which says nothing was charged): a denial
    and a grant whose output can be made again come back byte for byte; a grant whose
    mechanism is gone is the 409 that releases nothing; another body is a 422."""
    api, first = _first(database_url, tmp_path)  # laplace on two values, granted
    denied = api.charge(epsilon=5, headers={"Idempotency-Key": "too-much"})
    assert denied.status_code == 409
    lower = _restarted(database_url, tmp_path, max_vector_length=1)
    assert lower.charge(**CHARGE).text == first.text
    assert lower.charge(input={"values": [1.0, 2.0]}).status_code == 400  # a new request
    disabled = _restarted(database_url, tmp_path, disabled_plugins=("laplace",))
    gone = disabled.charge(**CHARGE)
    assert gone.status_code == 409 and gone.get_json()["type"].endswith("/replay-unavailable")
    assert "not registered here now" in gone.get_json()["detail"] and "output" not in gone.text
    again = disabled.charge(epsilon=5, headers={"Idempotency-Key": "too-much"})
    assert (again.status_code, again.text) == (409, denied.text)
    other = disabled.charge(epsilon=0.2, **CHARGE)
    assert other.status_code == 422
    assert disabled.charge(input={"values": [1.0]}).status_code == 400  # no key: refused
    assert len(disabled.ledger()) == 2  # nothing charged by any retry


def test_a_hold_batch_and_settle_retried_after_a_change_get_their_first_answers(
    database_url: str, tmp_path: Path
) -> None:
    api = Api(_app(database_url, tmp_path).test_client())
    api.make_dataset(accounting="rdp", rdp_order=8, budget={"epsilon": 10, "delta": 1e-6})
    params = {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 100, "sensitivity": 1}
    hold_body = {
        "dataset": "clicks",
        "partitions": ["h"],
        "expires_in": 600,
        "mechanism": "subsampled_gaussian",
        "params": params,
    }
    held = api.post("/v1/holds", hold_body, headers={"Idempotency-Key": "h1"})
    assert held.status_code == 201, held.get_json()
    settle_path = f"/v1/holds/{held.get_json()['hold_id']}/settle"
    settle_body = {"params": {"steps": 50}}
    settled = api.post(settle_path, settle_body, headers={"Idempotency-Key": "s1"})
    assert settled.status_code == 200, settled.get_json()
    item = {
        "dataset": "clicks",
        "partitions": ["b"],
        "mechanism": "laplace",
        "params": {"epsilon": 0.1, "sensitivity": 1},
        "input": {"values": [1.0, 2.0]},
    }
    batch_body = {"items": [item, {**item, "partitions": ["c"]}]}
    batch = api.post("/v1/charges/batch", batch_body, headers={"Idempotency-Key": "b1"})
    assert batch.status_code == 201, batch.get_json()
    entries = len(api.ledger())
    later = _restarted(
        database_url, tmp_path, disabled_plugins=("subsampled_gaussian",), max_vector_length=1
    )
    for path, body, key, first in (
        ("/v1/holds", hold_body, "h1", held),
        (settle_path, settle_body, "s1", settled),
        ("/v1/charges/batch", batch_body, "b1", batch),
    ):
        again = later.post(path, body, headers={"Idempotency-Key": key})
        assert (again.status_code, again.text) == (first.status_code, first.text), path
        assert later.post(path, body).status_code == 400, path  # without its key: refused
    assert len(later.ledger()) == entries


def test_a_revoked_key_gets_401_not_the_first_answer_of_a_request_now_refused(
    database_url: str, tmp_path: Path
) -> None:
    """A host that remembers a key (tests/test_known_keys.py) reads it again under the
    charge's lock; a retry answered from its first answer, without that transaction, reads
    it again first: a key revoked since gets 401 and no output."""
    first_host = Api(_app(database_url, tmp_path).test_client())
    lower = _restarted(database_url, tmp_path, max_vector_length=1)  # another host
    first_host.make_dataset(budget={"epsilon": 10})
    first_host.make_consumer("svc", datasets=["clicks"])
    issued = first_host.post("/v1/consumers/svc/keys").get_json()
    on_first, on_lower = first_host.as_key(issued["api_key"]), lower.as_key(issued["api_key"])
    assert on_first.charge(**CHARGE).status_code == 201
    assert on_lower.charge(input={"values": [1.0]}).status_code == 201  # remembered there
    assert first_host.call("DELETE", f"/v1/keys/{issued['id']}").status_code == 204
    again = on_lower.charge(**CHARGE)
    assert again.status_code == 401 and "output" not in again.text, again.get_json()


def test_a_hold_priced_before_the_lock_replays_after_its_grant_is_removed(api: Api) -> None:
    """A hold priced by an accounting-only mechanism is priced once before the lock; a
    retry of a committed one answers as a charge's retry does after the grant is gone: its
    first answer, not the 403 of that pricing."""
    api.make_dataset(accounting="rdp", rdp_order=8, budget={"epsilon": 10, "delta": 1e-6})
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    params = {"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 100, "sensitivity": 1}
    body = {
        "dataset": "clicks",
        "partitions": ["h"],
        "expires_in": 600,
        "mechanism": "subsampled_gaussian",
        "params": params,
    }
    first = service.post("/v1/holds", body, headers={"Idempotency-Key": "h1"})
    assert first.status_code == 201, first.get_json()
    api.make_dataset("other", budget={"epsilon": 1})
    assert api.patch("/v1/consumers/svc", {"datasets": ["other"]}).status_code == 200
    again = service.post("/v1/holds", body, headers={"Idempotency-Key": "h1"})
    assert (again.status_code, again.text) == (201, first.text)
    assert service.post("/v1/holds", body).status_code == 403  # a new hold is refused
