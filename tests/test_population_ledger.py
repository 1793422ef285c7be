"""A population's own chain, which records its limit changes, is read, exported, verified
(offline too) and reconciled like a dataset's (docs/ledger.md, DESIGN.md "Populations")."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from accountant.models import Consumer, LedgerEntry, Population
from accountant.services.ledger import canonical, chain_hash
from tests.conftest import Api, run_sql

BIN = Path(sys.executable).parent / "accountant"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "ledger.md"

#: The fields API.md's "Ledger" states of every entry.
CONTRACT = {
    "id",
    "seq",
    "kind",
    "charge_id",
    "dataset",
    "consumer",
    "status",
    "mechanism",
    "partitions",
    "cost",
    "multiplicity",
    "charged",
    "loss_after",
    "created_at",
    "prev_hash",
    "hash",
}


@pytest.fixture
def crowd(api: Api) -> Api:
    """A population of two datasets (one with the top-k rule), its limit raised once, grants
    and a denial on its members, and a dataset outside it."""
    body = {"name": "customers", "privacy_unit": "user", "accounting": "pure"}
    created = api.post("/v1/populations", {**body, "budget": {"epsilon": 1}})
    assert created.status_code == 201, created.get_json()
    raised = api.patch("/v1/populations/customers", {"budget": {"epsilon": 2}, "reason": "Q4"})
    assert raised.status_code == 200, raised.get_json()
    member = {"privacy_unit": "user", "accounting": "pure", "population": "customers"}
    api.make_dataset("orders", budget={"epsilon": 10}, **member)
    api.make_dataset("visits", budget={"epsilon": 10}, max_partitions_per_user=2, **member)
    api.make_dataset("weather", budget={"epsilon": 10})
    assert api.charge("orders", partitions=["a", "b"], epsilon=0.25).status_code == 201
    parallel = api.charge(
        "visits",
        partitions=["a", "b", "c"],
        release="parallel",
        epsilon=0.25,
        input={"values": [1.0, 2.0, 3.0]},
    )
    assert parallel.status_code == 201, parallel.get_json()
    assert api.charge("orders", epsilon=0.5).status_code == 201
    assert api.charge("visits", epsilon=5).get_json()["scope"] == "population"  # denied
    assert api.charge("weather", epsilon=0.5).status_code == 201
    return api


def _population_id(database_url: str) -> int:
    [(population_id,)] = run_sql(
        database_url, "SELECT id FROM populations WHERE name = 'customers'"
    )
    return int(population_id)


def _env(database_url: str, signing_key_file: str | None = None) -> dict[str, str]:
    """`accountant`'s environment: the database, and the service's key-hash secret when
    ``signing_key_file`` is given (it lies beside it), else none."""
    folder = Path(signing_key_file).parent if signing_key_file else Path("/nonexistent")
    return {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_KEY_HASH_SECRET_FILE": str(folder / "key-hash-secret"),
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
    }


def _command(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BIN, *args], env=env, capture_output=True, text=True, timeout=120)


def test_the_populations_chain_is_listed_beside_the_datasets(crowd: Api) -> None:
    entries = crowd.ledger()
    chain = [e for e in entries if e["dataset"] == "customers"]
    assert [e["seq"] for e in chain] == [1, 2]
    assert all(e["population"] is True and e["kind"] == "limit_change" for e in chain)
    assert [e["detail"]["scope"] for e in chain] == ["population", "population"]
    assert (
        chain[0]["detail"]["new"] == {"epsilon": "1", "delta": "0"}
        and chain[0]["detail"]["old"] is None
    )
    assert chain[1]["detail"]["new"]["epsilon"] == "2" and chain[1]["reason"] == "Q4"
    assert chain[1]["prev_hash"] == chain[0]["hash"] and chain[1]["charged"] is None
    others = [e for e in entries if e["dataset"] != "customers"]
    assert {e["dataset"] for e in others} == {"orders", "visits", "weather"}
    assert all(e["population"] is False and set(e) >= CONTRACT for e in others)
    # a population's name filters to its chain, as a dataset's does (one namespace)
    assert crowd.ledger(dataset="customers") == chain
    assert all(e["population"] is False for e in crowd.ledger(dataset="orders"))
    assert crowd.ledger(dataset="customers", status="denied") == []
    missing = crowd.get("/v1/ledger?dataset=nobody")
    assert missing.status_code == 404 and "population" in missing.get_json()["detail"]
    verified = crowd.get("/v1/ledger/verify").get_json()
    assert verified["ok"] is True and verified["seals_checked"] is True, verified
    assert verified["heads"]["customers"] == chain[-1]["hash"]
    assert verified["entries"] == len(entries)


def test_the_csv_export_marks_the_populations_entries(crowd: Api) -> None:
    rows = list(csv.DictReader(io.StringIO(crowd.get("/v1/ledger/export?format=csv").text)))
    assert rows and "population" in rows[0]
    marked = {(row["dataset"], row["population"]) for row in rows}
    assert marked == {
        ("customers", "true"),
        ("orders", "false"),
        ("visits", "false"),
        ("weather", "false"),
    }
    only = crowd.get("/v1/ledger/export?format=csv&dataset=customers").text
    assert [row["seq"] for row in csv.DictReader(io.StringIO(only))] == ["1", "2"]


def _verifiers(tmp_path: Path) -> dict[str, list[str | Path]]:
    """`accountant ledger verify --file` and the 40-line verifier of docs/ledger.md, each
    to be given the file's path."""
    [block] = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    script = tmp_path / "verify_export.py"
    script.write_text(block)
    return {
        "cli": [BIN, "ledger", "verify", "--file"],
        "docs": [sys.executable, script],
    }


