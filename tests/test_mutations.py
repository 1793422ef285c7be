"""The privacy rules' tests fail when a rule is disabled (tests/mutation_check.py)."""

from __future__ import annotations

import pytest

from tests import mutation_check


@pytest.mark.slow
def test_every_privacy_rule_mutation_is_killed(capsys: pytest.CaptureFixture[str]) -> None:
    assert mutation_check.main([]) == 0, capsys.readouterr().out
