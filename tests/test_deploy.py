"""deploy/: the YAML parses, names agree with the service's settings, and the package installs
and runs the way the Dockerfile installs and runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from accountant.config import PREFIX, Settings, load_settings

DEPLOY = Path(__file__).parent.parent / "deploy"
SETTINGS = {PREFIX + f.name.upper() for f in fields(Settings)}


def _load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_every_manifest_parses_and_uses_known_settings() -> None:
    documents = {p.name: _load_all(p) for p in sorted((DEPLOY / "k8s").glob("*.yaml"))}
    assert set(documents) == {
        "configmap.yaml",
        "secret.yaml",
        "migrate-job.yaml",
        "deployment.yaml",
        "service.yaml",
    }
    text = "\n".join(p.read_text() for p in DEPLOY.rglob("*.y*ml"))
    used = set(re.findall(r"\bACCOUNTANT_[A-Z_]+\b", text))
    assert used and used <= SETTINGS, used - SETTINGS


def test_the_deployment_probes_and_secrets_fit_together() -> None:
    deployment = _load_all(DEPLOY / "k8s" / "deployment.yaml")[0]
    secret = _load_all(DEPLOY / "k8s" / "secret.yaml")[0]
    config = _load_all(DEPLOY / "k8s" / "configmap.yaml")[0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    wanted = {e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"]}
    wanted |= {i["key"] for v in pod["volumes"] if "secret" in v for i in v["secret"]["items"]}
    assert wanted <= set(secret["stringData"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "signing-key")
    assert config["data"]["ACCOUNTANT_SIGNING_KEY_FILE"].startswith(mount["mountPath"] + "/")
    # every pod reads the same three secret files from the read-only mount: the noise and
    # key-hash secrets default to the signing key's folder, where no pod could create them
    settings = load_settings(
        {
            "signing_key_file": config["data"]["ACCOUNTANT_SIGNING_KEY_FILE"],
            "database_url": "postgresql+psycopg://accountant@db/accountant",
        }
    )
    items = next(v for v in pod["volumes"] if v["name"] == "signing-key")["secret"]["items"]
    mounted = {f"{mount['mountPath']}/{item['path']}" for item in items}
    assert {
        settings.signing_key_file,
        settings.noise_secret_file,
        settings.key_hash_secret_file,
    } <= mounted
    service = _load_all(DEPLOY / "k8s" / "service.yaml")[0]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    job = _load_all(DEPLOY / "k8s" / "migrate-job.yaml")[0]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "accountant",
        "db",
        "upgrade",
    ]


def test_compose_runs_migrations_once_before_the_service() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["migrate"]["command"] == ["accountant", "db", "upgrade"]
    assert (
        services["accountant"]["depends_on"]["migrate"]["condition"]
        == "service_completed_successfully"
    )
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, (name, dependency)
        for secret in service.get("secrets", []):
            assert secret in compose["secrets"]
    url = services["migrate"]["environment"]["ACCOUNTANT_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://") and "@postgres:5432/" in url


def test_the_dockerfile_runs_as_a_non_root_user_without_build_tools() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    assert len(stages) == 2 and "slim" in stages[1].splitlines()[0]
    final = stages[1]
    assert "USER accountant" in final and "COPY --from=build /opt/venv /opt/venv" in final
    assert not re.search(r"apt-get|gcc|build-essential", final)
    assert '"accountant", "serve"' in final


@pytest.mark.slow
def test_the_package_installs_and_runs_as_the_dockerfile_installs_it(tmp_path: Path) -> None:
    """pip install of the source tree (not editable), then the commands the images run."""
    target = tmp_path / "site"
    root = DEPLOY.parent
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(root),
        ],
        check=True,
        capture_output=True,
    )
    installed = {p.relative_to(target).as_posix() for p in target.rglob("*")}
    for needed in (
        "accountant_migrations/env.py",
        "accountant_migrations/script.py.mako",
        "accountant_migrations/versions/0001_initial_schema.py",
        "accountant_plugins/laplace.py",
        "accountant/dashboard/templates/overview.html",
        "accountant/dashboard/static/style.css",
    ):
        assert needed in installed, needed
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ACCOUNTANT_")},
        "PYTHONPATH": str(target),
    }
    run = [
        sys.executable,
        "-c",
        "import sys; from accountant.cli import main; "
        "import accountant; assert accountant.__file__.startswith(sys.argv[1]); "
        "sys.argv = ['accountant'] + sys.argv[2:]; main()",
        str(target),
    ]
    subprocess.run([*run, "db", "upgrade"], env=env, cwd=work, check=True, capture_output=True)
    listed = subprocess.run(
        [*run, "plugins", "list"], env=env, cwd=work, capture_output=True, text=True
    )
    assert "laplace" in listed.stdout and "discrete_gaussian" in listed.stdout
