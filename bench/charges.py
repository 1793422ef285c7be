"""Charges per second and latency of the service under gunicorn, against the stack's ceiling.

For each backend (SQLite, and PostgreSQL when --postgres-url names a server where the
user may create databases), this starts `accountant serve` and, with the same gunicorn
settings, the bare endpoint of bench/ceiling_app.py on a copy of the same schema; drives
each with the same concurrent clients on 127.0.0.1 for a bounded time; and prints
charges/s, p50 and p99 latency, and the service/ceiling ratio. For reference it also
prints the rate of the ceiling's transaction run in a loop in one process on one
connection (the raw driver, no HTTP).

    python bench/charges.py [--seconds 15] [--clients 8] [--workers 2] [--threads 4]
                            [--postgres-url postgresql+psycopg://postgres@127.0.0.1/postgres]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).parent
BIN = Path(sys.executable).parent
ADMIN_KEY = "bench-admin-key-" + "b" * 32


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(port: int, path: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", path)
            if connection.getresponse().status < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port}")


def client(port: int, path: str, kind: str, deadline: float, number: int, out: Any) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies, statuses = [], {}
    index = 0
    while time.monotonic() < deadline:
        partition = (number * 7919 + index) % 1000
        if kind == "service":
            body = {"dataset": "bench", "partitions": [f"p{partition}"], "mechanism": "laplace",
                    "params": {"epsilon": 0.01, "sensitivity": 1}, "input": {"values": [1.0]}}
        else:
            body = {"partition": partition + 1}
        started = time.perf_counter()
        connection.request("POST", path, body=json.dumps(body), headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_KEY}"})
        response = connection.getresponse()
        response.read()
        latencies.append(time.perf_counter() - started)
        statuses[response.status] = statuses.get(response.status, 0) + 1
        index += 1
    out.put((latencies, statuses))


def drive(port: int, path: str, kind: str, clients: int, seconds: float) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    deadline = time.monotonic() + seconds + 3  # spawned clients need a moment to start
    procs = [context.Process(target=client, args=(port, path, kind, deadline, n, out))
             for n in range(clients)]
    for proc in procs:
        proc.start()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    for _ in procs:
        got, counts = out.get(timeout=seconds + 120)
        latencies += got
        for status, count in counts.items():
            statuses[status] = statuses.get(status, 0) + count
    for proc in procs:
        proc.join()
    window = sum(latencies) / clients
    ordered = sorted(latencies)
    return {"rate": len(latencies) / window, "p50": statistics.median(ordered) * 1000,
            "p99": ordered[int(0.99 * len(ordered))] * 1000, "statuses": statuses}


def prepare(url: str) -> None:
    """Migrate, and create the admin, the dataset, 1000 partitions and both scope rows."""
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": url, "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
           "ACCOUNTANT_LOG_LEVEL": "WARNING"}
    subprocess.run([BIN / "accountant", "db", "upgrade"], env=env, check=True,
                   capture_output=True)
    code = (
        "from accountant.app import create_app\n"
        "app = create_app()\n"
        "c = app.test_client()\n"
        f"h = {{'Authorization': 'Bearer {ADMIN_KEY}'}}\n"
        "c.post('/v1/datasets', headers=h, json={'name': 'bench', 'privacy_unit': 'record',"
        " 'accounting': 'pure', 'budget': {'epsilon': 1000000}})\n"
        "c.post('/v1/datasets/bench/partitions', headers=h,"
        " json={'keys': [f'p{i}' for i in range(1000)]})\n"
        "r = c.post('/v1/charges', headers=h, json={'dataset': 'bench', 'partitions': ['p0'],"
        " 'mechanism': 'laplace', 'params': {'epsilon': 0.01, 'sensitivity': 1},"
        " 'input': {'values': [1.0]}})\n"
        "assert r.status_code == 201, r.get_data()\n")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)


def serve(command: list[str], env: dict[str, str], port: int, path: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    wait_ready(port, path)
    return proc


def run_backend(label: str, make_url: Any, args: argparse.Namespace) -> dict[str, Any]:
    results = {}
    for kind in ("ceiling", "service"):
        url = make_url(kind)
        prepare(url)
        port = free_port()
        env = {**os.environ, "ACCOUNTANT_DATABASE_URL": url, "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
               "ACCOUNTANT_LOG_LEVEL": "WARNING", "CEILING_DATABASE_URL": url,
               "ACCOUNTANT_SIGNING_KEY_FILE": str(Path(args.folder) / "key.pem")}
        if kind == "service":
            command = [str(BIN / "accountant"), "serve", "--port", str(port),
                       "--workers", str(args.workers), "--threads", str(args.threads)]
            ready, path = "/healthz", "/v1/charges"
        else:
            command = [str(BIN / "gunicorn"), "--chdir", str(BENCH), "-b", f"127.0.0.1:{port}",
                       "-w", str(args.workers), "--threads", str(args.threads),
                       "-k", "gthread", "ceiling_app:app"]
            ready, path = "/charge", "/charge"
        print(f"  {label} {kind}: {args.clients} clients for {args.seconds} s ...",
              file=sys.stderr)
        proc = serve(command, env, port, ready)
        try:
            results[kind] = drive(port, path, kind, args.clients, args.seconds)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    return results


RAW_LOOP = """
import sys, time
import ceiling_app
connection = ceiling_app._connection()
deadline, count = time.monotonic() + float(sys.argv[1]), 0
started = time.perf_counter()
while time.monotonic() < deadline:
    ceiling_app.write_charge(connection, count % 1000 + 1)
    count += 1
print(count / (time.perf_counter() - started))
"""


def raw_rate(url: str, seconds: float) -> float:
    """Charges/s of the ceiling's transaction in a loop, in process, on one connection."""
    prepare(url)
    env = {**os.environ, "CEILING_DATABASE_URL": url}
    done = subprocess.run([sys.executable, "-c", RAW_LOOP, str(seconds)], env=env, cwd=BENCH,
                          check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--postgres-url", default=os.environ.get("ACCOUNTANT_BENCH_POSTGRES_URL"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        args.folder = folder
        backends = {"sqlite": lambda kind: f"sqlite:///{folder}/{kind}.db"}
        if args.postgres_url:
            backends["postgresql"] = lambda kind: _postgres_database(args.postgres_url, kind)
        print(f"{'backend':11} {'':8} {'charges/s':>10} {'p50 ms':>8} {'p99 ms':>8}  statuses")
        for label, make_url in backends.items():
            results = run_backend(label, make_url, args)
            for kind in ("ceiling", "service"):
                r = results[kind]
                print(f"{label:11} {kind:8} {r['rate']:10.0f} {r['p50']:8.2f} {r['p99']:8.2f}"
                      f"  {r['statuses']}")
            print(f"{label:11} ratio service/ceiling: "
                  f"{results['service']['rate'] / results['ceiling']['rate']:.2f}")
            print(f"{label:11} raw driver, in process, 1 connection: "
                  f"{raw_rate(make_url('raw'), min(args.seconds, 5)):.0f} charges/s")


def _postgres_database(url: str, kind: str) -> str:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    name = f"bench_{kind}_{uuid.uuid4().hex[:8]}"
    engine = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    return make_url(url).set(database=name).render_as_string(hide_password=False)


if __name__ == "__main__":
    main()
