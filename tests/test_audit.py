"""The privacy audit passes every built-in and catches a plugin that under-declares epsilon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accountant.audit import audit
from accountant.plugins import MechanismRegistry, make_plugin_manager
from accountant.randomness import SeededRandomSource
from tests.plugins import half_noise

BIN = Path(sys.executable).parent / "accountant"
REGISTRY = MechanismRegistry(*make_plugin_manager(extra_plugins=[("half_noise", half_noise)]))
BUILTINS = [
    "discrete_gaussian",
    "discrete_laplace",
    "exponential",
    "gaussian",
    "laplace",
    "randomized_response",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_passes(name: str) -> None:
    mechanism = REGISTRY.get(name)
    assert mechanism is not None
    samples = 4_000 if name == "exponential" else 200_000
    findings = audit(
        mechanism, samples=samples, alpha=1e-3, source=SeededRandomSource(sum(map(ord, name)))
    )
    assert findings and all(f.passed for f in findings), findings
    if name in ("laplace", "discrete_laplace", "randomized_response"):
        # the audit has power: the bound comes close to the true epsilon of 1
        assert max(f.epsilon_lower_bound for f in findings) > 0.8


@pytest.mark.slow
def test_half_noise_is_caught() -> None:
    mechanism = REGISTRY.get("half_noise")
    assert mechanism is not None
    findings = audit(mechanism, samples=200_000, alpha=1e-3, source=SeededRandomSource(99))
    assert not all(f.passed for f in findings)
    assert max(f.epsilon_lower_bound for f in findings) > 1.5  # true epsilon is 2


@pytest.mark.slow
def test_the_command_shows_progress_and_fails_on_an_unknown_name() -> None:
    result = subprocess.run(
        [BIN, "plugins", "audit", "laplace", "--samples", "100000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "drawing 100000 outputs per side" in result.stderr
    assert result.stdout.startswith("pass laplace")
    missing = subprocess.run([BIN, "plugins", "audit", "nothing"], capture_output=True, text=True)
    assert missing.returncode != 0 and "registered" in missing.stderr
