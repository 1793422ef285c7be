"""Schemathesis against a live server: no 5xx, every response as the OpenAPI document says."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.conftest import ADMIN_KEY
from tests.server import running_service

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_schemathesis_finds_nothing(
    database_url: str, signing_key_file: str, tmp_path: Path
) -> None:
    assert shutil.which("schemathesis", path=str(BIN)), "install the test extras"
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "ERROR",
    }
    with running_service(env, tmp_path / "serve.log") as server:
        base = server.base
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        requests.post(
            f"{base}/v1/datasets",
            headers=headers,
            timeout=5,
            json={"name": "clicks", "privacy_unit": "record", "budget": {"epsilon": 5}},
        )
        run = subprocess.run(
            [
                BIN / "schemathesis",
                "run",
                f"{base}/openapi.json",
                "-H",
                f"Authorization: Bearer {ADMIN_KEY}",
                "--checks",
                "all",
                # Semantic 400s (an unknown mechanism, a partition key '*') are correct answers
                # to schema-valid input, so the "positive data must be accepted" check is off.
                "--exclude-checks",
                "positive_data_acceptance",
                "--max-examples",
                "25",
                "--seed",
                "20261121",
                "--no-color",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    summary = run.stdout[-3000:]
    assert run.returncode == 0, summary
    assert re.search(r"\d+ generated", summary), summary
    print(summary)  # the figures: operations, examples generated, failures
