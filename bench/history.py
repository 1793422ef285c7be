"""History must not slow the hot path: charge latency on an empty database against one with
10^6 ledger entries and 10^5 partitions (with spends in every scope), measured in one run,
on SQLite or, with --postgres-url, on two new databases of that PostgreSQL server.

    python bench/history.py [--entries 1000000] [--partitions 100000] [--charges 1500]
                            [--postgres-url postgresql+psycopg://postgres@127.0.0.1/postgres]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import _setup
from charges import _postgres_database, dropped_afterwards


def make_app(folder: Path, name: str, url: str | None) -> tuple[Any, str]:
    client, path = _setup.service(folder, name, url)
    client.post(
        "/v1/datasets/bench/partitions",
        headers=_setup.HEADERS,
        json={"keys": [f"p{i}" for i in range(100)]},
    )
    return client, path


def fill(app: Any, entries: int, partitions: int) -> None:
    """History written straight into the tables, as years of charges would leave it."""
    from sqlalchemy import text

    engine = app.extensions["accountant"].engine
    with engine.begin() as db:
        db.execute(
            text("INSERT INTO partitions (dataset_id, key, created_at) VALUES (1, :k, 0)"),
            [{"k": f"old-{i}"} for i in range(partitions)],
        )
        db.execute(
            text(
                "INSERT INTO tallies (dataset_id, kind, consumer_id, period_seconds, "
                "window_start, total_epsilon, total_delta, total_rho, max_epsilon, "
                "max_delta, max_rho) VALUES (1, 'consumer', 1, 0, 0, 0, 0, 0, 0, 0, 0)"
            )
        )
        ids = db.execute(text("SELECT id FROM partitions")).scalars().all()
        for tally in db.execute(text("SELECT id FROM tallies")).scalars().all():
            db.execute(
                text(
                    "INSERT INTO tally_spends (tally_id, partition_id, epsilon, delta, rho) "
                    "VALUES (:t, :p, :e, 0, 0) ON CONFLICT DO NOTHING"
                ),
                [{"t": tally, "p": pid, "e": random.randrange(10**9)} for pid in ids],
            )
        for start in range(0, entries, 100_000):
            db.execute(
                text(
                    "INSERT INTO ledger_entries (seq, kind, charge_id, dataset_id, consumer_id, "
                    "status, mechanism, release, partitions, params, cost_epsilon, cost_delta, "
                    "cost_rho, multiplicity, detail, created_at, prev_hash, hash) VALUES "
                    "(:seq, 'charge', :id, 1, 1, 'granted', 'laplace', 'joint', '[\"old\"]', "
                    "'{}', 1000, 0, 0, 1, '{}', :t, '', '')"
                ),
                [
                    {"seq": start + i + 1000, "id": f"old-{start + i}", "t": start + i}
                    for i in range(min(100_000, entries - start))
                ],
            )
            print(f"    {start + 100_000} entries ...", file=sys.stderr)
        db.execute(text("UPDATE datasets SET ledger_seq = ledger_seq + :n"), {"n": entries + 1000})
    if engine.dialect.name == "postgresql":
        with engine.connect() as db:
            db.execute(text("ANALYZE"))  # as autovacuum would after such a load
            db.commit()


def charge(client: Any, index: int) -> float:
    return _setup.timed_charge(client, index, partitions=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--charges", type=int, default=1500)
    parser.add_argument("--postgres-url", default=os.environ.get("ACCOUNTANT_BENCH_POSTGRES_URL"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name, dropped_afterwards(args.postgres_url):
        folder = Path(name)
        url = args.postgres_url
        empty, _ = make_app(folder, "empty", url and _postgres_database(url, "empty"))
        full, _ = make_app(folder, "full", url and _postgres_database(url, "full"))
        print(
            f"  writing {args.entries} ledger entries, {args.partitions} partitions ...",
            file=sys.stderr,
        )
        fill(full.application, args.entries, args.partitions)
        samples: dict[str, list[float]] = {"empty": [], "history": []}
        for index in range(args.charges):  # interleaved, so both see the same machine
            samples["empty"].append(charge(empty, index))
            samples["history"].append(charge(full, index))
        for label, values in samples.items():
            print(
                f"{label:8} median {statistics.median(values) * 1000:.3f} ms, "
                f"p99 {sorted(values)[int(0.99 * len(values))] * 1000:.3f} ms"
            )
        ratio = statistics.median(samples["history"]) / statistics.median(samples["empty"])
        print(f"history/empty median ratio: {ratio:.2f} (goal: at most 1.3)")


if __name__ == "__main__":
    main()
