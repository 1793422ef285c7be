"""Latency of one charge on SQLite, next to a raw sqlite3 transaction doing the same writes.

Both sides use the same file settings (WAL, synchronous=FULL) and write the
same rows per charge: the dataset row (ledger head), s(p) of the charged
partition in two scopes (lifetime and consumer), both scope rows, and one
ledger entry. The service side goes through the whole WSGI stack in process
(authentication, validation, pricing, the charge transaction, the mechanism).

    python bench/charge_latency.py [--charges 3000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _setup


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def service_latencies(folder: Path, charges: int) -> list[float]:
    client, _ = _setup.service(folder)
    samples = []
    for index in range(charges):
        samples.append(_setup.timed_charge(client, index))
        if index % 500 == 0:
            print(f"  service: {index}/{charges}", file=sys.stderr)
    return samples


def raw_latencies(folder: Path, charges: int) -> list[float]:
    connection = sqlite3.connect(folder / "raw.db", isolation_level=None)
    connection.executescript("""
        PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
        CREATE TABLE datasets (id INTEGER PRIMARY KEY, seq INTEGER, head TEXT);
        CREATE TABLE tallies (id INTEGER PRIMARY KEY, total INTEGER, max INTEGER);
        CREATE TABLE spends (tally_id INTEGER, partition_id INTEGER, epsilon INTEGER,
                             PRIMARY KEY (tally_id, partition_id));
        CREATE INDEX spends_eps ON spends (tally_id, epsilon);
        CREATE TABLE ledger (id INTEGER PRIMARY KEY, seq INTEGER, body TEXT, hash TEXT);
        INSERT INTO datasets VALUES (1, 0, '');
        INSERT INTO tallies VALUES (1, 0, 0), (2, 0, 0);
    """)
    samples = []
    head = ""
    for index in range(charges):
        started = time.perf_counter()
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("SELECT seq, head FROM datasets WHERE id = 1").fetchone()
        connection.execute(
            "INSERT INTO spends SELECT id, ?, 10000000 FROM tallies WHERE id IN (1, 2) "
            "ON CONFLICT (tally_id, partition_id) DO UPDATE SET epsilon = epsilon + 10000000",
            (index % 30,),
        )
        connection.executemany(
            "UPDATE tallies SET total = total + 10000000 WHERE id = ?", [(1,), (2,)]
        )
        body = json.dumps({"seq": index, "cost": 10000000})
        head = hashlib.sha256((head + body).encode()).hexdigest()
        connection.execute(
            "INSERT INTO ledger (seq, body, hash) VALUES (?, ?, ?)", (index, body, head)
        )
        connection.execute("UPDATE datasets SET seq = ?, head = ? WHERE id = 1", (index, head))
        connection.execute("COMMIT")
        samples.append(time.perf_counter() - started)
    connection.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        raw = raw_latencies(Path(folder), args.charges)
        service = service_latencies(Path(folder), args.charges)
    rows = [("raw sqlite3 transaction", raw), ("service charge (in-process WSGI)", service)]
    print(f"{'':36} {'median ms':>10} {'p99 ms':>10} {'charges/s':>10}")
    for label, samples in rows:
        median = statistics.median(samples) * 1000
        print(
            f"{label:36} {median:10.3f} {percentile(samples, 0.99) * 1000:10.3f} "
            f"{len(samples) / sum(samples):10.0f}"
        )
    print(
        f"ratio service/raw: median {statistics.median(service) / statistics.median(raw):.2f}x,"
        f" p99 {percentile(service, 0.99) / percentile(raw, 0.99):.2f}x"
    )


if __name__ == "__main__":
    main()
