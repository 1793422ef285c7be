"""The ``accountant`` command, and a real gunicorn server started by ``accountant serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from accountant.cli import main
from accountant.migrate import head_revision
from tests.conftest import ADMIN_KEY
from tests.server import children, running_service

BIN = Path(sys.executable).parent / "accountant"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "ACCOUNTANT_SIGNING_KEY_FILE": str(tmp_path / "keys" / "signing-key.pem"),
        **extra,
    }


def test_every_command_has_help() -> None:
    runner = CliRunner()
    for args in (
        [],
        ["db"],
        ["db", "upgrade"],
        ["db", "downgrade"],
        ["init"],
        ["serve"],
        ["keys"],
        ["keys", "create"],
        ["plugins"],
        ["plugins", "list"],
        ["ledger", "verify"],
        ["seals"],
        ["seals", "init"],
    ):
        result = runner.invoke(main, [*args, "--help"])
        assert result.exit_code == 0, result.output
        assert "Usage:" in result.output


def test_init_prints_one_admin_key_and_keys_create_works(tmp_path: Path) -> None:
    env = _env(tmp_path)
    first = subprocess.run([BIN, "init"], env=env, capture_output=True, text=True, check=True)
    key = first.stdout.strip()
    assert key.startswith("pba_") and len(key) > 40
    # init creates what the app only reads (create_app creates nothing)
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "key-hash-secret",
        "noise-secret",
        "signing-key.pem",
    ]
    again = subprocess.run([BIN, "init"], env=env, capture_output=True, text=True, check=True)
    assert again.stdout == "" and "already exists" in again.stderr
    made = subprocess.run(
        [BIN, "keys", "create", "--name", "aud", "--role", "auditor"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert made.stdout.strip().startswith("pba_")
    bad = subprocess.run(
        [BIN, "keys", "create", "--name", "svc", "--role", "service", "--dataset", "missing"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "no dataset named missing" in bad.stderr
    existing = subprocess.run(
        [BIN, "keys", "create", "--name", "aud", "--role", "auditor", "--dataset", "clicks"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert existing.returncode == 1 and "PATCH /v1/consumers/aud" in existing.stderr
    other_role = subprocess.run(
        [BIN, "keys", "create", "--name", "aud", "--role", "admin"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert other_role.returncode == 1 and "exists with role auditor" in other_role.stderr
    assert "run again with --role auditor" in " ".join(other_role.stderr.split())  # what next
    another = subprocess.run(  # the same consumer and role: another key, as docs/operations.md says
        [BIN, "keys", "create", "--name", "aud", "--role", "auditor"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert another.stdout.strip().startswith("pba_") and another.stdout != made.stdout
    for name in ("", "=cmd|' /C calc'!A0", "x" * 64, "Upper", "-lead"):  # as over HTTP
        refused = subprocess.run(
            [BIN, "keys", "create", "--name", name, "--role", "auditor"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 2 and "not a valid name" in refused.stderr, name


def test_the_command_works_from_any_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    subprocess.run([BIN, "db", "upgrade"], env=env, cwd=elsewhere, check=True, capture_output=True)
    assert (elsewhere / "var" / "accountant.db").exists()
    subprocess.run(
        [BIN, "db", "downgrade", "base"], env=env, cwd=elsewhere, check=True, capture_output=True
    )


@pytest.mark.slow
def test_serve_runs_gunicorn_workers_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = _env(tmp_path, ACCOUNTANT_ADMIN_KEY=ADMIN_KEY)
    subprocess.run([BIN, "db", "upgrade"], env=env, check=True, capture_output=True)
    with running_service(env, tmp_path / "serve.log", "--workers", "2", ready="/healthz") as server:
        base = server.base
        deadline = time.monotonic() + 20
        while len(workers := children(server.process.pid)) < 2:
            assert time.monotonic() < deadline, f"workers: {workers}"
            time.sleep(0.1)
        assert len(workers) == 2
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert requests.get(f"{base}/readyz", timeout=5).status_code == 200
        created = requests.post(
            f"{base}/v1/datasets",
            headers=headers,
            timeout=5,
            json={"name": "web", "privacy_unit": "record", "budget": {"epsilon": 1}},
        )
        assert created.status_code == 201
        charged = requests.post(
            f"{base}/v1/charges",
            headers=headers,
            timeout=5,
            json={
                "dataset": "web",
                "partitions": ["p"],
                "mechanism": "laplace",
                "params": {"epsilon": 0.5, "sensitivity": 1},
                "input": {"size": 3},
            },
        )
        assert charged.status_code == 201
        output = charged.json()["output"]
        assert len(output["noise"]) == 3 and output["grid"] > 0
        for _ in range(6):  # any worker answers the scrape; each reports every worker's count
            metrics = requests.get(f"{base}/metrics", timeout=5).text
            assert 'accountant_charge_duration_seconds_count{outcome="granted"} 1.0' in metrics
        missing = requests.get(f"{base}/v1/nowhere", headers=headers, timeout=5)
        assert missing.status_code == 404
        assert missing.headers["Content-Type"] == "application/problem+json"
        assert server.stop() == 0
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists()


def test_serve_keeps_an_access_log_on_request_and_logs_its_stop(tmp_path: Path) -> None:
    """ACCOUNTANT_ACCESS_LOG=true: one JSON line per request, with no header or query (so no
    key); no alembic INFO lines at start; the master's last line says it stopped."""
    env = _env(tmp_path, ACCOUNTANT_ADMIN_KEY=ADMIN_KEY, ACCOUNTANT_ACCESS_LOG="true")
    subprocess.run([BIN, "init"], env=env, check=True, capture_output=True)
    log = tmp_path / "serve.log"
    with running_service(env, log, "--workers", "1", ready="/readyz") as server:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        listed = requests.get(f"{server.base}/v1/datasets?limit=5", headers=headers, timeout=5)
        assert listed.status_code == 200
        assert server.stop() == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    access = [line for line in lines if line["logger"] == "accountant.access"]
    assert {"method": "GET", "path": "/v1/datasets", "status": 200}.items() <= access[-1].items()
    assert access[-1]["seconds"] >= 0 and access[-1]["bytes"] > 0
    assert ADMIN_KEY not in log.read_text() and "limit=5" not in log.read_text()
    assert not [line for line in lines if line["logger"].startswith("alembic")]
    assert lines[-1]["logger"] == "accountant.serve" and lines[-1]["message"].startswith("stopped")