def _verify_file(tmp_path: Path, lines: list[str]) -> dict[str, subprocess.CompletedProcess[str]]:
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    return {
        name: subprocess.run([*command, path], env=env, capture_output=True, text=True)
        for name, command in _verifiers(tmp_path).items()
    }


def test_an_export_with_a_populations_chain_verifies_offline(crowd: Api, tmp_path: Path) -> None:
    from accountant.signing import verify

    response = crowd.get("/v1/ledger/export?format=jsonl")
    lines = response.text.splitlines()
    entries = [json.loads(line) for line in lines]
    chain = [e for e in entries if e["dataset"] == "customers"]
    assert [e["seq"] for e in chain] == [1, 2] and all(e["population"] for e in chain)
    jwks = crowd.get("/v1/receipts/public-key").get_json()["keys"]
    claims = verify(entries[-1]["export_signature"], jwks)
    assert claims["heads"]["customers"] == {"seq": 2, "hash": chain[-1]["hash"]}
    held = claims["contents"]["customers"]
    assert {k: held[k] for k in ("entries", "seq", "hash")} == {
        "entries": 2,
        "seq": 2,
        "hash": chain[-1]["hash"],
    }
    assert (
        held["terms"]["accounting"]
        == crowd.get("/v1/populations/customers").get_json()["accounting"]
    )
    for name, result in _verify_file(tmp_path, lines).items():
        assert result.returncode == 0, (name, result.stdout, result.stderr)
    cli = _verify_file(tmp_path, lines)["cli"]
    assert "customers seq 1..2 (whole chain)" in cli.stdout, cli.stdout
    # the population's chain alone, by its name
    alone = crowd.get("/v1/ledger/export?format=jsonl&dataset=customers")
    assert set(verify(alone.headers["Accountant-Export-Signature"], jwks)["heads"]) == {"customers"}
    for name, result in _verify_file(tmp_path, alone.text.splitlines()).items():
        assert result.returncode == 0, (name, result.stdout, result.stderr)
    # its last line deleted: the links hold, the signed contents do not
    cut = [line for line in lines if json.loads(line)["hash"] != chain[-1]["hash"]]
    for name, result in _verify_file(tmp_path, cut).items():
        assert result.returncode != 0, (name, result.stdout, result.stderr)
    assert "dataset 'customers'" in _verify_file(tmp_path, cut)["cli"].stderr
    # its detail edited: the line no longer matches its hash
    edited = []
    for line in lines:
        entry = json.loads(line)
        if entry["hash"] == chain[0]["hash"]:
            entry["detail"]["new"] = {"epsilon": "50"}
        edited.append(json.dumps(entry, ensure_ascii=False))
    for name, result in _verify_file(tmp_path, edited).items():
        assert result.returncode != 0 and "line " in result.stderr, (name, result.stderr)


