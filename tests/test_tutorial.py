"""docs/tutorial.md runs: its Python blocks, in order, as one program, against a real
`accountant serve`, with its asserts checking the numbers the text states."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ADMIN_KEY

pytestmark = pytest.mark.slow
TUTORIAL = Path(__file__).parent.parent / "docs" / "tutorial.md"


def test_the_tutorial_runs(server: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    assert len(blocks) == 7
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
    print(out)
