"""`accountant populations ...` against a real `accountant serve`: each command calls the
HTTP API with ACCOUNTANT_URL and ACCOUNTANT_KEY and prints the service's JSON answer; a
refusal is one line saying what to do next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from accountant.cli import main
from accountant.migrate import upgrade
from accountant_client import Client as ApiClient
from tests.conftest import ADMIN_KEY
from tests.server import free_port, running_service

BIN = Path(sys.executable).parent / "accountant"
COMMANDS = ["create", "list", "show", "budget", "set-limit"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `accountant serve` for the module, on SQLite: what is tested is the command line.
    Each test makes populations of its own."""
    folder = tmp_path_factory.mktemp("cli-populations")
    url = f"sqlite:///{folder / 'accountant.db'}"
    upgrade(url)
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(folder / "signing-key.pem"),
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
    }
    with running_service(env, folder / "serve.log") as running:
        yield running.base


def run(server: str | None, *args: str, key: str | None = ADMIN_KEY) -> Result:
    """``accountant populations ARGS`` in process, with ACCOUNTANT_URL and ACCOUNTANT_KEY
    (neither ACCOUNTANT_ADMIN_KEY, which the command would use for a missing key)."""
    env = {"ACCOUNTANT_URL": server, "ACCOUNTANT_KEY": key, "ACCOUNTANT_ADMIN_KEY": None}
    return CliRunner().invoke(main, ["populations", *args], env=env)