def _forge_limit_change(database_url: str) -> int:
    """Append to the population's chain a well-formed limit change to epsilon 5 as someone
    who can write the database can (the project's own canonical form and chain hash), set
    the limit it states and move the recorded head to it: only the head's seal shows it.
    The forged entry's seq."""
    engine = create_engine(database_url, poolclass=NullPool)
    with Session(engine) as session:
        population = session.execute(
            select(Population).where(Population.name == "customers")
        ).scalar_one()
        last = session.execute(
            select(LedgerEntry)
            .where(LedgerEntry.population_id == population.id)
            .order_by(LedgerEntry.seq.desc())
            .limit(1)
        ).scalar_one()
        admin = session.execute(select(Consumer).where(Consumer.name == "admin")).scalar_one()
        forged = LedgerEntry(
            seq=last.seq + 1,
            kind="limit_change",
            charge_id=None,
            population_id=population.id,
            consumer_id=admin.id,
            status="granted",
            mechanism=None,
            release=None,
            partitions=last.partitions,  # a limit change's, as the service writes them
            params=last.params,
            cost_epsilon=last.cost_epsilon,
            cost_delta=last.cost_delta,
            cost_rho=last.cost_rho,
            multiplicity=last.multiplicity,
            detail={
                "scope": "population",
                "old": {"epsilon": "2", "delta": "0"},
                "new": {"epsilon": "5", "delta": "0"},
            },
            created_at=last.created_at + 1,
            loss_after_epsilon=last.loss_after_epsilon,
            loss_after_delta=last.loss_after_delta,
            loss_after_rho=last.loss_after_rho,
            prev_hash=last.hash,
        )
        forged.hash = chain_hash(last.hash, canonical(forged, "customers", "admin"))
        session.add(forged)
        population.limit_epsilon = 5 * 10**9
        population.ledger_seq, population.ledger_head = forged.seq, forged.hash
        session.commit()
        seq = forged.seq
    engine.dispose()
    return seq


