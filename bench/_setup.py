"""What the in-process benchmarks share: a migrated SQLite service with one big dataset, and
one timed charge."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

ADMIN_KEY = "bench-admin-key-" + "b" * 32
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def service(folder: Path, name: str = "bench", url: str | None = None) -> tuple[Any, str]:
    """(test client, database URL) of a fresh service with dataset "bench" (record unit), on
    ``url`` (an empty database) or a new SQLite file in ``folder``."""
    from accountant.app import prepared_app
    from accountant.migrate import upgrade

    url = url or f"sqlite:///{folder / name}.db"
    upgrade(url)
    app = prepared_app(
        {
            "database_url": url,
            "admin_key": ADMIN_KEY,
            "log_level": "WARNING",
            "signing_key_file": str(folder / "key.pem"),
        }
    )
    client = app.test_client()
    client.post(
        "/v1/datasets",
        headers=HEADERS,
        json={
            "name": "bench",
            "privacy_unit": "record",
            "accounting": "pure",
            "budget": {"epsilon": 1000000},
        },
    )
    return client, url


def timed_charge(client: Any, index: int, partitions: int = 30) -> float:
    """Seconds one granted charge of epsilon 0.01 on partition index % partitions takes."""
    body = {
        "dataset": "bench",
        "partitions": [f"p{index % partitions}"],
        "mechanism": "laplace",
        "params": {"epsilon": 0.01, "sensitivity": 1},
        "input": {"values": [42.0]},
    }
    started = time.perf_counter()
    response = client.post("/v1/charges", headers=HEADERS, json=body)
    elapsed = time.perf_counter() - started
    assert response.status_code == 201, response.get_data(as_text=True)
    return elapsed
