"""The hash chain catches edited, deleted and reordered entries, directly in the database."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select
from sqlalchemy.orm import Session

from accountant.models import Consumer, Dataset, LedgerEntry
from accountant.services.ledger import canonical, chain_hash
from tests.conftest import Api, run_sql

BIN = Path(sys.executable).parent / "accountant"


@pytest.fixture
def busy(api: Api) -> Api:
    api.make_dataset(budget={"epsilon": 10})
    api.make_dataset("other", budget={"epsilon": 1}, windows=[{"period": "1d", "epsilon": 1}])
    for index in range(5):
        api.charge(partitions=[f"p{index}"], epsilon=0.1)
    api.charge(dataset="other", epsilon=2)  # denied, also chained
    api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 9}})
    return api


def _sql(database_url: str, statement: str) -> None:
    run_sql(database_url, statement)


def test_an_intact_ledger_verifies(busy: Api, database_url: str) -> None:
    body = busy.get("/v1/ledger/verify").get_json()
    assert body["ok"] is True and body["entries"] == 7
    assert set(body["heads"]) == {"clicks", "other"}
    entries = busy.ledger(dataset="clicks")
    assert body["heads"]["clicks"] == entries[-1]["hash"]
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": database_url}
    result = subprocess.run([BIN, "ledger", "verify"], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and "ok: 7 entries" in result.stdout


TAMPERING = {
    "edited cost": "UPDATE ledger_entries SET cost_epsilon = 1 WHERE dataset_id = 1 AND seq = 3",
    "edited status": "UPDATE ledger_entries SET status = 'denied' WHERE dataset_id = 1 AND seq = 1",
    "edited partitions": "UPDATE ledger_entries SET partitions = '[\"zz\"]' WHERE seq = 2 "
    "AND dataset_id = 1",
    "deleted middle": "DELETE FROM ledger_entries WHERE dataset_id = 1 AND seq = 2",
    "deleted last": "DELETE FROM ledger_entries WHERE dataset_id = 1 AND seq = 6",
    "reordered": "UPDATE ledger_entries SET seq = CASE seq WHEN 2 THEN 3 ELSE 2 END "
    "WHERE dataset_id = 1 AND seq IN (2, 3)",
    "ids swapped": "",
    "limit edited": "UPDATE datasets SET limit_epsilon = limit_epsilon * 10 WHERE id = 1",
    "limit and its digest edited": "UPDATE datasets SET limit_epsilon = limit_epsilon * 10, "
    "terms_sha256 = 'f' WHERE id = 1",
    "window limit edited": "UPDATE window_budgets SET limit_epsilon = limit_epsilon * 10",
    "bound edited": "UPDATE datasets SET accounting = 'approx' WHERE id = 2",
}


#: Cases that no single entry shows: the chain ends early, or the limits were edited.
_NO_BAD_ENTRY = {
    "deleted last",
    "limit edited",
    "limit and its digest edited",
    "window limit edited",
    "bound edited",
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampering_is_caught(busy: Api, database_url: str, case: str) -> None:
    if case == "ids swapped":  # GET /v1/ledger lists seq 3 before seq 2 then
        a, b = (
            row[0]
            for row in run_sql(
                database_url,
                "SELECT id FROM ledger_entries WHERE dataset_id = 1 AND seq IN (2, 3) ORDER BY seq",
            )
        )
        _sql(database_url, f"UPDATE ledger_entries SET id = -id WHERE id IN ({a}, {b})")
        _sql(
            database_url,
            f"UPDATE ledger_entries SET id = CASE id WHEN -{a} THEN {b} "
            f"ELSE {a} END WHERE id IN (-{a}, -{b})",
        )
    elif case == "reordered":
        _sql(
            database_url,
            "UPDATE ledger_entries SET seq = -seq WHERE dataset_id = 1 AND seq IN (2, 3)",
        )
        _sql(
            database_url,
            "UPDATE ledger_entries SET seq = CASE seq WHEN -2 THEN 3 ELSE 2 END "
            "WHERE dataset_id = 1 AND seq IN (-2, -3)",
        )
    else:
        _sql(database_url, TAMPERING[case])
    body = busy.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False
    assert (
        body["dataset"]
        == ("other" if case in ("window limit edited", "bound edited") else "clicks")
        and body["reason"]
    )
    if case not in _NO_BAD_ENTRY:
        assert body["first_bad_entry"]["dataset"] == "clicks"
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": database_url}
    result = subprocess.run([BIN, "ledger", "verify"], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "DAMAGED" in result.stderr


def test_totals_rebuilt_from_the_ledger_match_and_edits_are_reported(
    api: Api, database_url: str
) -> None:
    api.make_dataset(
        privacy_unit="user",
        max_partitions_per_user=2,
        budget={"epsilon": 10},
        windows=[{"period": "1d", "epsilon": 5}],
    )
    service = api.as_key(api.make_consumer("svc", datasets=["clicks"]))
    api.charge(
        partitions=["a", "b", "c"], release="parallel", epsilon=0.5, input={"values": [1, 2, 3]}
    )
    service.charge(partitions=["a"], epsilon=0.25)
    api.charge(partitions=["b"], epsilon=20)  # denied: not in the totals
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": database_url}
    command: list[str | Path] = [BIN, "ledger", "rebuild-totals", "--check"]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "2 granted ledger entries" in result.stdout
    run_sql(
        database_url,
        "UPDATE tally_spends SET epsilon = epsilon - 1 WHERE partition_id = "
        "(SELECT id FROM partitions WHERE key = 'a')",
    )
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "s(a)" in result.stderr


REWOUND = {
    "last entry deleted, head rewound": [
        "DELETE FROM ledger_entries WHERE dataset_id = 1 AND seq = 6",
        "UPDATE datasets SET ledger_seq = 5, ledger_head = (SELECT hash FROM ledger_entries "
        "WHERE dataset_id = 1 AND seq = 5) WHERE id = 1",
    ],
    "whole chain deleted": [
        "DELETE FROM ledger_entries WHERE dataset_id = 1",
        "UPDATE datasets SET ledger_seq = 0, ledger_head = '' WHERE id = 1",
    ],
}


@pytest.mark.parametrize("export_format", ["jsonl", "csv"])
@pytest.mark.parametrize("case", sorted(REWOUND))
def test_a_truncation_the_chain_cannot_see_is_caught_against_an_earlier_export(
    busy: Api, database_url: str, tmp_path: Path, case: str, export_format: str
) -> None:
    copy = tmp_path / f"earlier.{export_format}"
    copy.write_text(busy.get(f"/v1/ledger/export?format={export_format}").text)
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": database_url}
    verify: list[str | Path] = [BIN, "ledger", "verify", "--against", str(copy)]
    assert subprocess.run(verify, env=env, capture_output=True).returncode == 0
    for statement in REWOUND[case]:
        _sql(database_url, statement)
    # The chain alone is blind to a deleted chain (the deleted last entry here is the limit
    # change, so the limits no longer match what the last remaining entry recorded); the
    # head's seal is not: the rewound head is not the one the service sealed.
    env_alone = {**env, "ACCOUNTANT_KEY_HASH_SECRET_FILE": str(tmp_path / "absent")}
    chain_alone = subprocess.run([BIN, "ledger", "verify"], env=env_alone, capture_output=True)
    assert chain_alone.returncode == (0 if case == "whole chain deleted" else 1)
    body = busy.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "clicks"
    result = subprocess.run(verify, env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "DAMAGED: dataset 'clicks'" in result.stderr, result.stderr


def test_every_limit_the_service_sets_keeps_the_terms_digest(api: Api) -> None:
    api.make_dataset(
        "z",
        accounting="zcdp",
        budget={"epsilon": 4, "delta": 1e-6},
        windows=[{"period": "1d", "epsilon": 2}],
    )
    api.make_dataset(
        "u",
        privacy_unit="user",
        max_partitions_per_user=3,
        budget={"epsilon": 3},
        partition_budget={"epsilon": 1},
    )
    api.charge(dataset="z", mechanism="gaussian", params={"sigma": 20, "sensitivity": 1})
    changes: list[tuple[str, dict[str, Any]]] = [
        ("z", {"windows": [{"period": "1h", "epsilon": 1}, {"period": "7d", "epsilon": 3}]}),
        ("z", {"budget": {"epsilon": 5, "delta": 1e-7}}),
        ("z", {"windows": []}),
        ("u", {"partition_budget": {"epsilon": 2}, "budget": {"epsilon": 2.5}}),
        ("u", {"partition_budget": None}),
    ]
    for dataset, change in changes:
        response = api.patch(f"/v1/datasets/{dataset}", {**change, "reason": "test"})
        assert response.status_code == 200, response.get_json()
        assert api.get("/v1/ledger/verify").get_json()["ok"] is True, change


def test_a_receipt_anchors_the_chain_against_a_truncation(api: Api, database_url: str) -> None:
    """Each receipt carries its charge's ledger entry (seq and hash, the chain's head right
    after it): cutting the ledger back behind a receipt leaves a chain that verifies, and a
    receipt that says its entry is gone."""
    api.make_dataset(budget={"epsilon": 10})
    replies = [api.charge(partitions=[f"p{index}"]).get_json() for index in range(3)]
    last = replies[-1]
    entries = api.ledger(dataset="clicks")
    assert last["ledger"] == {"seq": 3, "hash": entries[-1]["hash"]}
    verdict = api.post("/v1/receipts/verify", {"receipt": last["receipt"]}).get_json()
    assert verdict["valid"] is True and verdict["in_ledger"] is True
    assert verdict["claims"]["ledger"] == last["ledger"]
    for statement in (
        "DELETE FROM ledger_entries WHERE dataset_id = 1 AND seq = 3",
        "UPDATE datasets SET ledger_seq = 2, ledger_head = (SELECT hash FROM "
        "ledger_entries WHERE dataset_id = 1 AND seq = 2) WHERE id = 1",
    ):
        _sql(database_url, statement)
    body = api.get("/v1/ledger/verify").get_json()  # the chain alone is blind; its head's seal
    assert body["ok"] is False and "is not the one the service sealed" in body["reason"]
    verdict = api.post("/v1/receipts/verify", {"receipt": last["receipt"]}).get_json()
    assert verdict["valid"] is True and verdict["in_ledger"] is False
    assert "cut back" in verdict["reason"]
    earlier = api.post("/v1/receipts/verify", {"receipt": replies[0]["receipt"]}).get_json()
    assert earlier["in_ledger"] is True  # entries before the cut are still as signed


def test_limits_rewritten_with_a_matching_digest_are_caught_by_the_charges(
    busy: Api, database_url: str
) -> None:
    """'other' has had no limit change; its denied charge recorded the terms it was checked
    against, inside the chain, so limits edited with a recomputed digest still show."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from accountant.models import Dataset
    from accountant.services import terms

    engine = create_engine(database_url)
    with Session(engine) as session:
        dataset = session.execute(select(Dataset).where(Dataset.name == "other")).scalar_one()
        assert dataset.limit_epsilon is not None
        dataset.limit_epsilon = dataset.limit_epsilon * 10
        dataset.terms_sha256 = terms.digest(dataset)
        session.commit()
    engine.dispose()
    body = busy.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "other"
    assert "last ledger entry" in body["reason"]


