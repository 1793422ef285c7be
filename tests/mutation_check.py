"""Disable each privacy-critical rule in turn and show that the tests go red.

Each mutation edits one line of a copy of the source (the checked text must be
found, so a renamed rule fails here loudly rather than passing silently), runs
the tests that guard the rule against the copy, and expects them to fail. Run
it directly (``python tests/mutation_check.py [NAME ...]``); tests/test_mutations.py
runs it in the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # in the source tree
    before: str
    after: str
    tests: tuple[str, ...]


MUTATIONS = [
    Mutation(
        "costs round down",
        "accountant/exact.py",
        "return min(math.ceil(exact * self.scale), SATURATION)",
        "return min(math.floor(exact * self.scale), SATURATION)",
        ("tests/test_exact.py",),
    ),
    Mutation(
        "limits round up",
        "accountant/exact.py",
        "return min(math.floor(exact * self.scale), SATURATION)",
        "return min(math.ceil(exact * self.scale), SATURATION)",
        ("tests/test_exact.py",),
    ),
    Mutation(
        "joint record scaling dropped",
        "accountant/accounting/pricing.py",
        "return max_records * (n if k is None else min(k, n))",
        "return max_records",
        ("tests/test_pricing.py",),
    ),
    Mutation(
        "parallel record scaling dropped",
        "accountant/accounting/pricing.py",
        '    if release == "parallel":\n        return max_records\n',
        '    if release == "parallel":\n        return 1\n',
        ("tests/test_pricing.py",),
    ),
    Mutation(
        "max over partitions dropped",
        "accountant/accounting/loss.py",
        "values[name] = max(state.max_all[name], state.max_touched[name] + c)",
        "values[name] = state.max_touched[name] + c",
        ("tests/test_loss_rules.py",),
    ),
    Mutation(
        "top-k reduced to the largest",
        "accountant/accounting/loss.py",
        "top = sorted(candidates, reverse=True)[: rule.max_partitions_per_user]",
        "top = sorted(candidates, reverse=True)[:1]",
        ("tests/test_loss_rules.py",),
    ),
    Mutation(
        "parallel multiplicity dropped",
        "accountant/accounting/loss.py",
        "            return min(k, partition_count)\n        return partition_count",
        "            return 1\n        return partition_count",
        ("tests/test_loss_rules.py",),
    ),
    Mutation(
        "grid rounding paid once per release",
        "plugins/_samplers.py",
        "return math.ceil(Fraction(sensitivity) / Fraction(grid)) + coordinates",
        "return math.ceil(Fraction(sensitivity) / Fraction(grid)) + 1",
        ("tests/test_mechanisms.py",),
    ),
    Mutation(
        "a refused charge fails every charge that shared its transaction",
        "accountant/group_commit.py",
        "    return isinstance(error, Exception)\n",
        "    return False\n",
        ("tests/test_group_commit.py",),
    ),
    Mutation(
        "a duplicate key fails every charge that shared its transaction",
        "accountant/group_commit.py",
        "        return isinstance(error, IntegrityError)\n",
        "        return False\n",
        ("tests/test_group_commit.py",),
    ),
    Mutation(
        "a charge trusts the key read before its lock",
        "accountant/services/charges.py",
        "    if not dataset.key_valid:",
        "    if False:",
        ("tests/test_known_keys.py",),
    ),
    Mutation(
        "a remembered key is not read again when its request fails",
        "accountant/api/auth.py",
        "            known.remember(key_hash, _authenticated(key_hash))",
        "            pass",
        ("tests/test_known_keys.py",),
    ),
    Mutation(
        "a charge reads grants from its authenticated principal",
        "accountant/services/evaluation.py",
        'if not (principal.role in {"admin", "auditor"} or dataset.granted):',
        "if not principal.may_read(dataset.id):",
        ("tests/test_known_keys.py",),
    ),
    Mutation(
        "replay ignores the implementation",
        "accountant/services/replay.py",
        "elif outcome.implementation != mechanism.implementation:",
        "elif False:",
        ("tests/test_replay.py",),
    ),
    Mutation(
        "a long lock wait keeps the windows read before it",
        "accountant/services/evaluation.py",
        "if any(w.start > Window.containing(w.period, reads.now).end for w in windows):",
        "if False:",
        ("tests/test_clock.py",),
    ),
    Mutation(
        "randomized response composes as rho * f^2",
        "accountant/accounting/pricing.py",
        "None if rho is None else rho * factor,",
        "None if rho is None else rho * factor * factor,",
        ("tests/test_pricing.py",),
    ),
    Mutation(
        "rdp charges rho without the order",
        "accountant/accounting/modes.py",
        "return RHO.cost_units(cost.rho * Fraction(order))",
        "return RHO.cost_units(cost.rho)",
        ("tests/test_rdp_gdp.py::test_gaussians_fit_until_b_of_the_order",),
    ),
    Mutation(
        "rdp charges epsilon-DP releases epsilon^2/2",
        "accountant/accounting/modes.py",
        "return RHO.cost_units(renyi_of_pure(cost.epsilon, order))",
        "return RHO.cost_units(cost.epsilon**2 / 2)",
        ("tests/test_rdp_gdp.py::test_laplace_is_charged_the_epsilon_dp_bound",),
    ),
    Mutation(
        "verify skips the chain heads' seals",
        "accountant/services/verification.py",
        "found = Problem(*sealed) if sealed else head_problem(session, hasher)",
        "found = Problem(*sealed) if sealed else None",
        ("tests/test_head_seals.py",),
    ),
    Mutation(
        "an append seals a new head over one the service did not seal",
        "accountant/seals.py",
        "if not hmac.compare_digest(seal, of_head(hasher, name, seq, head)):",
        "if False:",
        ("tests/test_head_seals.py",),
    ),
    Mutation(
        "verify trusts the recorded loss_after",
        "accountant/services/verification.py",
        "        if recorded != expected:",
        "        if False:",
        ("tests/test_head_seals.py",),
    ),
    Mutation(
        "gdp charges the grid sampler mu = D/sigma",
        "plugins/gaussian.py",
        "GDP_MARGIN = 1 + Fraction(1, 2**20)",
        "GDP_MARGIN = 1 + Fraction(0)",
        ("tests/test_rdp_gdp.py::test_the_charged_mu_dominates_the_grid_sampler",),
    ),
    Mutation(
        "gdp charges a coordinate that moves by one grid unit mu = 1/s",
        "plugins/gaussian.py",
        "GDP_MARGIN = 1 + Fraction(1, 2**20)",
        "GDP_MARGIN = 1 + Fraction(0)",
        ("tests/test_rdp_gdp.py::test_a_coordinate_moved_by_one_grid_unit_stays_within_its_share",),
    ),
]

#: Where each source folder lives as an importable package in the copy.
_PACKAGES = {
    "accountant": "accountant",
    "plugins": "accountant_plugins",
    "migrations": "accountant_migrations",
    "tests": "tests",
}


def _copy(target: Path) -> None:
    for source, name in _PACKAGES.items():
        shutil.copytree(
            ROOT / source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")


def _source_path(copy: Path, path: str) -> Path:
    folder, rest = path.split("/", 1)
    return copy / _PACKAGES[folder] / rest


def run(mutation: Mutation, *, applied: bool = True) -> tuple[int, float]:
    """pytest's exit code for the guarding tests with ``mutation`` applied (where they must
    fail: 1) or, with ``applied=False``, on the unchanged copy (where they must pass: 0),
    and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as folder:
        copy = Path(folder)
        _copy(copy)
        target = _source_path(copy, mutation.path)
        text = target.read_text()
        if text.count(mutation.before) != 1:
            raise SystemExit(
                f"{mutation.name}: the rule's text was not found once in "
                f"{mutation.path}; update tests/mutation_check.py"
            )
        if applied:
            target.write_text(text.replace(mutation.before, mutation.after))
        # SQLite only, and no metrics folder of some server this process once ran
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("ACCOUNTANT_TEST_POSTGRES_URL", "PROMETHEUS_MULTIPROC_DIR")
        }
        started = time.monotonic()
        # The copy is the working directory, so it is imported before the installed package.
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-x",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "0",
                *mutation.tests,
            ],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
        )
        if not applied and result.returncode != 0:
            print(result.stdout[-4000:], result.stderr[-2000:], sep="\n", flush=True)
        return result.returncode, time.monotonic() - started