def printed(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_line(result: Result, status: int = 1) -> str:
    """The error of a command that failed as it should: one line, no traceback."""
    assert result.exit_code == status, result.output
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_every_populations_command_has_help() -> None:
    for args in ([], *([command] for command in COMMANDS)):
        result = CliRunner().invoke(main, ["populations", *args, "--help"])
        assert result.exit_code == 0, result.output
        assert "Usage:" in result.output
    assert "populations" in CliRunner().invoke(main, ["--help"]).output
    create = CliRunner().invoke(main, ["populations", "create", "--help"]).output
    assert "person-level id" in create and "ACCOUNTANT_KEY" in create


def test_create_list_show_budget_and_set_limit(server: str) -> None:
    created = run(server, "create", "customers", "--accounting", "approx", "--epsilon", "2")
    population = printed(created)
    assert population["name"] == "customers" and population["privacy_unit"] == "user"
    assert population["accounting"] == "approx" and population["budget"]["epsilon"] == 2
    assert "person-level id" in created.stderr  # the identity sentence, said on creation
    with ApiClient(server, ADMIN_KEY) as admin:
        for name in ("orders", "tickets"):
            admin.create_dataset(
                name=name,
                privacy_unit="user",
                accounting="approx",
                budget={"epsilon": 1.5, "delta": 1e-6},
                population="customers",
            )
        admin.charge(
            dataset="orders",
            partitions=["a"],
            mechanism="laplace",
            params={"epsilon": 0.5, "sensitivity": 1},
            input={"values": [1.0]},
        )
    listed = printed(run(server, "list"))["populations"]
    assert "customers" in [p["name"] for p in listed]
    shown = printed(run(server, "show", "customers"))
    assert sorted(shown["datasets"]) == ["orders", "tickets"]
    report = printed(run(server, "budget", "customers"))
    assert report["population"] == "customers" and report["loss"]["epsilon"] == 0.5
    assert report["remaining"]["epsilon"] == 1.5
    assert report["datasets"]["orders"]["epsilon"] == 0.5
    changed = run(
        server,
        "set-limit",
        "customers",
        "--epsilon",
        "3",
        "--delta",
        "1e-6",
        "--reason",
        "a second study",
    )
    assert printed(changed)["budget"]["epsilon"] == 3
    after = printed(run(server, "budget", "customers"))
    assert after["limit"]["epsilon"] == 3 and after["remaining"]["epsilon"] == 2.5
    assert after["limit_history"]


def test_an_rdp_population_keeps_its_order(server: str) -> None:
    ordered = ["--delta", "1e-6", "--rdp-order", "8"]
    made = run(server, "create", "rdp-people", "--accounting", "rdp", "--epsilon", "4", *ordered)
    assert Decimal(str(printed(made)["rdp_order"])) == 8


def test_refusals_say_what_to_do_next(server: str) -> None:
    printed(run(server, "create", "taken", "--accounting", "pure", "--epsilon", "1"))
    again = run(server, "create", "taken", "--accounting", "pure", "--epsilon", "1")
    assert "choose another name" in one_line(again)
    unknown = one_line(run(server, "show", "nobody"))
    assert "accountant populations list" in unknown
    assert "accountant populations list" in one_line(run(server, "budget", "nobody"))
    unlimited = run(server, "set-limit", "nobody", "--epsilon", "1", "--reason", "r")
    assert "accountant populations list" in one_line(unlimited)
    bad_mode = one_line(run(server, "create", "odd", "--accounting", "odd", "--epsilon", "1"))
    assert "accounting" in bad_mode  # the field at fault, as the service named it
    negative = one_line(run(server, "create", "neg", "--accounting", "pure", "--epsilon", "-1"))
    assert "epsilon" in negative
    assert "not a valid name" in one_line(run(server, "show", "Upper/x"), status=2)
    assert "--reason" in one_line(run(server, "set-limit", "taken", "--epsilon", "2"), status=2)
    refused = one_line(run(server, "list", key="not-a-key-" + "x" * 32))
    assert "refused the key" in refused and "ACCOUNTANT_KEY" in refused
    assert "ACCOUNTANT_KEY" in one_line(run(server, "list", key=None), status=2)
    with ApiClient(server, ADMIN_KEY) as admin:
        service = admin.create_consumer("svc-cli", "service")["api_key"]
    forbidden = run(server, "create", "mine", "--accounting", "pure", "--epsilon", "1", key=service)
    assert "admin's key" in one_line(forbidden)


def test_no_service_at_the_url(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    said = one_line(run(nowhere, "list"))
    assert f"no answer from {nowhere}" in said and "ACCOUNTANT_URL" in said


def test_the_installed_command_reads_its_url_and_key_from_the_environment(server: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")},
        "ACCOUNTANT_URL": server,
        "ACCOUNTANT_KEY": ADMIN_KEY,
    }
    done = subprocess.run(
        [BIN, "populations", "list"], env=env, capture_output=True, text=True, check=True
    )
    assert isinstance(json.loads(done.stdout)["populations"], list)


def test_without_the_client_the_command_names_the_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['accountant_client'] = None\n"  # as if privacy-accountant-client were absent
        "from accountant.cli import main\n"
        "main(['populations', 'list', '--key', 'k'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "pip install ./client" in done.stderr


def test_a_raise_under_approvals_prints_the_pending_request(tmp_path: Path) -> None:
    """ACCOUNTANT_APPROVALS=on: set-limit raising the limit prints the 202's request and
    says on standard error that nothing changed; lowering it applies at once."""
    url = f"sqlite:///{tmp_path / 'accountant.db'}"
    upgrade(url)
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(tmp_path / "signing-key.pem"),
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
        "ACCOUNTANT_APPROVALS": "on",
    }
    with running_service(env, tmp_path / "serve.log") as running:
        printed(run(running.base, "create", "guarded", "--accounting", "pure", "--epsilon", "1"))
        higher = ["set-limit", "guarded", "--epsilon", "5", "--reason", "a new study"]
        asked = run(running.base, *higher)
        request = printed(asked)
        assert request["state"] == "pending" and request["request_id"]
        assert "nothing changed yet" in asked.stderr and request["request_id"] in asked.stderr
        assert printed(run(running.base, "show", "guarded"))["budget"]["epsilon"] == 1
        lower = ["set-limit", "guarded", "--epsilon", "0.5", "--reason", "tighter"]
        lowered = run(running.base, *lower)
        assert printed(lowered)["budget"]["epsilon"] == 0.5 and lowered.stderr == ""
