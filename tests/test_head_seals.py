"""Each chain's head is sealed by the service, so an entry written in the database shows,
and each entry's loss_after is recomputed from the chain (docs/ledger.md, "Chain heads")."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from accountant import seals
from accountant.accounting.loss import LossRule, RunningLoss, ScopeBooks, loss_now
from accountant.app import prepared_app
from accountant.exact import Amount, ComponentName
from accountant.key_hashing import KeyHasher
from accountant.models import Consumer, Dataset, LedgerEntry
from accountant.services.ledger import GENESIS, canonical, chain_hash
from tests.conftest import ADMIN_KEY, Api, run_sql

BIN = Path(sys.executable).parent / "accountant"


def _verify_command(database_url: str, signing_key_file: str) -> subprocess.CompletedProcess[str]:
    """`accountant ledger verify` on the service's host: its database and key-hash secret."""
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_KEY_HASH_SECRET_FILE": str(Path(signing_key_file).parent / "key-hash-secret"),
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
    }
    return subprocess.run(
        [BIN, "ledger", "verify"], env=env, capture_output=True, text=True, timeout=120
    )


def _seals_init(database_url: str, signing_key_file: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
    }
    return subprocess.run(
        [BIN, "seals", "init"], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def books(api: Api) -> Api:
    """Datasets of every loss rule, with grants, denials, limit changes and a quota."""
    api.make_dataset(budget={"epsilon": 10})
    api.make_dataset(
        "people",
        privacy_unit="user",
        max_partitions_per_user=2,
        accounting="approx",
        budget={"epsilon": 6, "delta": 1e-6},
    )
    api.make_dataset("open", privacy_unit="user", budget={"epsilon": 3})
    api.make_dataset("z", accounting="zcdp", budget={"epsilon": 4, "delta": 1e-6})
    api.make_consumer("svc", datasets=["clicks"], quotas={"clicks": {"epsilon": 2}})
    choice = random.Random(28)
    for _ in range(6):
        keys = choice.sample(["a", "b", "c", "d"], choice.randint(1, 3))
        epsilon = choice.choice([0.25, 0.5, 1.5])
        api.charge(partitions=keys, epsilon=epsilon)
        api.charge(
            "people",
            partitions=keys,
            release="parallel",
            epsilon=epsilon,
            input={"values": [1.0] * len(keys)},
        )
        api.charge("open", partitions=keys[:1], epsilon=epsilon)
        api.charge(
            "z", partitions=keys, mechanism="gaussian", params={"sigma": 3, "sensitivity": 1}
        )
    api.charge(partitions="*", epsilon=0.5)
    api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 12}, "reason": "more"})
    api.patch("/v1/consumers/svc", {"quotas": {"clicks": {"epsilon": 3}}})
    statuses = {e["status"] for e in api.ledger() if e["kind"] == "charge"}
    assert statuses == {"granted", "denied"}  # both kinds are chained, and checked
    return api


def _hasher(app: Flask) -> KeyHasher:
    hasher: KeyHasher = app.extensions["accountant"].key_hasher
    return hasher


def _heads_hold(database_url: str, hasher: KeyHasher) -> None:
    """Every dataset's head carries the seal of its (seq, hash)."""
    rows = run_sql(database_url, "SELECT name, ledger_seq, ledger_head, head_seal FROM datasets")
    assert rows
    for name, seq, head, seal in rows:
        assert seal == seals.of_head(hasher, name, seq, head or GENESIS), name


