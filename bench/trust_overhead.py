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
from pathlib import Path
from typing import Any

import _setup


def run(folder: Path, charges: int) -> list[float]:
    client, _ = _setup.service(folder)
    return [_setup.timed_charge(client, index) for index in range(charges)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=2000)
    args = parser.parse_args()
    from accountant.services import ledger, receipts

    real_hash, real_receipt = ledger.chain_hash, receipts.receipt
    results = {}
    for label in ("with hashing and signing", "without (constants)", "with (again)"):
        stripped = label.startswith("without")
        ledger.chain_hash = (lambda _prev, _content: "0" * 64) if stripped else real_hash  # type: ignore[assignment]
        fake: Any = lambda *a, **k: "unsigned"  # noqa: E731
        receipts.receipt = fake if stripped else real_receipt  # type: ignore[assignment]
        with tempfile.TemporaryDirectory() as folder:
            print(f"  {label} ...", file=sys.stderr)
            results[label] = run(Path(folder), args.charges)
    for label, samples in results.items():
        print(f"{label:28} median {statistics.median(samples) * 1000:.3f} ms")
    with_trust = statistics.median(results["with hashing and signing"] + results["with (again)"])
    without = statistics.median(results["without (constants)"])
    print(
        f"overhead: {(with_trust - without) * 1000:.3f} ms per charge "
        f"({(with_trust / without - 1) * 100:.1f} %)"
    )


if __name__ == "__main__":
    main()
