"""Rotating the receipt-signing key as docs/operations.md says, with the real command and
real files: the noise and key-hash secrets stay where they are, so the service keeps
serving, API keys keep working, replays keep their noise and old receipts still verify."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import requests

from tests.server import BIN, running_service

DOCS = Path(__file__).parent.parent / "docs" / "operations.md"
CHARGE: dict[str, Any] = {
    "dataset": "web",
    "partitions": ["p"],
    "mechanism": "laplace",
    "params": {"epsilon": 0.1, "sensitivity": 1},
    "input": {"values": [120.0]},
}


def _rotation_steps() -> list[str]:
    """The lines of the shell block under "Rotating the signing key", as written."""
    section = DOCS.read_text().split("## Rotating the signing key", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found is not None, "no shell block under 'Rotating the signing key'"
    return found.group(1).strip().splitlines()


def _environment_after(lines: list[str], env: dict[str, str], cwd: Path) -> dict[str, str]:
    """The environment that running ``lines`` in bash, in ``cwd``, leaves."""
    done = subprocess.run(
        ["bash", "-euc", "\n".join([*lines, "env -0"])],
        env=env,
        cwd=cwd,
        capture_output=True,
        check=True,
    )
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return dict(pairs)


def _charge(base: str, key: str) -> Any:
    return requests.post(
        f"{base}/v1/charges",
        headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "rotation-1"},
        json=CHARGE,
        timeout=10,
    )


def test_rotating_the_signing_key_as_documented_keeps_the_service_and_its_secrets(
    database_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "service"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    env["ACCOUNTANT_DATABASE_URL"] = database_url
    key = subprocess.run(
        [BIN, "init"], env=env, cwd=folder, capture_output=True, text=True, check=True
    ).stdout.strip()
    secrets = {
        name: (folder / "var" / name).read_bytes() for name in ("noise-secret", "key-hash-secret")
    }
    with running_service(env, tmp_path / "before.log", "--workers", "1", cwd=folder) as server:
        made = requests.post(
            f"{server.base}/v1/datasets",
            headers={"Authorization": f"Bearer {key}"},
            json={"name": "web", "privacy_unit": "record", "budget": {"epsilon": 1}},
            timeout=10,
        )
        assert made.status_code == 201
        first = _charge(server.base, key)
        assert first.status_code == 201
        assert server.stop() == 0

    steps = _rotation_steps()
    assert steps[-1] == "accountant serve"  # the documented start; the test picks the port
    rotated = _environment_after(steps[:-1], env, folder)
    with running_service(rotated, tmp_path / "after.log", "--workers", "1", cwd=folder) as server:
        again = _charge(server.base, key)  # the same API key, the same idempotency key
        assert again.status_code == 201 and again.text == first.text  # same noise, same bytes
        verified = requests.post(
            f"{server.base}/v1/receipts/verify",
            headers={"Authorization": f"Bearer {key}"},
            json={"receipt": first.json()["receipt"]},
            timeout=10,
        )
        assert verified.json()["valid"] is True
        fresh = requests.post(
            f"{server.base}/v1/charges",
            headers={"Authorization": f"Bearer {key}"},
            json=CHARGE,
            timeout=10,
        )
        assert fresh.status_code == 201
        assert fresh.json()["receipt"].split(".")[0] != first.json()["receipt"].split(".")[0]
        assert server.stop() == 0
    new_key = Path(rotated["ACCOUNTANT_SIGNING_KEY_FILE"])
    assert new_key.parent != folder / "var"
    assert [p.name for p in new_key.parent.iterdir()] == [new_key.name]  # no secret made there
    for name, content in secrets.items():
        assert (folder / "var" / name).read_bytes() == content


def test_moving_the_signing_key_alone_refuses_to_start_and_creates_no_secret(
    database_url: str, tmp_path: Path
) -> None:
    """Without naming the secrets, a start in a new folder finds none there: one line naming
    the setting to set (never a command that retires a secret), and nothing created."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    env["ACCOUNTANT_DATABASE_URL"] = database_url
    subprocess.run([BIN, "init"], env=env, cwd=tmp_path, capture_output=True, check=True)
    moved = tmp_path / "keys-2027"
    refused = subprocess.run(
        [BIN, "serve", "--port", "0", "--workers", "1"],
        env={**env, "ACCOUNTANT_SIGNING_KEY_FILE": str(moved / "signing-key.pem")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 1
    lines = [line for line in refused.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1, refused.stderr
    assert f"there is no noise secret file at {moved / 'noise-secret'}" in lines[0]
    assert "set ACCOUNTANT_NOISE_SECRET_FILE to the file that holds it" in lines[0]
    assert "adopt" not in refused.stderr
    assert not moved.exists()
    create = subprocess.run(
        [BIN, "keys", "create", "--name", "ops", "--role", "admin"],
        env={**env, "ACCOUNTANT_SIGNING_KEY_FILE": str(moved / "signing-key.pem")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert create.returncode == 1 and create.stdout == ""  # no key hashed under a new secret
    assert f"there is no key-hash secret file at {moved / 'key-hash-secret'}" in create.stderr
    assert not moved.exists()


def test_noise_secret_show_names_the_file_and_creates_none(
    database_url: str, tmp_path: Path
) -> None:
    """The command the rotation steps point to for finding the secret never makes one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    env["ACCOUNTANT_DATABASE_URL"] = database_url
    subprocess.run([BIN, "init"], env=env, cwd=tmp_path, capture_output=True, check=True)
    here = subprocess.run(
        [BIN, "noise-secret", "show"], env=env, cwd=tmp_path, capture_output=True, text=True
    ).stdout.splitlines()
    assert here[0].endswith(f"({tmp_path / 'var' / 'noise-secret'})")
    assert here[0].split()[2] == here[1].split()[1]  # this host's id is the database's
    moved = tmp_path / "keys-2027"
    elsewhere = subprocess.run(
        [BIN, "noise-secret", "show"],
        env={**env, "ACCOUNTANT_SIGNING_KEY_FILE": str(moved / "signing-key.pem")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert elsewhere.stdout.splitlines()[0] == f"this host: no file ({moved / 'noise-secret'})"
    assert not moved.exists()