def test_every_head_the_service_writes_is_sealed_and_verifies_over_restarts(
    app: Flask, books: Api, database_url: str, signing_key_file: str
) -> None:
    """Charges alone and in shared transactions, limit changes, quota changes, a restart:
    every head is sealed as written, and the database verifies."""
    _heads_hold(database_url, _hasher(app))

    def charge(index: int) -> int:
        with app.test_client() as client:
            return int(Api(client).charge(partitions=[f"q{index % 3}"], epsilon=0.01).status_code)

    with ThreadPoolExecutor(max_workers=6) as pool:  # grouped in transactions (group commit)
        assert set(pool.map(charge, range(18))) == {201}
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is True and body["seals_checked"] is True, body
    config = {"database_url": database_url, "signing_key_file": signing_key_file}
    restarted = Api(prepared_app(config).test_client())
    assert restarted.charge(epsilon=0.01).status_code == 201
    restarted.make_dataset("later", budget={"epsilon": 1})  # its empty chain sealed too
    _heads_hold(database_url, _hasher(app))
    assert restarted.get("/v1/ledger/verify").get_json()["ok"] is True
    result = _verify_command(database_url, signing_key_file)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def _forge_denial(database_url: str, *, move_head: bool) -> int:
    """Append to 'clicks' a well-formed denial as someone who can write the database can:
    the project's own canonical form and chain hash, the loss_after the chain gives (a
    denial changes no total), the terms digest; the seq of the entry."""
    engine = create_engine(database_url, poolclass=NullPool)
    with Session(engine) as session:
        dataset = session.execute(select(Dataset).where(Dataset.name == "clicks")).scalar_one()
        last = session.execute(
            select(LedgerEntry)
            .where(LedgerEntry.dataset_id == dataset.id)
            .order_by(LedgerEntry.seq.desc())
            .limit(1)
        ).scalar_one()
        admin = session.execute(select(Consumer).where(Consumer.name == "admin")).scalar_one()
        forged = LedgerEntry(
            seq=last.seq + 1,
            kind="charge",
            charge_id=str(uuid.uuid4()),
            dataset_id=dataset.id,
            consumer_id=admin.id,
            status="denied",
            mechanism="laplace",
            release="joint",
            partitions=["a"],
            params={"epsilon": "50", "sensitivity": 1},
            cost_epsilon=50 * 10**9,
            cost_delta=0,
            cost_rho=0,
            multiplicity=1,
            detail={"scope": "dataset", "terms_sha256": dataset.terms_sha256},
            created_at=last.created_at + 1,
            loss_after_epsilon=last.loss_after_epsilon,
            loss_after_delta=last.loss_after_delta,
            loss_after_rho=last.loss_after_rho,
            prev_hash=last.hash,
        )
        forged.hash = chain_hash(last.hash, canonical(forged, "clicks", "admin"))
        session.add(forged)
        if move_head:
            dataset.ledger_seq, dataset.ledger_head = forged.seq, forged.hash
        session.commit()
        seq = forged.seq
    engine.dispose()
    return seq


@pytest.mark.parametrize("move_head", [False, True], ids=["head left", "head moved"])
def test_an_entry_forged_in_the_database_is_named(
    app: Flask, books: Api, database_url: str, signing_key_file: str, move_head: bool
) -> None:
    """A forged denial changes no total and carries the right loss_after; appended with or
    without the dataset's head moved to it, verify names the dataset and the entry, and a
    charge the service appends after it seals nothing over it."""
    seq = _forge_denial(database_url, move_head=move_head)
    if move_head:  # the service goes on appending on top of it
        assert books.charge(epsilon=0.01).status_code == 201
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "clicks", body
    assert body["first_bad_entry"]["seq"] == seq and body["first_bad_entry"]["status"] == "denied"
    assert "appended in the database" in body["reason"]
    result = _verify_command(database_url, signing_key_file)
    assert result.returncode == 1
    assert f"DAMAGED: dataset 'clicks' at entry id {body['first_bad_entry']['id']}" in result.stderr
    with app.test_client() as browser:
        page = browser.get("/dashboard/sign-in").get_data(as_text=True)
        csrf = page.split('name="csrf" value="')[1].split('"')[0]
        browser.post("/dashboard/sign-in", data={"api_key": ADMIN_KEY, "csrf": csrf})
        ledger_page = browser.get("/dashboard/ledger?verify=1").get_data(as_text=True)
    assert "damaged" in ledger_page and "dataset &#39;clicks&#39;" in ledger_page


def test_a_chain_cut_back_with_its_head_is_caught(
    app: Flask, books: Api, database_url: str
) -> None:
    """The last entry deleted and the recorded head rewound to the one before: the chain
    ends where the dataset says, but that head is not the one the service sealed."""
    people = run_sql(database_url, "SELECT id, ledger_seq FROM datasets WHERE name = 'people'")
    dataset_id, seq = people[0]
    for statement in (
        f"DELETE FROM ledger_entries WHERE dataset_id = {dataset_id} AND seq = {seq}",
        f"UPDATE datasets SET ledger_seq = {seq - 1}, ledger_head = (SELECT hash FROM "
        f"ledger_entries WHERE dataset_id = {dataset_id} AND seq = {seq - 1}) "
        f"WHERE id = {dataset_id}",
    ):
        run_sql(database_url, statement)
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "people", body
    assert f"head (seq {seq - 1}) is not the one the service sealed" in body["reason"]


def test_a_removed_head_seal_is_damaged(books: Api, database_url: str) -> None:
    run_sql(database_url, "UPDATE datasets SET head_seal = NULL WHERE name = 'open'")
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "open"
    assert "head has no seal" in body["reason"]


