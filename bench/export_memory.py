"""The export's memory does not grow with the ledger: the peak Python memory (tracemalloc) of
streaming the whole JSON Lines export of 10^4 and of 10^5 ledger entries, on SQLite, in one
run. The export is read 1000 entries at a time, each page forgotten after it is sent.

    python bench/export_memory.py [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import _setup


def fill(client: object, entries: int) -> None:
    """``entries`` chained ledger entries, written by the ledger's own append."""
    from accountant.db import begin_write
    from accountant.driver import Driver
    from accountant.exact import Amount
    from accountant.services import datasets, ledger

    sessions = client.application.extensions["accountant"].sessions  # type: ignore[attr-defined]
    hasher = client.application.extensions["accountant"].key_hasher  # type: ignore[attr-defined]
    with sessions() as session:
        begin_write(session)
        dataset = datasets.find(session, "bench", lock=True)
        for index in range(entries):
            ledger.append(
                Driver.of(session),
                dataset,
                None,
                kind="charge",
                status="granted",
                created_at=1_795_000_000_000_000 + index,
                charge_id=f"c-{index:07d}",
                mechanism="laplace",
                release="joint",
                partitions=[f"p{index % 97}"],
                cost=Amount(epsilon=1_000_000),
                hasher=hasher,
            )
            if index % 20_000 == 19_999:
                print(f"  wrote {index + 1} entries", file=sys.stderr, flush=True)
        session.commit()


def measure(folder: Path, entries: int) -> tuple[int, float, int]:
    """(peak bytes while streaming, seconds, lines) of one export of ``entries`` entries."""
    client, _url = _setup.service(folder, f"export-{entries}")
    fill(client, entries)
    tracemalloc.start()
    started = time.perf_counter()
    response = client.get("/v1/ledger/export?format=jsonl", headers=_setup.HEADERS, buffered=False)
    lines = sum(chunk.count(b"\n") for chunk in response.response)
    response.close()
    elapsed = time.perf_counter() - started
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, elapsed, lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        default="10000,100000",
        help="comma-separated ledger sizes to export (default 10000,100000)",
    )
    sizes = [int(size) for size in parser.parse_args().sizes.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        results = []
        for entries in sizes:
            print(f"filling and exporting {entries} entries ...", file=sys.stderr, flush=True)
            results.append((entries, *measure(Path(folder), entries)))
    base = results[0][1]
    print("entries    lines   peak MiB  vs first   seconds")
    for entries, peak, elapsed, lines in results:
        print(f"{entries:>7} {lines:>8} {peak / 2**20:>10.2f} {peak / base:>9.2f} {elapsed:>9.1f}")


if __name__ == "__main__":
    main()