def main(names: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    tests = sorted({test for m in chosen for test in m.tests})
    unchanged = [
        Mutation(f"unchanged {test}", chosen[0].path, chosen[0].before, chosen[0].before, (test,))
        for test in tests
    ]
    survivors = []
    # Every run has a copy of its own, so they run side by side, one per core; the verdicts
    # count only if the guarding tests pass on the unchanged copies.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        baselines = [pool.submit(run, copy, applied=False) for copy in unchanged]
        mutants = [pool.submit(run, mutation) for mutation in chosen]
        for copy, future in zip(unchanged, baselines, strict=True):
            code, seconds = future.result()
            print(
                f"{'passes' if code == 0 else 'FAILED':8} {copy.name} ({seconds:.0f} s)", flush=True
            )
            if code != 0:
                pool.shutdown(cancel_futures=True)
                return 1
        for mutation, future in zip(chosen, mutants, strict=True):
            code, seconds = future.result()
            killed = code == 1  # tests failed (2 and above: pytest itself could not run)
            verdict = "killed" if killed else "SURVIVED"
            print(
                f"{verdict:8} {mutation.name} ({', '.join(mutation.tests)}, {seconds:.0f} s)",
                flush=True,
            )
            if not killed:
                survivors.append(mutation.name)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutations killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