@pytest.mark.parametrize("dataset", ["clicks", "people", "open", "z"])
def test_an_edited_loss_after_is_named(
    books: Api, database_url: str, signing_key_file: str, dataset: str
) -> None:
    """loss_after is not hashed; verify recomputes it from the chain by the dataset's loss
    rule, with or without the secret, and names the first entry that differs."""
    assert books.get("/v1/ledger/verify").get_json()["ok"] is True
    entries = books.ledger(dataset=dataset)
    target = entries[len(entries) // 2]
    component = {"z": "rho", "people": "delta"}.get(dataset, "epsilon")
    run_sql(
        database_url,
        f"UPDATE ledger_entries SET loss_after_{component} = loss_after_{component} + 1 "
        f"WHERE id = {target['id']}",
    )
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == dataset, body
    assert body["first_bad_entry"]["id"] == target["id"] and "loss_after" in body["reason"]
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": database_url}  # no secret: still caught
    result = subprocess.run([BIN, "ledger", "verify"], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and f"entry id {target['id']}" in result.stderr


def test_a_removed_loss_after_is_named(books: Api, database_url: str) -> None:
    last = books.ledger(dataset="open")[-1]
    run_sql(
        database_url,
        "UPDATE ledger_entries SET loss_after_epsilon = NULL, loss_after_delta = NULL, "
        f"loss_after_rho = NULL WHERE id = {last['id']}",
    )
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["first_bad_entry"]["id"] == last["id"]
    assert "loss_after is missing" in body["reason"]


def test_heads_of_a_database_sealed_before_head_seals_are_sealed_only_by_seals_init(
    books: Api, database_url: str, signing_key_file: str
) -> None:
    """As migration 0016 leaves a database sealed before it: verify reports the unsealed
    heads and names the command; the service goes on charging without sealing them, a
    start seals nothing, and `accountant seals init` seals them once, ledgered."""
    run_sql(database_url, "UPDATE datasets SET head_seal = NULL")
    run_sql(database_url, "UPDATE key_hash_secrets SET heads_sealed_at = NULL")
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and "accountant seals init" in body["reason"]
    assert books.charge(epsilon=0.01).status_code == 201
    books.make_dataset("fresh", budget={"epsilon": 1})
    prepared_app({"database_url": database_url, "signing_key_file": signing_key_file})
    assert {row[0] for row in run_sql(database_url, "SELECT head_seal FROM datasets")} == {None}
    sealed = _seals_init(database_url, signing_key_file)
    assert sealed.returncode == 0, sealed.stderr
    assert "sealed the chain heads of 5 datasets" in sealed.stdout
    last = books.ledger(dataset="clicks")[-1]
    assert last["detail"]["scope"] == "seals" and last["detail"]["sealed"] == ["chain head"]
    assert f"head seq {last['seq']} {last['hash']}" in sealed.stdout
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is True and body["seals_checked"] is True, body
    assert _verify_command(database_url, signing_key_file).returncode == 0
    again = _seals_init(database_url, signing_key_file)
    assert again.returncode == 1 and "refused" in again.stderr
    # a forgery afterwards shows, and the record cleared to make it look older does too
    seq = _forge_denial(database_url, move_head=True)
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["first_bad_entry"]["seq"] == seq
    run_sql(database_url, "UPDATE key_hash_secrets SET heads_sealed_at = NULL")
    body = books.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and "heads_sealed_at" in body["reason"]
    assert _seals_init(database_url, signing_key_file).returncode == 1


def test_head_seals_are_the_canonical_form() -> None:
    hasher = KeyHasher(b"s" * 32, "id")
    for name in ("clicks", 'q"uoted', "naïve ✓"):
        expected = hasher.seal(seals._canonical({"dataset": name, "head": "ab" * 32, "seq": 7}))
        assert seals.of_head(hasher, name, 7, "ab" * 32) == expected


@pytest.mark.parametrize(
    "rule",
    [
        LossRule("record", None),
        LossRule("partition", None),
        LossRule("user", 1),
        LossRule("user", 3),
        LossRule("user", None),
    ],
    ids=str,
)
def test_the_running_loss_is_the_loss_of_the_rebuilt_books(rule: LossRule) -> None:
    """``RunningLoss`` keeps, charge by charge, what ``loss_now`` gives of the books rebuilt
    from every charge so far."""
    names: tuple[ComponentName, ...] = ("epsilon", "delta")
    choice = random.Random(str(rule))
    running, books = RunningLoss(rule, names), ScopeBooks()
    for _ in range(400):
        cost = Amount(choice.randint(0, 50), choice.randint(0, 5))
        partitions = choice.sample([f"p{i}" for i in range(12)], choice.randint(1, 4))
        m = choice.randint(1, 3)
        release = choice.choice(["joint", "parallel"])
        running.add(cost, m, partitions, release)
        books.add(cost, m, partitions, release)
        k = rule.max_partitions_per_user if rule.uses_top_k else None
        assert running.loss == loss_now(rule, books.state(k), names)
