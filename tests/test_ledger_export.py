"""An export verifies offline: `accountant ledger verify --file` and the 40-line verifier of
docs/ledger.md both recompute every hash and link and hold the lines to the signature on the
last line, and both name a line edited, deleted (in the middle or at an end), inserted or
moved."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from tests.conftest import ADMIN_KEY, Api

BIN = Path(sys.executable).parent / "accountant"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "ledger.md"


@pytest.fixture
def export(api: Api, tmp_path: Path) -> list[str]:
    """A JSON Lines export of two datasets: grants, a denial, a parallel release over three
    partitions of a user dataset, non-ASCII keys, a zcdp Gaussian and a limit change."""
    api.make_dataset(budget={"epsilon": 10})
    api.make_dataset(
        "people",
        privacy_unit="user",
        max_partitions_per_user=2,
        max_records_per_user=3,
        accounting="zcdp",
        budget={"epsilon": 5, "delta": 1e-6},
    )
    for index in range(4):
        assert api.charge(partitions=[f"p{index}", "städte-ü"], epsilon=0.25).status_code == 201
    assert api.charge(epsilon=50).status_code == 409
    assert (
        api.charge(
            dataset="people",
            partitions=["a", "b", "c"],
            release="parallel",
            mechanism="gaussian",
            params={"sigma": 40, "sensitivity": 1},
            input={"values": [1.0, 2.0, 3.0]},
        ).status_code
        == 201
    )
    api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 9}, "reason": "quarterly"})
    text = api.get("/v1/ledger/export?format=jsonl").text
    return [line for line in text.splitlines() if line]


def _verifiers(
    tmp_path: Path, *options: str
) -> dict[str, Callable[[Path], subprocess.CompletedProcess[str]]]:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert len(blocks) == 1 and len(blocks[0].splitlines()) <= 40
    script = tmp_path / "verify_export.py"
    script.write_text(blocks[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    return {
        "cli": lambda path: subprocess.run(
            [BIN, "ledger", "verify", "--file", str(path), *options],
            env=env,
            capture_output=True,
            text=True,
        ),
        "docs": lambda path: subprocess.run(
            [sys.executable, str(script), str(path)], capture_output=True, text=True
        ),
    }


def _edit_cost(lines: list[str]) -> list[str]:
    entry = json.loads(lines[1])
    entry["cost_units"][0] -= 1
    return [lines[0], json.dumps(entry), *lines[2:]]


def _edit_partition(lines: list[str]) -> list[str]:
    entry = json.loads(lines[0])
    assert entry["partitions"] == ["p0", "städte-ü"]
    entry["partitions"] = ["p0", "stadte-u"]
    return [json.dumps(entry), *lines[1:]]


TAMPERING: dict[str, Callable[[list[str]], list[str]]] = {
    "edited cost": _edit_cost,
    "deleted line": lambda lines: lines[:2] + lines[3:],
    "moved line": lambda lines: [lines[0], lines[2], lines[1], *lines[3:]],
    "inserted line": lambda lines: [*lines[:3], lines[1], *lines[3:]],
    "edited partition": _edit_partition,
}


def test_an_untouched_export_verifies_with_both_verifiers(
    export: list[str], api: Api, tmp_path: Path
) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(export) + "\n", encoding="utf-8")
    for name, verify in _verifiers(tmp_path).items():
        result = verify(path)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
    cli = _verifiers(tmp_path)["cli"](path)
    assert "clicks seq 1..6 (whole chain)" in cli.stdout and "people seq 1..1" in cli.stdout
    assert "--jwks" in cli.stderr  # who signed it was not checked, and the command says so
    keys = tmp_path / "keys.json"
    keys.write_text(api.get("/v1/receipts/public-key").text)
    signed = _verifiers(tmp_path, "--jwks", str(keys))["cli"](path)
    assert signed.returncode == 0 and signed.stderr == "", signed.stderr


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_a_tampered_export_fails_naming_its_line(
    export: list[str], tmp_path: Path, case: str
) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(TAMPERING[case](export)) + "\n", encoding="utf-8")
    for name, verify in _verifiers(tmp_path).items():
        result = verify(path)
        assert result.returncode != 0 and "line " in result.stderr, (name, result.stderr)


def _signed_by(lines: list[str], claims: dict[str, Any], signature: str) -> list[str]:
    """``lines`` whose last one carries ``claims`` under another's ``signature``: a forgery
    by someone who holds no key."""
    from accountant.signing import b64url, canonical_json

    header, _, mark = signature.split(".")
    last = json.loads(lines[-1])
    last["export_signature"] = ".".join([header, b64url(canonical_json(claims)), mark])
    return [*lines[:-1], json.dumps(last)]


def _moved_signature(lines: list[str]) -> list[str]:
    """The last line deleted and its signature moved to the line before."""
    signature = json.loads(lines[-1])["export_signature"]
    before = json.loads(lines[-2])
    before["export_signature"] = signature
    return [*lines[:-2], json.dumps(before)]


def _forged(lines: list[str]) -> list[str]:
    """The last line deleted and the claims rewritten to match, keeping the old signature."""
    from accountant.ledger_file import claims_of

    signature = json.loads(lines[-1])["export_signature"]
    claims = claims_of(signature)
    kept = [json.loads(line) for line in lines[:-1]]
    clicks = [entry for entry in kept if entry["dataset"] == "clicks"]
    claims["contents"]["clicks"] = {
        "entries": len(clicks),
        "seq": clicks[-1]["seq"],
        "hash": clicks[-1]["hash"],
    }
    return _signed_by(lines[:-1], claims, signature)


#: Edits the links between lines cannot show; the signature on the last line does.
TRUNCATING: dict[str, tuple[Callable[[list[str]], list[str]], str]] = {
    "last line deleted": (lambda lines: lines[:-1], "no signature"),
    "last line deleted, its signature kept": (_moved_signature, "truncated"),
    "a dataset's only line deleted": (
        lambda lines: [line for line in lines if '"dataset":"people"' not in line],
        "dataset 'people': the export has no line of it",
    ),
    "first line deleted": (lambda lines: lines[1:], "lines deleted at its start"),
    "line added after the signature": (
        lambda lines: [*lines, lines[0]],
        "follows the line that carries the signature",
    ),
}


@pytest.mark.parametrize("case", sorted(TRUNCATING))
def test_a_truncated_export_fails_naming_the_problem(
    export: list[str], tmp_path: Path, case: str
) -> None:
    edit, named = TRUNCATING[case]
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(edit(export)) + "\n", encoding="utf-8")
    for name, verify in _verifiers(tmp_path).items():
        result = verify(path)
        assert result.returncode != 0, (name, result.stdout, result.stderr)
    cli = _verifiers(tmp_path)["cli"](path)
    assert named in cli.stderr and "(whole chain)" not in cli.stdout, cli.stderr


def test_claims_rewritten_without_the_key_fail_against_the_public_keys(
    export: list[str], api: Api, tmp_path: Path
) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(_forged(export)) + "\n", encoding="utf-8")
    unchecked = _verifiers(tmp_path)["cli"](path)
    assert unchecked.returncode == 0 and "--jwks" in unchecked.stderr  # it said so
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(api.get("/v1/receipts/public-key").get_json()["keys"][0]))
    checked = _verifiers(tmp_path, "--jwks", str(keys))["cli"](path)
    assert checked.returncode == 1 and "signature does not match" in checked.stderr
    other = tmp_path / "other.json"  # another service's key set proves nothing
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from accountant.signing import public_jwk

    other.write_text(json.dumps({"keys": [public_jwk(Ed25519PrivateKey.generate().public_key())]}))
    foreign = _verifiers(tmp_path, "--jwks", str(other))["cli"](_write(tmp_path, export))
    assert foreign.returncode == 1 and "unknown key id" in foreign.stderr


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "untouched.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_time_filtered_export_verifies_as_a_segment(api: Api, tmp_path: Path) -> None:
    api.make_dataset(budget={"epsilon": 10})
    api.charge(epsilon=0.1)
    time.sleep(0.05)
    moment = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    time.sleep(0.05)
    for _ in range(2):
        api.charge(epsilon=0.1)
    since = api.get(f"/v1/ledger/export?format=jsonl&dataset=clicks&since={moment}").text
    path = _write(tmp_path, since.splitlines())
    result = _verifiers(tmp_path)["cli"](path)
    assert result.returncode == 0 and "clicks seq 2..3 (a segment)" in result.stdout
    until = api.get(f"/v1/ledger/export?format=jsonl&until={moment}").text.splitlines()
    assert len(until) == 1
    result = _verifiers(tmp_path)["cli"](_write(tmp_path, until))
    assert result.returncode == 0 and "clicks seq 1..1 (a segment)" in result.stdout
    lines = since.splitlines()
    cut = _moved_signature(lines)  # the time-filtered export truncated at its end
    for name, verify in _verifiers(tmp_path).items():
        assert verify(_write(tmp_path, cut)).returncode != 0, name


def test_charged_is_cost_times_multiplicity_and_sums_to_the_running_total(
    export: list[str], api: Api
) -> None:
    entries = [json.loads(line) for line in export]
    people = [e for e in entries if e["dataset"] == "people" and e["kind"] == "charge"]
    assert people[0]["multiplicity"] == 2  # parallel over 3 partitions, at most 2 per user
    assert people[0]["charged"]["rho"] == 2 * people[0]["cost"]["rho"]
    clicks = [e for e in entries if e["dataset"] == "clicks" and e["kind"] == "charge"]
    denied = [e for e in clicks if e["status"] == "denied"]
    assert denied and all(e["charged"]["epsilon"] == 0 for e in denied)
    # the record-unit dataset's loss is the max over partitions of the sums; here every
    # grant touches "städte-ü", so its running total is the sum of charged
    total = sum(e["charged"]["epsilon"] for e in clicks)
    assert total == 4 * 0.25 == api.budget()["loss"]["epsilon"]


def test_loss_after_is_the_datasets_loss_after_each_entry(export: list[str], api: Api) -> None:
    entries = [json.loads(line) for line in export]
    for name in ("clicks", "people"):
        own = [e for e in entries if e["dataset"] == name]
        assert own[-1]["loss_after"] == api.budget(name)["loss"]
    clicks = [e for e in entries if e["dataset"] == "clicks"]
    assert [e["loss_after"]["epsilon"] for e in clicks] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert clicks[-1]["kind"] == "limit_change" and clicks[-2]["status"] == "denied"


def test_the_export_is_signed_with_the_chain_heads_at_its_last_entry(
    export: list[str], api: Api
) -> None:
    from accountant.signing import ReceiptError, b64url, canonical_json, verify

    response = api.get("/v1/ledger/export?format=jsonl")
    token = response.headers["Accountant-Export-Signature"]
    jwks = api.get("/v1/receipts/public-key").get_json()["keys"]
    claims = verify(token, jwks)  # signed by the service's receipt key
    entries = [json.loads(line) for line in response.text.splitlines()]
    assert claims["kind"] == "ledger-export"
    assert claims["through_id"] == entries[-1]["id"]
    last = {entry["dataset"]: entry for entry in entries}
    assert claims["heads"] == {
        name: {"seq": entry["seq"], "hash": entry["hash"]} for name, entry in last.items()
    }
    # a dataset's export is signed with that dataset's head only
    one = api.get("/v1/ledger/export?format=jsonl&dataset=clicks")
    assert set(verify(one.headers["Accountant-Export-Signature"], jwks)["heads"]) == {"clicks"}
    # the file's last line carries the same claims, with what the file holds of each dataset
    inline = verify(entries[-1]["export_signature"], jwks)
    assert {k: v for k, v in inline.items() if k != "contents"} == claims
    assert inline["contents"] == {
        name: {
            "entries": sum(entry["dataset"] == name for entry in entries),
            "seq": entry["seq"],
            "hash": entry["hash"],
            # what the readable figures are stated in (ledger verify --file recomputes them)
            "terms": {
                "accounting": "zcdp" if name == "people" else "pure",
                "rdp_order": None,
                "composition_delta": None,
                "delta": 10**12 if name == "people" else 0,
            },
        }
        for name, entry in last.items()
    }
    assert all("export_signature" not in entry for entry in entries[:-1])
    # a changed head no longer verifies: the heads are what was signed
    header, _, signature = token.split(".")
    claims["heads"]["clicks"]["hash"] = "0" * 64
    with pytest.raises(ReceiptError, match="signature"):
        verify(".".join([header, b64url(canonical_json(claims)), signature]), jwks)


def test_an_entry_committed_after_the_heads_were_read_is_left_out(
    app: Flask, api: Api, database_url: str, tmp_path: Path
) -> None:
    """Ids are drawn before commit: an entry of one dataset whose id is below another
    dataset's newer entry can commit after the export read its heads (here between its
    first page of 1000 entries and its second). The export stops each dataset at its signed
    head, so the heads of the header describe the file."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite's writers take turns: ids are drawn in commit order")
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from accountant.driver import Driver
    from accountant.models import Dataset
    from accountant.services import ledger
    from accountant.signing import verify

    api.make_dataset("early", budget={"epsilon": 1})
    api.make_dataset("late", budget={"epsilon": 1})
    engine = create_engine(database_url)

    def append(session: Session, name: str) -> None:
        dataset = session.execute(
            select(Dataset).where(Dataset.name == name).with_for_update()
        ).scalar_one()
        ledger.append(
            Driver.of(session),
            dataset,
            None,
            kind="limit_change",
            status="granted",
            created_at=dataset.ledger_seq + 1,
            detail={"scope": "test", "terms_sha256": dataset.terms_sha256},
            hasher=app.extensions["accountant"].key_hasher,
        )

    with Session(engine) as session:  # the export's first page
        for _ in range(1000):
            append(session, "late")
        session.commit()
    with Session(engine) as pending:
        append(pending, "early")  # its id is drawn; it commits later
        assert api.charge(dataset="late", epsilon=0.1).status_code == 201  # a higher id
        with app.test_client() as client:
            response = client.get(
                "/v1/ledger/export?format=jsonl",
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                buffered=False,
            )  # the heads read, and the first page
            pending.commit()
            lines = response.get_data(as_text=True).splitlines()  # the second page
    engine.dispose()
    jwks = api.get("/v1/receipts/public-key").get_json()["keys"]
    heads = verify(response.headers["Accountant-Export-Signature"], jwks)["heads"]
    assert set(heads) == {"late"} and heads["late"]["seq"] == 1001
    assert {json.loads(line)["dataset"] for line in lines} == {"late"} and len(lines) == 1001
    result = _verifiers(tmp_path)["cli"](_write(tmp_path, lines))
    assert result.returncode == 0 and "late seq 1..1001 (whole chain)" in result.stdout


