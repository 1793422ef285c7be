"""/openapi.json is enough to generate a working client: openapi-python-client (test-only)
turns it into a package with no warning, and that package charges a real service and reads
a denial as a typed Problem."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import ADMIN_KEY

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _generate(base: str, folder: Path) -> tuple[Any, str]:
    document = folder / "openapi.json"
    document.write_bytes(requests.get(f"{base}/openapi.json", timeout=10).content)
    package = folder / "generated_accountant"
    run = subprocess.run(
        [
            BIN / "openapi-python-client",
            "generate",
            "--path",
            str(document),
            "--output-path",
            str(package),
            "--meta",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"},
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    sys.path.insert(0, str(folder))
    return importlib.import_module("generated_accountant"), output


def test_a_generated_client_charges_and_reads_a_denial(server: str, tmp_path: Path) -> None:
    generated, output = _generate(server, tmp_path)
    assert "Unable to process schema" not in output and "WARNING" not in output, output
    try:
        from generated_accountant.api.charges import create_charge
        from generated_accountant.api.datasets import create_dataset
        from generated_accountant.models import (
            Charge,
            CreateChargeBody,
            CreateDatasetBody,
            Problem,
        )

        with generated.AuthenticatedClient(base_url=server, token=ADMIN_KEY) as client:
            made = create_dataset.sync_detailed(
                client=client,
                body=CreateDatasetBody.from_dict(
                    {
                        "name": "clicks",
                        "privacy_unit": "record",
                        "accounting": "pure",
                        "budget": {"epsilon": 0.5},
                    }
                ),
            )
            assert made.status_code == 201 and made.parsed.name == "clicks"
            body = CreateChargeBody.from_dict(
                {
                    "dataset": "clicks",
                    "partitions": ["a"],
                    "mechanism": "laplace",
                    "params": {"epsilon": 0.5, "sensitivity": 1},
                    "input": {"values": [3.0]},
                }
            )
            granted = create_charge.sync_detailed(client=client, body=body, idempotency_key="k-1")
            assert granted.status_code == 201 and isinstance(granted.parsed, Charge)
            assert granted.parsed.cost["epsilon"] == 0.5
            assert len(granted.parsed.output["values"]) == 1
            replayed = create_charge.sync_detailed(client=client, body=body, idempotency_key="k-1")
            assert replayed.parsed.charge_id == granted.parsed.charge_id
            denied = create_charge.sync_detailed(client=client, body=body, idempotency_key="k-2")
            assert denied.status_code == 409 and isinstance(denied.parsed, Problem)
            assert denied.parsed.scope == "dataset"
            assert denied.parsed.limit["epsilon"] == 0.5
            assert denied.parsed.spent["epsilon"] == 0.5
            assert denied.parsed.requested["epsilon"] == 0.5
            invalid = create_charge.sync_detailed(
                client=client,
                body=CreateChargeBody.from_dict(
                    {**body.to_dict(), "params": {"epsilon": 0.5, "sensitivity": 0}}
                ),
            )
            assert invalid.status_code == 400
            assert [e.field for e in invalid.parsed.errors] == ["params.sensitivity"]
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("generated_accountant")]:
            del sys.modules[name]
