"""A day's traffic for a bounded time: many datasets, many consumers, a few hot partitions.

Starts `accountant serve`, registers 12 datasets (every privacy unit and accounting mode,
with partition, window and quota limits) and 8 service consumers, then lets concurrent
clients charge for --seconds. Afterwards it checks that no scope ended above its limit,
the ledger chains verify, the totals equal the ledger, and no request got a 5xx.

    python bench/load_profile.py [--seconds 60] [--clients 6] [--postgres-url URL]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from charges import ADMIN_KEY, BIN, _postgres_database, dropped_afterwards, free_port, wait_ready

UNITS = [("record", None), ("user", 3), ("partition", None)]
MODES = [
    ("pure", {"epsilon": 3}),
    ("approx", {"epsilon": 3, "delta": 1e-5}),
    ("zcdp", {"epsilon": 3, "delta": 1e-6}),
    ("approx", {"epsilon": 2, "delta": 1e-6}),
]


def call(port: int, method: str, path: str, body: Any, key: str) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request(
        method,
        path,
        body=None if body is None else json.dumps(body),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    response = connection.getresponse()
    data = response.read()
    return response.status, json.loads(data) if data else None


def setup(port: int) -> list[tuple[str, str, str]]:
    """Datasets and consumers; returns (consumer key, dataset, accounting) pairs to charge."""
    names = []
    for index in range(12):
        unit, k = UNITS[index % 3]
        mode, budget = MODES[index % 4]
        body: dict[str, Any] = {
            "name": f"ds{index}",
            "privacy_unit": unit,
            "accounting": mode,
            "budget": budget,
            "partition_budget": {"epsilon": 1.2},
            "windows": [{"period": "1h", "epsilon": 2.5}],
        }
        if k:
            body["max_partitions_per_user"] = k
        status, reply = call(port, "POST", "/v1/datasets", body, ADMIN_KEY)
        assert status == 201, reply
        names.append((body["name"], mode))
    pairs = []
    for index in range(8):
        granted = [name for name, _ in names[index % 3 :: 3]]
        status, reply = call(
            port,
            "POST",
            "/v1/consumers",
            {
                "name": f"team{index}",
                "role": "service",
                "datasets": granted,
                "quotas": {granted[0]: {"epsilon": 1.5}},
            },
            ADMIN_KEY,
        )
        assert status == 201, reply
        pairs += [(reply["api_key"], name, mode) for name, mode in names if name in granted]
    return pairs


def client(
    port: int, pairs: list[tuple[str, str, str]], deadline: float, seed: int, out: Any
) -> None:
    rng = random.Random(seed)
    statuses: dict[int, int] = {}
    while time.monotonic() < deadline:
        key, dataset, mode = rng.choice(pairs)
        hot = rng.random() < 0.7
        keys = (
            [f"h{rng.randrange(3)}"]
            if hot
            else rng.sample([f"d{i}" for i in range(200)], rng.randint(1, 4))
        )
        release = rng.choice(["joint", "parallel"])
        if mode == "zcdp":
            mechanism, params = "gaussian", {"sigma": 20, "sensitivity": 1}
        elif mode == "approx" and rng.random() < 0.5:
            mechanism, params = "gaussian", {"epsilon": 0.05, "delta": 1e-7, "sensitivity": 1}
        else:
            mechanism, params = "laplace", {"epsilon": 0.05, "sensitivity": 1}
        body = {
            "dataset": dataset,
            "partitions": keys,
            "release": release,
            "mechanism": mechanism,
            "params": params,
            "input": {"values": [1.0] * (len(keys) if release == "parallel" else 1)},
        }
        status, _ = call(port, "POST", "/v1/charges", body, key)
        statuses[status] = statuses.get(status, 0) + 1
    out.put(statuses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--postgres-url", default=os.environ.get("ACCOUNTANT_BENCH_POSTGRES_URL"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, dropped_afterwards(args.postgres_url):
        url = (
            _postgres_database(args.postgres_url, "load")
            if args.postgres_url
            else f"sqlite:///{folder}/load.db"
        )
        env = {
            **os.environ,
            "ACCOUNTANT_DATABASE_URL": url,
            "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
            "ACCOUNTANT_LOG_LEVEL": "ERROR",
            "ACCOUNTANT_SIGNING_KEY_FILE": f"{folder}/key.pem",
        }
        subprocess.run(
            [BIN / "accountant", "db", "upgrade"], env=env, check=True, capture_output=True
        )
        port = free_port()
        server = subprocess.Popen(
            [str(BIN / "accountant"), "serve", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_ready(port, "/readyz")
            pairs = setup(port)
            print(
                f"  {args.clients} clients for {args.seconds} s on {url.split(':')[0]} ...",
                file=sys.stderr,
            )
            context = multiprocessing.get_context("spawn")
            out = context.Queue()
            deadline = time.monotonic() + args.seconds
            procs = [
                context.Process(target=client, args=(port, pairs, deadline, n, out))
                for n in range(args.clients)
            ]
            for proc in procs:
                proc.start()
            statuses: dict[int, int] = {}
            for _ in procs:
                for status, count in out.get(timeout=args.seconds + 120).items():
                    statuses[status] = statuses.get(status, 0) + count
            for proc in procs:
                proc.join()
            overspent = check(port)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        rebuilt = subprocess.run(
            [BIN / "accountant", "ledger", "rebuild-totals", "--check"],
            env=env,
            capture_output=True,
            text=True,
        )
    total = sum(statuses.values())
    errors = sum(count for status, count in statuses.items() if status >= 500)
    print(f"requests {total} ({total / args.seconds:.0f}/s): {dict(sorted(statuses.items()))}")
    print(
        f"5xx: {errors}; scopes above their limit: {overspent}; "
        f"totals equal the ledger: {rebuilt.returncode == 0}"
    )
    if errors or overspent or rebuilt.returncode:
        sys.exit(1)


def check(port: int) -> int:
    """Count scopes above their limit, from the API's own reports."""
    over = 0
    _, listing = call(port, "GET", "/v1/datasets", None, ADMIN_KEY)
    for dataset in listing["datasets"]:
        _, report = call(port, "GET", f"/v1/datasets/{dataset['name']}/budget", None, ADMIN_KEY)
        measure = "rho" if dataset["accounting"] == "zcdp" else "epsilon"
        scopes = [(report["loss"], report["limit"])] + [
            (w["loss"], w["limit"]) for w in report["windows"]
        ]
        if "partition_limit" in report:
            scopes.append((report["partitions"]["max_spent"], report["partition_limit"]))
        for loss, limit in scopes:
            for name in (measure, "delta"):
                if name in limit and loss.get(name, 0) > limit[name]:
                    over += 1
    _, verified = call(port, "GET", "/v1/ledger/verify", None, ADMIN_KEY)
    return over + (0 if verified["ok"] else 1)


if __name__ == "__main__":
    main()