def test_the_csv_export_given_to_verify_file_is_named_as_the_wrong_export(
    api: Api, tmp_path: Path
) -> None:
    api.make_dataset()
    assert api.charge().status_code == 201
    path = tmp_path / "ledger.csv"
    path.write_text(api.get("/v1/ledger/export?format=csv").text, encoding="utf-8")
    result = _verifiers(tmp_path)["cli"](path)
    assert result.returncode == 1
    assert "line 1 is not a ledger entry" in result.stderr
    assert "takes the JSON Lines export" in result.stderr, result.stderr


def test_a_header_that_would_name_too_many_heads_carries_their_digest(api: Api) -> None:
    """With more chains than a header holds (proxies refuse a response whose headers pass a
    buffer: nginx's is 4 or 8 KiB), the header signs the heads' digest; the file's last line
    names every head, and the heads rebuilt from a CSV export match the digest."""
    import csv
    import hashlib
    import io

    from accountant.ledger_export import HEADER_LIMIT
    from accountant.signing import verify

    for n in range(80):  # a chain each, of one charge
        api.make_dataset(f"dataset-{n:03d}")
        assert api.charge(f"dataset-{n:03d}", epsilon=0.1).status_code == 201
    jwks = api.get("/v1/receipts/public-key").get_json()["keys"]
    exported = api.get("/v1/ledger/export?format=csv")
    token = exported.headers["Accountant-Export-Signature"]
    assert len(token) <= HEADER_LIMIT
    claims = verify(token, jwks)
    assert "heads" not in claims and claims["kind"] == "ledger-export"
    heads: dict[str, Any] = {}
    for row in csv.DictReader(io.StringIO(exported.text)):
        heads[row["dataset"]] = {"seq": int(row["seq"]), "hash": row["hash"]}
    assert len(heads) == 80
    digest = hashlib.sha256(json.dumps(heads, sort_keys=True, separators=(",", ":")).encode())
    assert claims["heads_sha256"] == digest.hexdigest()
    lines = api.get("/v1/ledger/export?format=jsonl").text.splitlines()
    inline = verify(json.loads(lines[-1])["export_signature"], jwks)
    assert inline["heads"] == heads
    one = api.get("/v1/ledger/export?format=csv&dataset=dataset-007")
    assert list(verify(one.headers["Accountant-Export-Signature"], jwks)["heads"]) == [
        "dataset-007"
    ]


