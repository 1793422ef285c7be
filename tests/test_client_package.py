"""The client is its own distribution (client/, privacy-accountant-client): its wheel holds
only `accountant_client`, installs into a fresh venv without any of the service, and works
there against a real `accountant serve`; `accountant.client` re-exports it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

import accountant.client
import accountant_client
from accountant.migrate import upgrade
from tests.conftest import ADMIN_KEY

ROOT = Path(__file__).parent.parent
#: The documented install commands. The wheel's two run here as written, in a shell whose
#: `pip` is the test venv's (to build) and then the new venv's (to install).
BUILD = "pip wheel --no-deps ./client -w dist/"
INSTALL = "pip install dist/privacy_accountant_client-*.whl"
FROM_A_CLONE = "pip install ./client"
FROM_THE_REPOSITORY = (
    "pip install 'privacy-accountant-client @ git+REPOSITORY-URL#subdirectory=client'"
)
#: The service and what installing it from the clone pulled in beside the client.
SERVER_MODULES = ["accountant", "flask", "sqlalchemy", "numpy", "gunicorn"]
MB = 1_000_000

# Sizes of what pip installed, from each distribution's RECORD: the client's package alone,
# the client with its dependencies (not pip and setuptools, which come with every venv), and
# the whole site-packages.
_SIZES = """
import importlib.metadata, json, os, sysconfig
sizes = {
    d.metadata["Name"].lower(): sum(os.path.getsize(f.locate()) for f in d.files or ())
    for d in importlib.metadata.distributions()
}
site = sysconfig.get_paths()["purelib"]
print(json.dumps({
    "client": sizes["privacy-accountant-client"],
    "client_and_dependencies": sum(v for k, v in sizes.items() if k not in ("pip", "setuptools")),
    "site_packages": sum(
        os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(site) for f in files
    ),
    "distributions": sorted(sizes),
}))
"""


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite alone: what is tested is the client's installation, not the service's storage."""
    url = f"sqlite:///{tmp_path / 'accountant.db'}"
    upgrade(url)
    return url


@dataclass(frozen=True)
class CleanVenv:
    python: Path
    wheel: Path
    sizes: dict[str, int]
    distributions: list[str]


def _run(*command: str | Path, cwd: Path, shell_path: Path | None = None) -> str:
    """Run outside the test's environment (no PYTHONPATH, which holds the test plugins, no
    venv); with ``shell_path``, ``command`` is one shell line run with that folder first on
    PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    argv = [str(part) for part in command]
    if shell_path is not None:
        env["PATH"] = f"{shell_path}{os.pathsep}{env.get('PATH', '')}"
        argv = ["sh", "-c", *argv]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> CleanVenv:
    """The README's wheel commands: BUILD in a copy of the checkout's client/ (so the checkout
    gets no build/ folder), then INSTALL in a new venv, fetching httpx and cryptography from
    the package index."""
    work = tmp_path_factory.mktemp("clean-venv")
    shutil.copytree(
        ROOT / "client",
        work / "client",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    _run(BUILD, cwd=work, shell_path=Path(sys.executable).parent)
    (wheel,) = (work / "dist").glob("privacy_accountant_client-*.whl")
    _run(sys.executable, "-m", "venv", "venv", cwd=work)
    python = work / "venv" / "bin" / "python"
    _run(INSTALL, cwd=work, shell_path=python.parent)
    measured = json.loads(_run(python, "-I", "-c", _SIZES, cwd=work))
    distributions = measured.pop("distributions")
    print(
        "client venv: "
        + ", ".join(f"{name} {size / MB:.2f} MB" for name, size in measured.items())
        + f"; distributions: {' '.join(distributions)}"
    )
    return CleanVenv(python, wheel, measured, distributions)


@pytest.mark.slow
def test_the_wheel_installs_only_the_client_package(clean_venv: CleanVenv) -> None:
    """Nothing goes into the server's `accountant` package: one import name of its own,
    typed (py.typed)."""
    with zipfile.ZipFile(clean_venv.wheel) as wheel:
        names = wheel.namelist()
    packages = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert packages == {"accountant_client"}
    assert "accountant_client/py.typed" in names


@pytest.mark.slow
def test_the_client_works_in_a_venv_without_the_service(
    clean_venv: CleanVenv, server: str, tmp_path: Path
) -> None:
    """The venv has none of the service's modules; there the client charges, gets a denial
    as BudgetExhausted and checks receipts without asking the service."""
    find = f"import importlib.util as u; print([m for m in {SERVER_MODULES!r} if u.find_spec(m)])"
    assert _run(clean_venv.python, "-I", "-c", find, cwd=tmp_path).strip() == "[]"
    assert not {"privacy-accountant", "flask", "sqlalchemy", "numpy", "gunicorn"} & set(
        clean_venv.distributions
    )
    assert clean_venv.sizes["client_and_dependencies"] < 40 * MB  # the service's venv: 168 MB

    program = ROOT / "tests" / "clean_venv_client.py"
    seen = json.loads(_run(clean_venv.python, "-I", program, server, ADMIN_KEY, cwd=tmp_path))
    assert (Decimal(seen["cost"]), Decimal(seen["remaining"])) == (Decimal("0.75"), Decimal("0.25"))
    assert seen["receipt_charge_id"] == seen["charge_id"]
    denial = seen["denial"]
    assert (denial["class"], denial["scope"]) == ("BudgetExhausted", "dataset")
    assert [Decimal(denial[k]) for k in ("limit", "spent", "requested")] == [
        Decimal(1),
        Decimal("0.75"),
        Decimal("0.75"),
    ]
    assert "not the one the receipt names" in seen["other_output"]
    assert seen["requests_while_verifying"] == []  # offline, against the cached key set
    assert seen["key_set_fetches"] == 1


def test_accountant_client_re_exports_the_client() -> None:
    assert accountant.client.__all__ == accountant_client.__all__
    for name in accountant_client.__all__:
        assert getattr(accountant.client, name) is getattr(accountant_client, name), name


def test_without_the_client_the_old_import_names_the_install_command() -> None:
    code = (
        "import sys\n"
        "sys.modules['accountant_client'] = None\n"  # as if privacy-accountant-client were absent
        "try:\n"
        "    import accountant.client\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install ./client" in done.stdout, done.stdout + done.stderr
    assert "accountant_client" in done.stdout


def test_the_documents_give_the_commands_tested_here() -> None:
    """README, tutorial and API document: the client's install commands, not an extra of the
    service (`privacy-accountant[client]` was never published)."""
    readme, tutorial, api = (
        (ROOT / name).read_text() for name in ("README.md", "docs/tutorial.md", "docs/api.md")
    )
    for command in (FROM_A_CLONE, FROM_THE_REPOSITORY, BUILD, INSTALL):
        assert command in readme, command
        assert command in tutorial, command
    flat = " ".join(api.split())
    for command in (FROM_A_CLONE, FROM_THE_REPOSITORY, BUILD):
        assert command in flat, command
    for text in (readme, tutorial, api):
        assert "[client]" not in text and "from accountant.client import" not in text
