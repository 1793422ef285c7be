"""docs/tutorial.md runs: its Python blocks, in order, as one program, against a real
`accountant serve`, with its asserts checking the numbers the text states."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import ADMIN_KEY

pytestmark = pytest.mark.slow
TUTORIAL = Path(__file__).parent.parent / "docs" / "tutorial.md"


def test_the_tutorial_runs(server: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    assert len(blocks) == 13
    program = tmp_path / "tutorial.py"
    program.write_text("\n".join(blocks))
    run = subprocess.run(
        [sys.executable, str(program)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ACCOUNTANT_URL": server, "ACCOUNTANT_KEY": ADMIN_KEY},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "refreshes that fit today: 10 limited by window" in out
    assert "multiplicity 2 charged 0.5" in out
    assert "loss: 0.5 charged: 2.5" in out
    assert "refused by dataset" in out
    # 7: DP-SGD under a hold, stopped early and settled at the steps it ran
    held = re.search(r"^held: rdp (\S+) for 1000 steps$", out, re.M)
    settled = re.search(r"^settled: rdp (\S+) returned: rdp (\S+)$", out, re.M)
    assert held and settled, out
    assert held[1] == "0.584070335521"
    assert (
        "stopped after 550 of 1000 steps; best validation loss 0.4577 at step 350 "
        "(the true weights': 0.4577)"
    ) in out
    assert Decimal(settled[1]) < Decimal(held[1])
    assert Decimal(settled[1]) + Decimal(settled[2]) == Decimal(held[1])
    assert settled.groups() == ("0.321238684537", "0.262831650984")
    assert "settled epsilon at delta 1e-6: 1.86428858" in out
    assert (
        "receipt: settle training ['model-v1'] used rdp 0.321238684537 "
        "returned rdp 0.262831650984 ledger entry 2"
    ) in out
    # 8: a report as one batch, its group composed: less epsilon than one by one, same delta
    assert "one by one: epsilon 2.0 delta 3e-7" in out
    batch = re.search(r"^as one batch: epsilon (\S+) delta 3e-7$", out, re.M)
    saving = re.search(r"^saving: (\d+)% of the epsilon, at the same delta$", out, re.M)
    assert batch and saving, out
    assert Decimal("1.33") <= Decimal(batch[1]) < Decimal("1.34")  # "epsilon 1.33..."
    assert int(saving[1]) == 33  # "a third less"
    print(out)