#: Edits a chain cannot see, since no entry records them, and the seal that shows each.
SEALED = {
    "limits and digest edited before the first entry": (
        "fresh",
        None,
    ),
    "quota raised": (
        "UPDATE grants SET quota_epsilon = quota_epsilon * 100 WHERE has_quota",
        "consumer 'svc'",
    ),
    "quota removed": (
        "UPDATE grants SET has_quota = false, quota_epsilon = NULL, quota_delta = NULL, "
        "quota_rho = NULL WHERE has_quota",
        "consumer 'svc'",
    ),
    "grant added": (
        "INSERT INTO grants (consumer_id, dataset_id, has_quota) SELECT c.id, d.id, false "
        "FROM consumers AS c, datasets AS d WHERE c.name = 'svc' AND d.name = 'other'",
        "consumer 'svc'",
    ),
    "role escalated": ("UPDATE consumers SET role = 'admin' WHERE name = 'svc'", "consumer 'svc'"),
    "revoked key restored": (
        "UPDATE api_keys SET revoked_at = NULL WHERE revoked_at IS NOT NULL",
        "consumer 'svc'",
    ),
    "key moved to the admin": (
        "UPDATE api_keys SET consumer_id = (SELECT id FROM consumers WHERE name = 'admin') "
        "WHERE revoked_at IS NULL AND consumer_id = (SELECT id FROM consumers WHERE name = 'svc')",
        "consumer 'admin'",
    ),
}


