"""Dashboard render times with 10^5 charges and 10^4 partitions, and the export's memory.

python bench/dashboard.py [--entries 100000] [--partitions 10000]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ADMIN_KEY = "bench-admin-key-" + "b" * 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=10_000)
    args = parser.parse_args()
    from sqlalchemy import insert, select

    from accountant.app import prepared_app
    from accountant.db import begin_write
    from accountant.driver import Driver
    from accountant.exact import Amount
    from accountant.migrate import upgrade
    from accountant.models import Partition, Tally, TallySpend
    from accountant.services import datasets, ledger

    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'bench.db'}"
        upgrade(url)
        app = prepared_app(
            {
                "database_url": url,
                "admin_key": ADMIN_KEY,
                "log_level": "WARNING",
                "signing_key_file": str(Path(folder) / "key.pem"),
            }
        )
        client = app.test_client()
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        client.post(
            "/v1/datasets",
            headers=headers,
            json={"name": "big", "privacy_unit": "record", "budget": {"epsilon": 1000000}},
        )
        print(
            f"  writing {args.entries} ledger entries, {args.partitions} partitions ...",
            file=sys.stderr,
        )
        hasher = app.extensions["accountant"].key_hasher
        with app.extensions["accountant"].sessions() as session:
            begin_write(session)
            dataset = datasets.find(session, "big", lock=True)
            session.execute(
                insert(Partition),
                [
                    {"dataset_id": dataset.id, "key": f"p{i}", "created_at": 0}
                    for i in range(args.partitions)
                ],
            )
            lifetime = session.execute(
                select(Tally.id).where(Tally.dataset_id == dataset.id)
            ).scalar_one()
            ids = (
                session.execute(select(Partition.id).where(Partition.dataset_id == dataset.id))
                .scalars()
                .all()
            )
            session.execute(
                insert(TallySpend),
                [
                    {
                        "tally_id": lifetime,
                        "partition_id": pid,
                        "epsilon": (i % 997) * 10**6,
                        "delta": 0,
                        "rho": 0,
                    }
                    for i, pid in enumerate(ids)
                ],
            )
            start = time.time_ns() // 1000 - 29 * 86_400 * 10**6
            for index in range(args.entries):
                ledger.append(
                    Driver.of(session),
                    dataset,
                    None,
                    kind="charge",
                    status="denied" if index % 10 == 0 else "granted",
                    created_at=start + index * (29 * 86_400 * 10**6 // args.entries),
                    charge_id=f"c{index}",
                    mechanism="laplace",
                    release="joint",
                    partitions=[f"p{index % args.partitions}"],
                    cost=Amount(epsilon=10**6),
                    hasher=hasher,
                )
                if index % 20_000 == 0:
                    session.flush()
                    print(f"    {index} ...", file=sys.stderr)
            session.commit()
        page = client.get("/dashboard/sign-in").get_data(as_text=True)
        token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
        client.post("/dashboard/sign-in", data={"api_key": ADMIN_KEY, "csrf": token})
        print(f"{'page':28} {'median ms':>10} {'bytes':>9}")
        for path in (
            "/dashboard",
            "/dashboard/datasets/big",
            "/dashboard/ledger",
            "/dashboard/ledger?dataset=big&status=denied",
            "/dashboard/mechanisms",
        ):
            times, size = [], 0
            for _ in range(5):
                started = time.perf_counter()
                response = client.get(path)
                times.append(time.perf_counter() - started)
                size = len(response.get_data())
                assert response.status_code == 200, path
            print(f"{path:28} {statistics.median(times) * 1000:10.1f} {size:9}")
        for kind in ("jsonl", "csv"):
            tracemalloc.start()
            started = time.perf_counter()
            response = client.get(
                f"/v1/ledger/export?format={kind}", headers=headers, buffered=False
            )
            total = sum(len(chunk) for chunk in response.response)  # type: ignore[union-attr]
            elapsed = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            print(
                f"export {kind}: {args.entries} entries, {total / 1e6:.1f} MB streamed in "
                f"{elapsed:.1f} s, peak Python memory {peak / 1e6:.1f} MB"
            )


if __name__ == "__main__":
    main()
