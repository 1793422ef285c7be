"""An export verifies offline: `accountant ledger verify --file` and the 30-line verifier of
docs/ledger.md both recompute every hash and link, and both name a line edited, deleted,
inserted or moved."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Api

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


def _verifiers(tmp_path: Path) -> dict[str, Callable[[Path], subprocess.CompletedProcess[str]]]:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert len(blocks) == 1 and len(blocks[0].splitlines()) <= 40
    script = tmp_path / "verify_export.py"
    script.write_text(blocks[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    return {
        "cli": lambda path: subprocess.run(
            [BIN, "ledger", "verify", "--file", str(path)], env=env, capture_output=True, text=True
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
    export: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(export) + "\n", encoding="utf-8")
    for name, verify in _verifiers(tmp_path).items():
        result = verify(path)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
    assert "clicks seq 1..6 (whole chain)" in _verifiers(tmp_path)["cli"](path).stdout


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_a_tampered_export_fails_naming_its_line(
    export: list[str], tmp_path: Path, case: str
) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(TAMPERING[case](export)) + "\n", encoding="utf-8")
    for name, verify in _verifiers(tmp_path).items():
        result = verify(path)
        assert result.returncode != 0 and "line " in result.stderr, (name, result.stderr)


def test_a_dataset_filtered_export_verifies_as_a_segment(api: Api, tmp_path: Path) -> None:
    api.make_dataset(budget={"epsilon": 10})
    for _ in range(3):
        api.charge(epsilon=0.1)
    text = api.get("/v1/ledger/export?format=jsonl&dataset=clicks").text
    tail = text.splitlines()[1:]  # as an export filtered by time from seq 2 on would be
    path = tmp_path / "segment.jsonl"
    path.write_text("\n".join(tail) + "\n", encoding="utf-8")
    result = _verifiers(tmp_path)["cli"](path)
    assert result.returncode == 0 and "clicks seq 2..3 (a segment)" in result.stdout


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
    # a changed head no longer verifies: the heads are what was signed
    header, _, signature = token.split(".")
    claims["heads"]["clicks"]["hash"] = "0" * 64
    with pytest.raises(ReceiptError, match="signature"):
        verify(".".join([header, b64url(canonical_json(claims)), signature]), jwks)