#: Edits of the population's chain or row, each as SQL statements ({p}: its id), with what
#: ``verify`` says and whether it names an entry.
TAMPERING: dict[str, tuple[list[str], str, bool]] = {
    "detail edited": (
        [
            "UPDATE ledger_entries SET detail = "
            """'{"scope": "population", "old": null, "new": {"epsilon": "9"}, "reason": null}' """
            "WHERE population_id = {p} AND seq = 1"
        ],
        "does not match its hash",
        True,
    ),
    "limit edited": (
        ["UPDATE populations SET limit_epsilon = limit_epsilon * 10 WHERE id = {p}"],
        "is not the one its last limit change set",
        False,
    ),
    "last entry deleted": (
        ["DELETE FROM ledger_entries WHERE population_id = {p} AND seq = 2"],
        "the chain ends at seq 1 but the population records 2 entries",
        False,
    ),
    "last entry deleted, head rewound": (
        [
            "DELETE FROM ledger_entries WHERE population_id = {p} AND seq = 2",
            "UPDATE populations SET ledger_seq = 1, ledger_head = (SELECT hash FROM "
            "ledger_entries WHERE population_id = {p} AND seq = 1) WHERE id = {p}",
        ],
        "is not the one its last limit change set",  # the limit is 2, the chain says 1
        False,
    ),
    "seq renumbered": (
        ["UPDATE ledger_entries SET seq = 3 WHERE population_id = {p} AND seq = 2"],
        "expected seq 2, found 3",
        True,
    ),
    "head seal removed": (
        ["UPDATE populations SET head_seal = NULL WHERE id = {p}"],
        "head has no seal",
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampering_with_a_populations_chain_is_named(
    crowd: Api, database_url: str, signing_key_file: str, case: str
) -> None:
    statements, reason, names_entry = TAMPERING[case]
    population_id = _population_id(database_url)
    for statement in statements:
        run_sql(database_url, statement.replace("{p}", str(population_id)))
    body = crowd.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "customers", body
    assert reason in body["reason"], body["reason"]
    if names_entry:
        bad = body["first_bad_entry"]
        assert bad["dataset"] == "customers" and bad["population"] is True
    result = _command("ledger", "verify", env=_env(database_url, signing_key_file))
    assert result.returncode == 1 and "'customers'" in result.stderr, result.stderr
    assert reason in result.stderr


def test_a_limit_change_forged_with_its_limit_is_caught_by_the_heads_seal(
    crowd: Api, database_url: str, signing_key_file: str
) -> None:
    """A well-formed limit change appended in the database, with the limit it states set
    and the head moved to it: the chain and the limit agree; the head's seal does not."""
    seq = _forge_limit_change(database_url)
    body = crowd.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "customers", body
    assert "appended in the database" in body["reason"]
    assert body["first_bad_entry"]["seq"] == seq and body["first_bad_entry"]["population"]
    alone = _command("ledger", "verify", env=_env(database_url))  # no secret: blind to it
    assert alone.returncode == 0 and "customers" in alone.stdout, alone.stderr
    sealed = _command("ledger", "verify", env=_env(database_url, signing_key_file))
    assert sealed.returncode == 1 and "'customers'" in sealed.stderr, sealed.stderr


def test_a_truncation_of_a_populations_chain_is_caught_against_an_earlier_export(
    crowd: Api, database_url: str, tmp_path: Path
) -> None:
    """The limit lowered back to 1, then that change and the raise before it deleted with
    the head rewound: chain and limit agree. The head's seal shows it, and so does an
    earlier export where no secret is at hand."""
    lowered = crowd.patch("/v1/populations/customers", {"budget": {"epsilon": 1}})
    assert lowered.status_code == 200, lowered.get_json()
    copy = tmp_path / "earlier.jsonl"
    copy.write_text(crowd.get("/v1/ledger/export?format=jsonl").text)
    env = _env(database_url)
    assert _command("ledger", "verify", "--against", copy, env=env).returncode == 0
    population_id = _population_id(database_url)
    for statement in (
        f"DELETE FROM ledger_entries WHERE population_id = {population_id} AND seq > 1",
        "UPDATE populations SET ledger_seq = 1, ledger_head = (SELECT hash FROM ledger_entries "
        f"WHERE population_id = {population_id} AND seq = 1) WHERE id = {population_id}",
    ):
        run_sql(database_url, statement)
    assert _command("ledger", "verify", env=env).returncode == 0  # the chain alone is blind
    body = crowd.get("/v1/ledger/verify").get_json()
    assert body["ok"] is False and body["dataset"] == "customers", body
    assert "is not the one the service sealed" in body["reason"]
    result = _command("ledger", "verify", "--against", copy, env=env)
    assert result.returncode == 1, result.stderr
    assert "population 'customers' has no entry 3" in result.stderr, result.stderr


def test_a_populations_loss_is_reconciled_with_its_datasets_losses(
    crowd: Api, database_url: str
) -> None:
    from accountant.exact import Amount
    from accountant.services import totals

    budget = crowd.get("/v1/populations/customers/budget").get_json()
    assert budget["loss"]["epsilon"] == 0.25 + 0.5 + 0.5  # orders 0.75, visits 2 x 0.25
    env = _env(database_url)
    result = _command("ledger", "rebuild-totals", "--check", env=env)
    assert result.returncode == 0, result.stderr
    # one unit (10^-9 epsilon) less: the comparison is exact
    run_sql(database_url, "UPDATE populations SET loss_epsilon = loss_epsilon - 1")
    result = _command("ledger", "rebuild-totals", "--check", env=env)
    assert result.returncode == 1, result.stdout
    assert "DIFFERENT customers population loss" in result.stderr, result.stderr
    engine = create_engine(database_url, poolclass=NullPool)
    with Session(engine) as session:
        _, differences = totals.check(session)
    engine.dispose()
    [difference] = differences
    assert difference.dataset == "customers" and difference.scope == "population"
    assert difference.rebuilt == Amount(epsilon=1_250_000_000)
    assert difference.stored == Amount(epsilon=1_249_999_999)