def _entry_edit(index: Any, change: Callable[[dict[str, Any]], None]) -> Callable[..., list[str]]:
    """An edit of the readable fields of the line ``index`` picks (a position, or a test of
    the entry), which the hash does not cover."""

    def edit(lines: list[str]) -> list[str]:
        entries = [json.loads(line) for line in lines]
        at = index if isinstance(index, int) else next(i for i, e in enumerate(entries) if index(e))
        change(entries[at])
        return [json.dumps(entry) for entry in entries]

    return edit


def _is_people(entry: dict[str, Any]) -> bool:
    return bool(entry["dataset"] == "people")


def _is_limit_change(entry: dict[str, Any]) -> bool:
    return bool(entry["kind"] == "limit_change")


def _is_denial(entry: dict[str, Any]) -> bool:
    return bool(entry["status"] == "denied")


#: A zcdp entry's rho (in cost_units[2]) as an approx chain would state it: no epsilon.
_APPROX_ZERO = {
    "epsilon": 0.0,
    "delta": 0.0,
    "measure": "epsilon",
    "additive": ["epsilon", "delta"],
}

#: Readable fields edited: the hashes hold, and what the hash covers says otherwise.
READABLE_EDITS: dict[str, Callable[[list[str]], list[str]]] = {
    "cost": _entry_edit(0, lambda e: e["cost"].update(epsilon=0.1)),
    "charged": _entry_edit(0, lambda e: e["charged"].update(epsilon=0)),
    "a denial's charged": _entry_edit(_is_denial, lambda e: e["charged"].update(epsilon=50)),
    "created_at": _entry_edit(0, lambda e: e.update(created_at="2020-01-01T00:00:00Z")),
    "reason": _entry_edit(_is_limit_change, lambda e: e.update(reason="approved by CISO")),
    "zcdp rho": _entry_edit(_is_people, lambda e: e["cost"].update(rho=0.0001)),
    "zcdp epsilon": _entry_edit(_is_people, lambda e: e["cost"].update(epsilon=0.001)),
    "batch_id": _entry_edit(0, lambda e: e.update(batch_id="b")),
    "mode labels": _entry_edit(0, lambda e: e["cost"].update(measure="tau")),
    # restated whole in another mode, labels and figures agreeing with each other
    "another mode": _entry_edit(
        _is_people,
        lambda e: e.update(
            cost=dict(_APPROX_ZERO),
            charged=dict(_APPROX_ZERO),
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(READABLE_EDITS))
def test_an_export_whose_readable_fields_were_edited_does_not_verify(
    export: list[str], tmp_path: Path, case: str
) -> None:
    """DESIGN.md: verify detects any edited entry. The readable figures a compliance reader
    sees are not hashed, but each follows from what is: ``verify --file`` recomputes them
    (the 40-line verifier of the docs checks the hashes only, and says so)."""
    path = _write(tmp_path, READABLE_EDITS[case](export))
    result = _verifiers(tmp_path)["cli"](path)
    assert result.returncode == 1 and "DAMAGED: line " in result.stderr, result.stderr
    assert "edited" in result.stderr and "ok:" not in result.stdout


def test_every_kind_of_entry_states_what_its_hash_makes_it(api: Api, tmp_path: Path) -> None:
    """An export of every mode (rdp at a fractional order, approx with advanced composition)
    and every kind of entry (grants, denials, draws on a hold, a settle, a release, a batch
    priced in groups, a population's chain, limit changes with and without a reason) has
    readable fields that are exactly what its hashed fields make them."""
    from accountant.ledger_file import claims_of
    from accountant.ledger_readable import first_difference, signed_terms

    budget = {"epsilon": 8, "delta": 1e-5}
    api.make_dataset("pure", budget={"epsilon": 8})
    api.make_dataset("approx", accounting="approx", budget=budget)
    api.make_dataset("advanced", accounting="approx", composition="advanced", budget=budget)
    api.make_dataset("zcdp", accounting="zcdp", budget=budget)
    api.make_dataset("rdp", accounting="rdp", budget=budget)
    api.make_dataset("gdp", accounting="gdp", budget=budget)
    population = {"name": "pop", "privacy_unit": "user", "accounting": "zcdp", "budget": budget}
    assert api.post("/v1/populations", population).status_code == 201
    api.make_dataset(
        "member", privacy_unit="user", accounting="zcdp", budget=budget, population="pop"
    )
    gaussian: dict[str, Any] = {"mechanism": "gaussian", "params": {"sigma": 3, "sensitivity": 1}}
    stated: dict[str, Any] = {
        "mechanism": "gaussian",
        "params": {"epsilon": 0.3, "delta": 1e-7, "sensitivity": 1},
    }
    releases: tuple[tuple[str, dict[str, Any]], ...] = (
        ("pure", {}),
        ("approx", stated),
        ("advanced", stated),
    )
    for name, release in releases:
        assert (
            api.charge(name, partitions=["a", "b"], release="parallel", **release).status_code
            == 201
        )
    for name in ("zcdp", "rdp", "gdp", "member"):
        assert (
            api.charge(name, partitions=["a", "b"], release="parallel", **gaussian).status_code
            == 201
        )
    for name in ("pure", "approx", "zcdp", "rdp", "gdp", "member"):
        assert api.charge(name, epsilon=50).status_code in (400, 409)
        assert api.charge(
            name, **{**gaussian, "params": {"sigma": 0.01, "sensitivity": 1}}
        ).status_code in (400, 409)
    hold = {"dataset": "approx", "partitions": ["h"], "amount": {"epsilon": 1, "delta": 1e-7}}
    held = api.post("/v1/holds", {**hold, "expires_in": 3600}).get_json()
    assert api.charge("approx", partitions=["h"], hold=held["hold_id"], **stated).status_code == 201
    settled = api.post(
        f"/v1/holds/{held['hold_id']}/settle", {"used": {"epsilon": 0.5, "delta": 1e-7}}
    )
    assert settled.status_code == 200, settled.get_json()
    released = api.post("/v1/holds", {**hold, "expires_in": 3600}).get_json()
    assert api.post(f"/v1/holds/{released['hold_id']}/release", {}).status_code == 200
    items = [{"dataset": "approx", "partitions": ["g"], **gaussian, "input": {"values": [1.0]}}] * 3
    assert api.post("/v1/charges/batch", {"items": items, "delta": 1e-6}).status_code == 201
    for name in ("pure", "zcdp", "gdp"):
        api.patch(
            f"/v1/datasets/{name}",
            {
                "budget": {"epsilon": 7, "delta": 1e-5} if name != "pure" else {"epsilon": 7},
                "reason": "lower",
            },
        )
    api.patch("/v1/datasets/rdp", {"budget": {"epsilon": 7, "delta": 1e-5}})
    text = api.get("/v1/ledger/export?format=jsonl").text
    lines = [json.loads(line) for line in text.splitlines() if line]
    kinds = {(line["kind"], line["status"], line["hold_id"] is not None) for line in lines}
    assert {
        ("settle", "granted", True),
        ("hold", "granted", True),
        ("limit_change", "granted", False),
    } <= kinds
    assert any(line["group"] is not None for line in lines) and any(
        line["population"] for line in lines
    )
    terms = signed_terms(claims_of(lines[-1]["export_signature"]))
    assert terms is not None and terms["rdp"]["terms"]["rdp_order"] == "3.874"
    assert terms["advanced"]["terms"]["composition_delta"] is not None
    assert first_difference(text.splitlines(), terms) is None
    result = _verifiers(tmp_path)["cli"](_write(tmp_path, text.splitlines()))
    assert result.returncode == 0, result.stderr


def test_an_export_whose_signature_states_no_terms_is_checked_without_its_readable_fields(
    export: list[str], tmp_path: Path
) -> None:
    """An export made before the signature stated each chain's terms: its hashes, links
    and contents are checked as before, and the command says the readable figures were not."""
    from accountant.ledger_file import claims_of

    signature = json.loads(export[-1])["export_signature"]
    claims = claims_of(signature)
    for held in claims["contents"].values():
        del held["terms"]
    older = _signed_by(export, claims, signature)
    result = _verifiers(tmp_path)["cli"](_write(tmp_path, older))
    assert result.returncode == 0, result.stderr
    assert "readable figures (cost, charged, created_at, reason) were not checked" in result.stderr
