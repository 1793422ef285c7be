"""What the ledger hash chain and the signed receipt add to one charge, measured in one run.

Runs the same in-process charges twice on fresh SQLite files: once as shipped, once with
the chain hash and the receipt signature replaced by constants, and prints both medians.

    python bench/trust_overhead.py [--charges 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ADMIN_KEY = "bench-admin-key-" + "b" * 32


def run(folder: Path, charges: int) -> list[float]:
    from accountant.app import create_app
    from accountant.migrate import upgrade

    url = f"sqlite:///{folder / 'bench.db'}"
    upgrade(url)
    app = create_app({"database_url": url, "admin_key": ADMIN_KEY, "log_level": "WARNING",
                      "signing_key_file": str(folder / "key.pem")})
    client = app.test_client()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    client.post("/v1/datasets", headers=headers, json={
        "name": "bench", "privacy_unit": "record", "accounting": "pure",
        "budget": {"epsilon": 1000000}})
    samples = []
    for index in range(charges):
        body = {"dataset": "bench", "partitions": [f"p{index % 30}"], "mechanism": "laplace",
                "params": {"epsilon": 0.01, "sensitivity": 1}, "input": {"values": [42.0]}}
        started = time.perf_counter()
        response = client.post("/v1/charges", headers=headers, json=body)
        samples.append(time.perf_counter() - started)
        assert response.status_code == 201
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=2000)
    args = parser.parse_args()
    from accountant.api import charges as charges_api
    from accountant.services import ledger, receipts

    real_hash, real_receipt = ledger.chain_hash, receipts.receipt
    results = {}
    for label in ("with hashing and signing", "without (constants)", "with (again)"):
        stripped = label.startswith("without")
        ledger.chain_hash = (lambda prev, content: "0" * 64) if stripped else real_hash  # type: ignore[assignment]
        fake: Any = lambda *a, **k: "unsigned"  # noqa: E731
        receipts.receipt = fake if stripped else real_receipt  # type: ignore[assignment]
        charges_api.receipts.receipt = receipts.receipt  # type: ignore[attr-defined]
        with tempfile.TemporaryDirectory() as folder:
            print(f"  {label} ...", file=sys.stderr)
            results[label] = run(Path(folder), args.charges)
    for label, samples in results.items():
        print(f"{label:28} median {statistics.median(samples) * 1000:.3f} ms")
    with_trust = statistics.median(results["with hashing and signing"] + results["with (again)"])
    without = statistics.median(results["without (constants)"])
    print(f"overhead: {(with_trust - without) * 1000:.3f} ms per charge "
          f"({(with_trust / without - 1) * 100:.1f} %)")


if __name__ == "__main__":
    main()