@pytest.mark.parametrize("case", sorted(SEALED))
def test_seals_catch_what_the_chain_cannot(
    busy: Api, database_url: str, signing_key_file: str, case: str
) -> None:
    busy.make_dataset("fresh", budget={"epsilon": 1})  # no entry yet
    busy.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 0.5}})
    spare = busy.post("/v1/consumers/svc/keys", {}).get_json()["id"]
    assert busy.call("DELETE", f"/v1/keys/{spare}").status_code == 204
    before = busy.get("/v1/ledger/verify").get_json()
    assert before["ok"] is True and before["seals_checked"] is True
    statement, named = SEALED[case]
    if statement == "fresh":
        _rewrite_terms(database_url, "fresh")
    else:
        _sql(database_url, statement)
    body = busy.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["seals_checked"] is True, body
    if named is None:
        assert body["dataset"] == "fresh" and "sealed" in body["reason"]
    else:
        assert body["dataset"] is None and named in body["reason"]
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_KEY_HASH_SECRET_FILE": str(Path(signing_key_file).parent / "key-hash-secret"),
    }
    result = subprocess.run([BIN, "ledger", "verify"], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "DAMAGED" in result.stderr and "sealed" in result.stderr


def test_without_the_secret_verify_checks_the_chains_and_says_so(
    busy: Api, database_url: str, tmp_path: Path
) -> None:
    """A role escalated in the database shows only in a seal: the command without the
    key-hash secret says the chains are ok and that it did not check seals; with another
    database's secret it cannot check them, and exits 1 saying so; the service, which
    holds the secret, reports the edit."""
    busy.make_consumer("svc", datasets=["clicks"])
    _sql(database_url, "UPDATE consumers SET role = 'admin' WHERE name = 'svc'")
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_KEY_HASH_SECRET_FILE": str(tmp_path / "absent"),
    }
    result = subprocess.run([BIN, "ledger", "verify"], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and "seals not checked" in result.stderr
    assert not (tmp_path / "absent").exists()  # verify never creates a secret
    (tmp_path / "other").write_text("ab" * 32)  # another database's secret proves nothing
    env["ACCOUNTANT_KEY_HASH_SECRET_FILE"] = str(tmp_path / "other")
    result = subprocess.run([BIN, "ledger", "verify"], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "ok: " in result.stdout
    assert "NOT VERIFIED: seals not checked" in result.stderr and "(id " in result.stderr
    body = busy.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and "consumer 'svc'" in body["reason"]


def _rewrite_terms(database_url: str, name: str) -> None:
    """Raise a dataset's lifetime limit tenfold and store the matching digest, as someone
    who can write the database but holds no secret can."""
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


def test_keys_issued_at_once_leave_a_seal_that_holds(app: Flask, database_url: str) -> None:
    """Each key issued reseals its consumer from what the transaction sees; without the
    consumer row's lock, two at once on PostgreSQL each leave out the other's key."""
    api = Api(app.test_client())
    api.make_dataset()
    api.make_consumer("svc", datasets=["clicks"])

    def issue(_: int) -> int:
        with app.test_client() as client:
            return int(Api(client).post("/v1/consumers/svc/keys", {}).status_code)

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert set(pool.map(issue, range(24))) == {201}
    body = api.get("/v1/ledger/verify").get_json()
    assert body["ok"] is True and body["seals_checked"] is True, body


def test_a_last_entry_rewritten_with_its_hash_recomputed_is_named(
    busy: Api, app: Flask, database_url: str
) -> None:
    """The chain of a last entry edited with its hash recomputed (the canonical form is
    public) holds together, and it ends at the seq the dataset records: the head the dataset
    records is what shows it, and verify names that entry (it said "entries deleted?")."""
    with Session(app.extensions["accountant_engine"]) as session:
        last = session.execute(
            select(LedgerEntry)
            .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
            .where(Dataset.name == "clicks")
            .order_by(LedgerEntry.seq.desc())
            .limit(1)
        ).scalar_one()
        consumer = None if last.consumer_id is None else session.get(Consumer, last.consumer_id)
        last.created_at += 1
        last.hash = chain_hash(
            last.prev_hash, canonical(last, "clicks", consumer.name if consumer else None)
        )
        seq = last.seq
        session.commit()
    body = busy.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "clicks"
    assert body["first_bad_entry"]["seq"] == seq and "rewritten" in body["reason"]
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": database_url}
    result = subprocess.run([BIN, "ledger", "verify"], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and f"seq {seq}" in result.stderr
    assert "deleted" not in result.stderr


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE holds SET amount_epsilon = amount_epsilon * 10",
        "UPDATE holds SET multiplicity = 2",
        'UPDATE holds SET partitions = \'["p1", "p2"]\'',
    ],
    ids=["amount", "multiplicity", "partitions"],
)
def test_a_hold_edited_in_the_database_is_caught(api: Api, database_url: str, edit: str) -> None:
    """A hold's amount is what its draws are checked against, kept in the holds table: one
    raised there would let draws take more than the hold charged. verify compares each
    hold with the ledger entry that charged it."""
    api.make_dataset(budget={"epsilon": 10})
    body = {"dataset": "clicks", "partitions": ["p1"], "expires_in": 600}
    held = api.post("/v1/holds", {**body, "amount": {"epsilon": 0.5}})
    assert held.status_code == 201, held.get_json()
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    _sql(database_url, edit)
    body = api.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "clicks", body
    assert held.get_json()["hold_id"] in body["reason"]
    assert body["first_bad_entry"]["kind"] == "hold"
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": database_url}
    result = subprocess.run([BIN, "ledger", "verify"], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "ledger entry charged" in result.stderr
