"""The layers of docs/architecture.md, held by what each module imports: the dashboard
imports nothing of the API (what both need is in ``web.py`` and ``ledger_export.py``), and
neither the services nor the accounting rules know HTTP (no Flask, no Werkzeug)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "accountant"


def _imported(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports anywhere in it (a function's
    own imports too), by full name; a name imported from a module counts as a module too
    (``from accountant import api`` imports ``accountant.api``), and a relative import is
    resolved."""
    parts = package.split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _offenders(folder: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """The modules of ``accountant/<folder>/`` that import any of ``forbidden`` (or a module
    inside one), with what they import of them."""
    found = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        package = ".".join(path.parent.relative_to(ROOT).parts)
        bad = sorted(
            name
            for name in _imported(path.read_text(), package)
            if any(name == root or name.startswith(root + ".") for root in forbidden)
        )
        if bad:
            found[path.relative_to(PACKAGE).as_posix()] = bad
    return found


def test_the_dashboard_imports_nothing_of_the_api() -> None:
    assert _offenders("dashboard", ("accountant.api",)) == {}


@pytest.mark.parametrize("folder", ["services", "accounting"])
def test_services_and_rules_import_no_http(folder: str) -> None:
    assert _offenders(folder, ("flask", "werkzeug")) == {}


def test_the_check_sees_every_spelling_of_an_import() -> None:
    """The API's views import Flask, and the check finds it; each way of writing an import,
    in a function too, is found by the imported module's full name."""
    assert "api/auth.py" in _offenders("api", ("flask",))
    source = "from .. import api\nimport accountant.api.common\ndef f():\n    from .x import y\n"
    assert _imported(source, "accountant.dashboard") == {
        "accountant",
        "accountant.api",
        "accountant.api.common",
        "accountant.dashboard.x",
        "accountant.dashboard.x.y",
    }
