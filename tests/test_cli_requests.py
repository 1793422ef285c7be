"""`accountant requests ...` against a real `accountant serve` with ACCOUNTANT_APPROVALS=on:
each command calls the HTTP API with ACCOUNTANT_URL and ACCOUNTANT_KEY and prints the
service's JSON answer; a refusal is one line saying what to do next."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from accountant.cli import main
from accountant_client import Client as ApiClient
from accountant_client import PendingApproval
from tests.conftest import ADMIN_KEY
from tests.test_client_requests import BIN, Approving, approving_service

COMMANDS = ["list", "show", "approve", "deny", "ask-quota"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Approving]:
    """One service for the module, two admins: what is tested is the command line."""
    with approving_service(tmp_path_factory.mktemp("cli-requests")) as running:
        yield running


def run(server: str, *args: str, key: str | None = ADMIN_KEY) -> Result:
    """``accountant requests ARGS`` in process, with ACCOUNTANT_URL and ACCOUNTANT_KEY
    (neither ACCOUNTANT_ADMIN_KEY, which the command would use for a missing key)."""
    env = {"ACCOUNTANT_URL": server, "ACCOUNTANT_KEY": key, "ACCOUNTANT_ADMIN_KEY": None}
    return CliRunner().invoke(main, ["requests", *args], env=env)


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


def test_every_requests_command_has_help() -> None:
    for args in ([], *([command] for command in COMMANDS)):
        result = CliRunner().invoke(main, ["requests", *args, "--help"])
        assert result.exit_code == 0, result.output
        assert "Usage:" in result.output
    assert "requests" in CliRunner().invoke(main, ["--help"]).output
    group = CliRunner().invoke(main, ["requests", "--help"]).output
    assert "ACCOUNTANT_APPROVALS" in group and "ACCOUNTANT_KEY" in group
    approve = CliRunner().invoke(main, ["requests", "approve", "--help"]).output
    assert "other than the requester" in approve and "--reason" in approve
    listing = CliRunner().invoke(main, ["requests", "list", "--help"]).output
    assert "pending|approved|denied|expired" in listing


def test_a_quota_asked_listed_shown_and_approved(service: Approving) -> None:
    """End to end: a service asks with `ask-quota`, an admin finds the request with `list`
    and `show` and approves it; the service's quota is set."""
    with ApiClient(service.base, ADMIN_KEY) as admin:
        admin.create_dataset(
            name="clicks", privacy_unit="record", accounting="pure", budget={"epsilon": 2}
        )
        made = admin.create_consumer("reporter", "service", ["clicks"])
    asker = made["api_key"]
    ask = ["ask-quota", "--dataset", "clicks", "--epsilon", "0.5", "--reason", "report grew"]
    asked = run(service.base, *ask, key=asker)
    request = printed(asked)
    assert (request["state"], request["kind"], request["target"]) == ("pending", "quota", "clicks")
    assert request["change"] == {"consumer": "reporter", "quota": {"epsilon": 0.5}}
    request_id = request["request_id"]
    assert "nothing changed yet" in asked.stderr
    assert f"accountant requests approve {request_id}" in asked.stderr
    listed = printed(run(service.base, "list", "--state", "pending"))["requests"]
    assert request_id in [r["request_id"] for r in listed]
    mine = printed(run(service.base, "list", key=asker))["requests"]
    assert [r["request_id"] for r in mine] == [request_id]
    shown = printed(run(service.base, "show", request_id))
    assert shown["reason"] == "report grew" and shown["requested_by"] == "reporter"
    approved = run(service.base, "approve", request_id, "--reason", "fine")
    decided = printed(approved)
    assert (decided["state"], decided["decided_by"]) == ("approved", "admin")
    assert "result" not in decided and approved.stderr == ""
    with ApiClient(service.base, asker) as reporter:
        assert reporter.me()["quotas"]["clicks"]["epsilon"] == 0.5
    again = one_line(run(service.base, "deny", request_id, "--reason", "late"))
    assert "only a pending request is decided" in again and "(409)" in again
    # the installed command, reading its URL and key from the environment
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")},
        "ACCOUNTANT_URL": service.base,
        "ACCOUNTANT_KEY": ADMIN_KEY,
    }
    done = subprocess.run(
        [BIN, "requests", "list", "--state", "approved"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert request_id in [r["request_id"] for r in json.loads(done.stdout)["requests"]]


def test_the_requester_cannot_decide_and_another_admin_denies(service: Approving) -> None:
    with ApiClient(service.base, ADMIN_KEY) as admin:
        admin.create_dataset(
            name="orders", privacy_unit="record", accounting="pure", budget={"epsilon": 1}
        )
        with pytest.raises(PendingApproval) as raised:
            admin.update_dataset("orders", budget={"epsilon": 5}, reason="a new study")
    request_id = raised.value.request_id
    mine = one_line(run(service.base, "approve", request_id, "--reason", "fine by me"))
    assert "another admin must approve" in mine and "(403)" in mine
    assert "other than the requester" in mine
    denied = printed(
        run(service.base, "deny", request_id, "--reason", "not now", key=service.second_key)
    )
    assert (denied["state"], denied["decided_by"]) == ("denied", "second")
    assert denied["decision_reason"] == "not now"
    with ApiClient(service.base, ADMIN_KEY) as admin:
        assert admin.dataset("orders")["budget"]["epsilon"] == 1


def test_an_approved_admin_key_is_printed_once(service: Approving) -> None:
    with ApiClient(service.base, ADMIN_KEY) as admin, pytest.raises(PendingApproval) as raised:
        admin.create_key("second", reason="a new laptop")
    request_id = raised.value.request_id
    approved = run(service.base, "approve", request_id, "--reason", "ok", key=service.second_key)
    result = printed(approved)["result"]
    assert result["consumer"] == "second" and result["key_id"]
    assert "shown this once" in approved.stderr and "'admin'" in approved.stderr
    with ApiClient(service.base, result["api_key"]) as laptop:
        assert laptop.me()["name"] == "second"
    shown = printed(run(service.base, "show", request_id))
    assert shown["state"] == "approved" and "result" not in shown


def test_refusals_say_what_to_do_next(service: Approving) -> None:
    unknown = one_line(run(service.base, "show", "no-such-request"))
    assert "accountant requests list" in unknown and "(404)" in unknown
    assert "not a request id" in one_line(run(service.base, "show", "../datasets"), status=2)
    assert "--reason" in one_line(run(service.base, "approve", "r1"), status=2)
    assert "--reason" in one_line(run(service.base, "deny", "r1"), status=2)
    bad_state = one_line(run(service.base, "list", "--state", "bogus"), status=2)
    assert "pending" in bad_state
    by_admin = ["ask-quota", "--dataset", "clicks", "--epsilon", "1", "--reason", "r"]
    forbidden = one_line(run(service.base, *by_admin))
    assert "(403)" in forbidden and "service granted the dataset" in forbidden
    assert "ACCOUNTANT_KEY" in one_line(run(service.base, "list", key=None), status=2)
    refused = one_line(run(service.base, "list", key="not-a-key-" + "x" * 32))
    assert "refused the key" in refused


def test_a_population_raise_points_to_the_requests_commands(service: Approving) -> None:
    """`populations set-limit` under approvals prints the pending request and the command
    that approves it."""
    env = {
        "ACCOUNTANT_URL": service.base,
        "ACCOUNTANT_KEY": ADMIN_KEY,
        "ACCOUNTANT_ADMIN_KEY": None,
    }
    create = ["populations", "create", "guarded", "--accounting", "pure", "--epsilon", "1"]
    assert CliRunner().invoke(main, create, env=env).exit_code == 0
    higher = ["populations", "set-limit", "guarded", "--epsilon", "5", "--reason", "a study"]
    asked = CliRunner().invoke(main, higher, env=env)
    request = printed(asked)
    assert request["state"] == "pending" and request["kind"] == "population_limit"
    assert f"accountant requests approve {request['request_id']}" in asked.stderr
    approved = run(
        service.base, "approve", request["request_id"], "--reason", "ok", key=service.second_key
    )
    assert printed(approved)["state"] == "approved"
    with ApiClient(service.base, ADMIN_KEY) as admin:
        assert admin.population("guarded")["budget"]["epsilon"] == 5