def test_version_and_a_port_out_of_range(tmp_path: Path) -> None:
    version = subprocess.run([BIN, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("accountant, version ")
    refused = subprocess.run(
        [BIN, "serve", "--port", "99999"], env=_env(tmp_path), capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "99999 is not in the range 0<=x<=65535" in refused.stderr
    assert not [line for line in refused.stderr.splitlines() if line.startswith("{")]  # no log


@pytest.mark.parametrize(
    "command",
    [
        ["keys", "create", "--name", "aud", "--role", "auditor"],
        ["ledger", "verify"],
        ["ledger", "rebuild-totals", "--check"],
        ["noise-secret", "show"],
    ],
)
def test_a_folder_without_a_database_gets_one_line_and_nothing_created(
    tmp_path: Path, command: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    done = subprocess.run([BIN, *command], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "accountant init" in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []  # no ./var, no file


@pytest.mark.parametrize(
    ("url", "command", "says"),
    [
        ("notaurl", ["init"], "is not a database URL"),
        ("mysql://x@localhost/db", ["db", "upgrade"], "names mysql"),
        ("sqlite:///", ["init"], "names no SQLite file"),
        ("postgresql+psycopg2://u@localhost/db", ["ledger", "verify"], "psycopg2 driver"),
        ("postgresql+psycopg://u@127.0.0.1:1/db", ["init"], "could not be used"),
        ("postgresql+psycopg://u@127.0.0.1:1/db", ["db", "upgrade"], "could not be used"),
        ("{not_a_database}", ["init"], "file is not a database"),
        ("{cli_db}", ["db", "upgrade", "9999"], "Can't locate revision"),
        ("{behind}", ["ledger", "verify"], "behind this release's migrations"),
        ("{behind}", ["ledger", "rebuild-totals", "--check"], "behind this release's migrations"),
    ],
)
def test_a_database_the_command_cannot_use_is_one_line_saying_what_to_do(
    tmp_path: Path, url: str, command: list[str], says: str
) -> None:
    (tmp_path / "junk.db").write_text("not a database")
    url = url.format(
        not_a_database=f"sqlite:///{tmp_path / 'junk.db'}",
        cli_db=f"sqlite:///{tmp_path / 'cli.db'}",
        behind=f"sqlite:///{tmp_path / 'behind.db'}",
    )
    env = _env(tmp_path, ACCOUNTANT_DATABASE_URL=url)
    if "behind" in url:  # a schema one migration behind this release
        subprocess.run([BIN, "db", "upgrade", "0020"], env=env, check=True, capture_output=True)
    done = subprocess.run([BIN, *command], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1 and says in error[0], done.stderr
    assert "ACCOUNTANT_DATABASE_URL" in error[0] or "accountant db upgrade" in error[0]


def test_db_upgrade_says_what_it_did(tmp_path: Path) -> None:
    env = _env(tmp_path, ACCOUNTANT_DATABASE_URL=f"sqlite:///{tmp_path / 'up.db'}")

    def upgrade(*revision: str) -> str:
        done = subprocess.run(
            [BIN, "db", "upgrade", *revision], env=env, capture_output=True, text=True, check=True
        )
        return done.stderr.strip().splitlines()[-1]

    assert upgrade("0020") == "schema upgraded from none to 0020"
    head = head_revision()
    assert upgrade() == f"schema upgraded from 0020 to {head}"
    assert upgrade() == f"schema is up to date (at {head}): nothing to do"
    assert (
        upgrade("0019") == f"schema is at {head}, past 0019: nothing to do (going back is "
        "'accountant db downgrade')"
    )


def _serve_once(env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`accountant serve` that must refuse: a serve that starts is stopped after 30 s."""
    return subprocess.run(
        [BIN, "serve", "--port", "0", "--workers", "1"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_serve_in_an_empty_folder_names_init_in_one_line_and_creates_nothing(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    refused = _serve_once(env, cwd=tmp_path)
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "has no schema; run 'accountant init' first" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no ./var, no database file, no secret


def test_serve_refuses_a_schema_behind_and_after_db_upgrade_sets_itself_up(
    database_url: str, tmp_path: Path
) -> None:
    """No schema: one line naming 'accountant init'; behind this release: one line naming
    'accountant db upgrade'; neither creates a file. After 'accountant db upgrade', serve
    creates the key files, registers them and creates the ACCOUNTANT_ADMIN_KEY admin."""
    keys = tmp_path / "keys"
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(keys / "signing-key.pem"),
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
    }
    subprocess.run([BIN, "db", "downgrade", "base"], env=env, check=True, capture_output=True)
    empty = _serve_once(env)
    assert empty.returncode == 1
    assert [line for line in empty.stderr.splitlines() if line] == [
        f"Error: the database {_shown(database_url)} has no schema; run 'accountant init' "
        "first (it creates the schema and prints a first admin key)"
    ]
    subprocess.run([BIN, "db", "upgrade", "0015"], env=env, check=True, capture_output=True)
    behind = _serve_once(env)
    assert behind.returncode == 1
    assert [line for line in behind.stderr.splitlines() if line] == [
        f"Error: the database is at migration 0015 and this release needs {head_revision()}; "
        "run 'accountant db upgrade' first"
    ]
    assert not keys.exists()
    subprocess.run([BIN, "db", "upgrade"], env=env, check=True, capture_output=True)
    with running_service(env, tmp_path / "serve.log", "--workers", "1") as server:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        me = requests.get(f"{server.base}/v1/consumers/me", headers=headers, timeout=5)
        assert me.status_code == 200 and me.json()["name"] == "admin"
        created = requests.post(
            f"{server.base}/v1/datasets",
            headers=headers,
            timeout=5,
            json={"name": "web", "privacy_unit": "record", "budget": {"epsilon": 1}},
        )
        assert created.status_code == 201
        assert server.stop() == 0
    assert sorted(p.name for p in keys.iterdir()) == [
        "key-hash-secret",
        "noise-secret",
        "signing-key.pem",
    ]


def _shown(database_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url).render_as_string(hide_password=True)


def test_an_app_whose_database_lost_its_schema_names_db_upgrade_not_a_retry(
    database_url: str, signing_key_file: str
) -> None:
    """The WSGI app run without 'accountant serve' on a database without the schema: each
    call is a 503 naming 'accountant db upgrade', not advice to retry."""
    from accountant.app import prepared_app
    from accountant.migrate import downgrade
    from tests.conftest import Api

    settings = {"database_url": database_url, "admin_key": ADMIN_KEY}
    app = prepared_app({**settings, "signing_key_file": signing_key_file})
    api = Api(app.test_client())
    assert api.get("/v1/datasets").status_code == 200
    downgrade(database_url, "base")
    charge = {"dataset": "web", "mechanism": "laplace", "params": {"epsilon": 0.1}}
    for answer in (api.get("/v1/datasets"), api.post("/v1/charges", charge)):
        assert answer.status_code == 503
        assert answer.content_type == "application/problem+json"
        assert "run 'accountant db upgrade'" in answer.get_json()["detail"]
        assert "Idempotency-Key" not in answer.get_json()["detail"]


def test_serve_after_db_upgrade_alone_says_how_to_make_the_first_admin(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")}
    subprocess.run([BIN, "db", "upgrade"], env=env, cwd=tmp_path, check=True, capture_output=True)
    log = tmp_path / "serve.log"
    with running_service(env, log, "--workers", "1", cwd=tmp_path) as server:
        assert requests.get(f"{server.base}/readyz", timeout=5).status_code == 200
        assert server.stop() == 0
    said = [json.loads(line) for line in log.read_text().splitlines()]
    warned = [line for line in said if line["message"].startswith("no admin yet")]
    assert [(line["logger"], line["message"]) for line in warned] == [
        (
            "accountant.serve",
            "no admin yet: set ACCOUNTANT_ADMIN_KEY and restart, or run "
            "'accountant keys create --name NAME --role admin'",
        )
    ]
    made = {p.name for p in (tmp_path / "var").iterdir()}
    assert {"key-hash-secret", "noise-secret", "signing-key.pem"} <= made
