"""Charges per second and latency of the service under gunicorn, against the stack's ceiling.

For each backend (SQLite, and PostgreSQL when --postgres-url names a server where the
user may create databases), this starts `accountant serve` and, with the same gunicorn
settings, the bare endpoint of bench/ceiling_app.py on a copy of the same schema; drives
each with the same concurrent clients on 127.0.0.1 for a bounded time; and prints
charges/s, p50 and p99 latency, and the service/ceiling ratio. For reference it also
prints the rate of the ceiling's transaction run in a loop in one process on one
connection (the raw driver, no HTTP). A PostgreSQL database is analysed (ANALYZE) once it
is prepared, as autovacuum would have it soon after such a load.

With --population, the dataset is of privacy unit user and a member of a population: each
charge also locks, checks and updates the population's row.

With --hold, each of the 1000 partitions gets a hold when the service's database is
prepared, and a third kind of slice, draw, sends the same charges to the service, each
naming its partition's hold: a draw's cost comes out of the hold, not the scopes. Its
ratio to the ceiling, in the same run, says what drawing on a hold costs against a plain
charge.

With --compare-with DIR (a git worktree of an earlier commit), the service of that source
tree runs too, on a database of its own, in slices of its own: the ratio service/before of
each round says how this tree's charge path compares with that one's, on the same machine
in the same seconds.

Both servers run side by side, and the clients drive them in turn in short slices
(--slice seconds, ceiling then service, again and again): on a shared machine whose
speed drifts from one second to the next, a slow spell falls on both alike. A round is
--seconds of each server; its ratio is the service's rate over the ceiling's in that
round. The ratio printed is the median of the rounds'; the rates are the median
round's, and p50/p99 are over every request of every round. The first slice of each
server warms up and is not counted.

It prints the CPU time each server's processes used per request answered, after the
warm-up: on a machine whose cores the clients and servers saturate, the service's rate over
the ceiling's tends to the ratio of these (with the clients' own CPU added to both).

From the service's /metrics it also prints the time of its transactions per charge, to the
end of their COMMIT (accountant_dataset_transaction_seconds_total), and charges per
transaction (group commit). On SQLite that time, from when the write lock is taken, holds
the lock: charges that queue for it run at most one per that time, so a rate
near that bound is set by the work done under the lock. On PostgreSQL it also counts the
wait for the dataset's row lock.

It first prints what a flush of the disk takes: a 4 KiB append and its fsync, in the
temporary folder where the SQLite databases are (set TMPDIR to a folder on the disk a
database would use; on tmpfs a flush does nothing). The bare endpoint pays a flush per
request, under the write lock (SQLite) or its dataset's row lock (PostgreSQL); the service
pays one per transaction, shared by the charges of a worker that joined it. With
--fsync-delay-ms MS, each fsync and fdatasync of the processes this bench starts (the
servers, their set-up, the raw driver) waits MS more, as on a disk whose flushes are that
much slower (bench/slow_fsync.c, built with the C compiler and preloaded; Linux): run it
with a few delays to see where the service's ratio passes 1. A PostgreSQL server does its
own flushes, which this does not delay: bench/slow_fsync.c says how to start one with it.

    python bench/charges.py [--seconds 10] [--rounds 3] [--slice 1] [--clients 6]
                            [--workers 2] [--threads 4] [--accounting pure|rdp|gdp] [--hold]
                            [--population] [--compare-with DIR] [--fsync-delay-ms MS]
                            [--postgres-url postgresql+psycopg://postgres@127.0.0.1/postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
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


#: The dataset and the charge the service is driven with, by accounting mode (--accounting):
#: (the dataset's terms, the mechanism, its parameters).
SETUPS: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "pure": (
        {"accounting": "pure", "budget": {"epsilon": 1000000}},
        "laplace",
        {"epsilon": 0.01, "sensitivity": 1},
    ),
    "rdp": (
        {"accounting": "rdp", "rdp_order": 10, "budget": {"epsilon": 1000000, "delta": 1e-6}},
        "laplace",
        {"epsilon": 0.01, "sensitivity": 1},
    ),
    "gdp": (
        {"accounting": "gdp", "budget": {"epsilon": 1000, "delta": 1e-6}},
        "gaussian",
        {"sigma": 100, "sensitivity": 1},
    ),
}


def _setup() -> tuple[dict[str, Any], str, dict[str, Any]]:
    return SETUPS[os.environ.get("BENCH_ACCOUNTING", "pure")]


def kinds() -> tuple[str, ...]:
    """The kinds of slice the clients take in turn: with --hold, draws on holds too; with
    --compare-with, the service of the other source tree too."""
    extra = ("draw",) if os.environ.get("BENCH_HOLD") else ()
    if os.environ.get("BENCH_BEFORE"):
        extra += ("before",)
    return (*KINDS, *extra)


def _tree_env(kind: str) -> dict[str, str]:
    """What a server of ``kind`` (and its set-up) runs with: the other source tree first on
    the import path for --compare-with's "before"."""
    if kind != "before":
        return {}
    tree = os.environ["BENCH_BEFORE"]
    meta = _tree_metadata(Path(tree), Path(os.environ["BENCH_FOLDER"]) / "before-metadata")
    path = [str(meta), tree, os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(filter(None, path))}


def _tree_folder(kind: str) -> str | None:
    """Where a process of ``kind`` starts: the other source tree for "before" (``python -c``
    and gunicorn put their working folder first on the import path), else here."""
    return os.environ["BENCH_BEFORE"] if kind == "before" else None


def _tree_metadata(tree: Path, folder: Path) -> Path:
    """A folder holding the metadata of the service's distribution with the entry points
    of ``tree``'s pyproject.toml: first on the import path, it stands in for the installed
    one's, so that the other tree's server loads that tree's plugins and no others."""
    import tomllib

    project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
    name = project["name"]
    info = folder / f"{name.replace('-', '_')}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    lines = []
    for group, points in project.get("entry-points", {}).items():
        lines += [f"[{group}]", *(f"{point} = {target}" for point, target in points.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    return folder


def _holds() -> dict[str, str]:
    """The hold of each partition (--hold), as the set-up wrote them."""
    path = Path(os.environ.get("BENCH_FOLDER", "."), "holds.json")
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _body(kind: str, number: int, index: int, holds: dict[str, str]) -> dict[str, Any]:
    partition = (number * 7919 + index) % 1000
    if kind in ("service", "draw", "before"):
        _, mechanism, params = _setup()
        body = {
            "dataset": "bench",
            "partitions": [f"p{partition}"],
            "mechanism": mechanism,
            "params": params,
            "input": {"values": [1.0]},
        }
        if kind == "draw":
            body["hold"] = holds[f"p{partition}"]
        return body
    return {"partition": partition + 1}


def client(
    targets: dict[str, tuple[int, str]],
    start: float,
    slice_seconds: float,
    slices: int,
    number: int,
    out: Any,
) -> None:
    """Charge from ``start`` on for ``slices`` slices of ``slice_seconds``, each slice to the
    server of the kind ``kinds()`` names in turn; put (slice, latencies, statuses) for every
    slice."""
    connections = {
        kind: http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for kind, (port, _) in targets.items()
    }
    turns, holds = kinds(), _holds()
    results: list[tuple[list[float], dict[int, int]]] = [([], {}) for _ in range(slices)]
    index = 0
    while time.monotonic() < start:
        time.sleep(0.001)
    while (current := int((time.monotonic() - start) / slice_seconds)) < slices:
        kind = turns[current % len(turns)]
        payload = json.dumps(_body(kind, number, index, holds))
        started = time.perf_counter()
        try:
            connections[kind].request(
                "POST",
                targets[kind][1],
                body=payload,
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {ADMIN_KEY}",
                },
            )
            response = connections[kind].getresponse()
            response.read()
        except (http.client.HTTPException, ConnectionError):  # an idle keep-alive closed
            connections[kind].close()
            continue
        latencies, statuses = results[current]
        latencies.append(time.perf_counter() - started)
        statuses[response.status] = statuses.get(response.status, 0) + 1
        index += 1
    out.put((number, results))


def drive(
    targets: dict[str, tuple[int, str]], args: argparse.Namespace, groups: dict[str, int]
) -> tuple[list[dict[str, dict[str, Any]]], dict[str, float], dict[str, float] | None]:
    """Every round's results by kind: both servers driven in alternating slices, so a spell
    of a slow machine falls on both alike; the CPU seconds each server's processes
    (``groups``: process groups by kind) used from the end of the warm-up slices on; and the
    service's transaction counters then (``transaction_counters``)."""
    per_kind = max(1, round(args.seconds / args.slice))
    turns = kinds()
    n = len(turns)
    slices = n * (1 + args.rounds * per_kind)  # the first turn of each warms up, not counted
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = time.monotonic() + 3  # spawned clients need a moment to start
    procs = [
        context.Process(target=client, args=(targets, start, args.slice, slices, n, out))
        for n in range(args.clients)
    ]
    for proc in procs:
        proc.start()
    time.sleep(max(0.0, start + n * args.slice - time.monotonic()))  # warmed up
    cpu = {kind: -cpu_seconds(group) for kind, group in groups.items()}
    warm = transaction_counters(targets["service"][0])
    counted: list[list[tuple[list[float], dict[int, int]]]] = []
    for _ in procs:
        _, results = out.get(timeout=slices * args.slice + 120)
        counted.append(results[n:])
    for kind, group in groups.items():
        cpu[kind] += cpu_seconds(group)
    for proc in procs:
        proc.join()
    rounds = []
    for number in range(args.rounds):
        chosen = range(number * n * per_kind, (number + 1) * n * per_kind)
        rounds.append(
            {
                kind: _rate([r[i] for r in counted for i in chosen if i % n == k], args.clients)
                for k, kind in enumerate(turns)
            }
        )
    return rounds, cpu, warm


def _rate(parts: list[tuple[list[float], dict[int, int]]], clients: int) -> dict[str, Any]:
    latencies = [x for got, _ in parts for x in got]
    statuses: dict[int, int] = {}
    for _, counts in parts:
        for status, count in counts.items():
            statuses[status] = statuses.get(status, 0) + count
    busy = sum(latencies) / clients
    return {"rate": len(latencies) / busy, "latencies": latencies, "statuses": statuses}


def prepare(url: str, folder: str, *, holds: bool = False, kind: str = "service") -> None:
    """Migrate, and create the admin, the dataset, 1000 partitions and both scope rows;
    ``holds``: and a hold on each partition, whose ids go to ``folder``/holds.json."""
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": url,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
        "ACCOUNTANT_SIGNING_KEY_FILE": str(Path(folder) / "key.pem"),
        **_tree_env(kind),
    }
    cwd = _tree_folder(kind)
    subprocess.run(
        [BIN / "accountant", "db", "upgrade"], env=env, cwd=cwd, check=True, capture_output=True
    )
    terms, mechanism, params = _setup()
    dataset = {"name": "bench", "privacy_unit": "record", **terms}
    population = None
    if os.environ.get("BENCH_POPULATION"):  # a person-level dataset in a population
        population = {"name": "people", "privacy_unit": "user", **terms}
        dataset.update(privacy_unit="user", population="people")
    charge = {
        "dataset": "bench",
        "partitions": ["p0"],
        "mechanism": mechanism,
        "params": params,
        "input": {"values": [1.0]},
    }
    code = (
        "from accountant.app import prepared_app\n"
        "app = prepared_app()\n"
        "c = app.test_client()\n"
        f"h = {{'Authorization': 'Bearer {ADMIN_KEY}'}}\n"
        + (
            ""
            if population is None
            else f"assert c.post('/v1/populations', headers=h, json={population!r}).status_code"
            " == 201\n"
        )
        + f"r = c.post('/v1/datasets', headers=h, json={dataset!r})\n"
        "assert r.status_code == 201, r.get_data()\n"
        "c.post('/v1/datasets/bench/partitions', headers=h,"
        " json={'keys': [f'p{i}' for i in range(1000)]})\n"
        f"r = c.post('/v1/charges', headers=h, json={charge!r})\n"
        "assert r.status_code == 201, r.get_data()\n"
    )
    if holds:  # 100 000 draws of 0.01 fit each
        code += (
            "import json\n"
            "made = {}\n"
            "for i in range(1000):\n"
            "    r = c.post('/v1/holds', headers=h, json={'dataset': 'bench', 'partitions':"
            " [f'p{i}'], 'amount': "
            + repr(HOLD_AMOUNTS[os.environ.get("BENCH_ACCOUNTING", "pure")])
            + ", 'expires_in': 604800})\n"
            "    assert r.status_code == 201, r.get_data()\n"
            "    made[f'p{i}'] = r.get_json()['hold_id']\n"
            f"open({str(Path(folder) / 'holds.json')!r}, 'w').write(json.dumps(made))\n"
        )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"setting up {url} failed:\n{done.stderr[-3000:]}")
    if url.startswith("postgresql"):
        # as autovacuum would within a minute of such a load: until then PostgreSQL plans
        # the charge's reads for tables it believes nearly empty (a sequential scan of the
        # 1000 partitions, per scope row, per charge, while the dataset is locked)
        _admin(url, "ANALYZE")


#: What each partition's hold reserves (--hold), in each mode's measure.
HOLD_AMOUNTS: dict[str, dict[str, float]] = {
    "pure": {"epsilon": 1000},
    "rdp": {"rdp": 100},
    "gdp": {"mu": 100},
}


def serve(
    command: list[str], env: dict[str, str], port: int, path: str, cwd: str | None = None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_ready(port, path)
    return proc


def start(
    kind: str, url: str, args: argparse.Namespace
) -> tuple[subprocess.Popen[bytes], int, str]:
    """A running server of ``kind`` on a prepared database: (process, port, charge path)."""
    prepare(url, args.folder, holds=kind == "service" and args.hold, kind=kind)
    port = free_port()
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": url,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
        "CEILING_DATABASE_URL": url,
        "ACCOUNTANT_SIGNING_KEY_FILE": str(Path(args.folder) / "key.pem"),
        **_tree_env(kind),
    }
    if kind in ("service", "before"):
        command = [
            str(BIN / "accountant"),
            "serve",
            "--port",
            str(port),
            "--workers",
            str(args.workers),
            "--threads",
            str(args.threads),
        ]
        ready, path = "/healthz", "/v1/charges"
    else:
        command = [
            str(BIN / "gunicorn"),
            "--chdir",
            str(BENCH),
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            str(args.workers),
            "--threads",
            str(args.threads),
            "-k",
            "gthread",
            "ceiling_app:app",
        ]
        ready, path = "/charge", "/charge"
    return serve(command, env, port, ready, _tree_folder(kind)), port, path


def run_backend(label: str, make_url: Any, args: argparse.Namespace) -> dict[str, Any]:
    servers = {}
    try:
        for kind in kinds():
            if kind != "draw":  # draws go to the service
                servers[kind] = start(kind, make_url(kind), args)
        print(
            f"  {label}: {args.clients} clients, {args.rounds} rounds of {args.seconds} s per "
            f"server in alternating {args.slice} s slices ...",
            file=sys.stderr,
        )
        targets = {kind: (port, path) for kind, (_, port, path) in servers.items()}
        if "draw" in kinds():
            targets["draw"] = targets["service"]  # the same server, charges naming holds
        groups = {kind: proc.pid for kind, (proc, _, _) in servers.items()}
        rounds, cpu, warm = drive(targets, args, groups)
        served = {kind: sum(len(r[kind]["latencies"]) for r in rounds) for kind in kinds()}
        if "draw" in served:  # the service's own server answers draws too
            served["service"] += served.pop("draw")
        if all(cpu.values()) and all(served.values()):  # /proc (Linux) and answers
            per = {kind: cpu[kind] / served[kind] * 1000 for kind in cpu}
            print(
                f"  {label} CPU per request of each server's processes: "
                + ", ".join(f"{kind} {ms:.2f} ms" for kind, ms in per.items())
                + f" (ceiling/service {per['ceiling'] / per['service']:.2f})",
                file=sys.stderr,
            )
        held = transaction_figures(targets["service"][0], since=warm)
        if held is not None:
            print(
                f"  {label} service: {held['per_unit_ms']:.2f} ms of transaction per charge, "
                f"{held['per_transaction']:.1f} charges per transaction",
                file=sys.stderr,
            )
        for number, got in enumerate(rounds, 1):
            print(
                f"  {label} round {number}: ceiling {got['ceiling']['rate']:.0f}/s, "
                + ", ".join(
                    f"{kind} {got[kind]['rate']:.0f}/s "
                    f"(ratio {got[kind]['rate'] / got['ceiling']['rate']:.2f})"
                    for kind in kinds()[1:]
                ),
                file=sys.stderr,
            )
    finally:
        for proc, _, _ in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    return summary(rounds)


KINDS = ("ceiling", "service")


def cpu_seconds(group: int) -> float:
    """The CPU time (user and system) the live processes of process group ``group`` have used,
    from /proc (Linux; 0 elsewhere)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == group:  # pgrp; utime and stime follow at 11 and 12
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def transaction_counters(port: int) -> dict[str, float] | None:
    """The service's counters of its transactions on the bench dataset, from its /metrics
    (``accountant_dataset_transaction*``, summed over its workers); None if it has none."""
    key = os.environ.get("ACCOUNTANT_METRICS_KEY")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    text = connection.getresponse().read().decode()
    connection.close()
    found = {}
    for name in ("transaction_seconds", "transactions", "transaction_units"):
        line = f'accountant_dataset_{name}_total{{dataset="bench"}} '
        values = [float(x[len(line) :]) for x in text.splitlines() if x.startswith(line)]
        if not values:
            return None
        found[name] = values[0]
    return found


def transaction_figures(port: int, since: dict[str, float] | None) -> dict[str, float] | None:
    """Since the counters ``since`` (``transaction_counters``; None: since the start): the
    time of the service's transactions on the bench dataset to the end of their COMMIT, per
    charge, and charges per transaction (draws, with --hold, included)."""
    now = transaction_counters(port)
    if now is None:
        return None
    done = {name: value - (since or {}).get(name, 0.0) for name, value in now.items()}
    if not done["transactions"]:
        return None
    return {
        "per_unit_ms": done["transaction_seconds"] / done["transaction_units"] * 1000,
        "per_transaction": done["transaction_units"] / done["transactions"],
    }


def summary(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The median round's rates and ratio; latency percentiles over all rounds."""
    ordered = sorted(rounds, key=lambda r: r["service"]["rate"] / r["ceiling"]["rate"])
    middle = ordered[len(ordered) // 2]
    result: dict[str, Any] = {
        "ratios": [r["service"]["rate"] / r["ceiling"]["rate"] for r in rounds]
    }
    if "draw" in kinds():
        result["draw_ratios"] = [r["draw"]["rate"] / r["ceiling"]["rate"] for r in rounds]
        result["draw_ratio"] = statistics.median(result["draw_ratios"])
    if "before" in kinds():
        result["before_ratios"] = [r["service"]["rate"] / r["before"]["rate"] for r in rounds]
        result["before_ratio"] = statistics.median(result["before_ratios"])
    for kind in kinds():
        latencies = sorted(x for r in rounds for x in r[kind]["latencies"])
        statuses: dict[int, int] = {}
        for r in rounds:
            for status, count in r[kind]["statuses"].items():
                statuses[status] = statuses.get(status, 0) + count
        result[kind] = {
            "rate": middle[kind]["rate"],
            "p50": statistics.median(latencies) * 1000,
            "p99": latencies[int(0.99 * len(latencies))] * 1000,
            "statuses": statuses,
        }
    result["ratio"] = middle["service"]["rate"] / middle["ceiling"]["rate"]
    return result


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


def raw_rate(url: str, seconds: float, folder: str) -> float:
    """Charges/s of the ceiling's transaction in a loop, in process, on one connection."""
    prepare(url, folder)
    env = {**os.environ, "CEILING_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-c", RAW_LOOP, str(seconds)],
        env=env,
        cwd=BENCH,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10, help="per round and server")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--slice",
        type=float,
        default=1,
        help="seconds each server is driven before the clients switch",
    )
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--postgres-url", default=os.environ.get("ACCOUNTANT_BENCH_POSTGRES_URL"))
    parser.add_argument(
        "--accounting",
        choices=sorted(SETUPS),
        default="pure",
        help="the dataset's mode: pure (laplace), rdp (laplace at order 10) or gdp (gaussian)",
    )
    parser.add_argument(
        "--hold",
        action="store_true",
        help="also draw on holds (one per partition), in slices of their own",
    )
    parser.add_argument(
        "--population",
        action="store_true",
        help="charge a dataset of privacy unit user that belongs to a population",
    )
    parser.add_argument(
        "--compare-with",
        metavar="DIR",
        help="also drive the service of another source tree (a git worktree of an earlier "
        "commit), in slices of its own, and print this service's rate over that one's",
    )
    parser.add_argument(
        "--fsync-delay-ms",
        type=float,
        default=0,
        metavar="MS",
        help="make each fsync and fdatasync of the processes this bench starts (servers, their "
        "set-up, the raw driver) wait MS more, as on a slower disk; not a PostgreSQL server's "
        "(builds bench/slow_fsync.c with the C compiler; Linux)",
    )
    args = parser.parse_args()
    if args.fsync_delay_ms < 0:
        parser.error("--fsync-delay-ms must be 0 or more")
    if args.compare_with:
        os.environ["BENCH_BEFORE"] = str(Path(args.compare_with).resolve())
    os.environ["BENCH_ACCOUNTING"] = args.accounting  # read by the clients and the set-up
    if args.population:
        os.environ["BENCH_POPULATION"] = "1"
    if args.hold:
        os.environ["BENCH_HOLD"] = "1"
    with tempfile.TemporaryDirectory() as folder, dropped_afterwards(args.postgres_url):
        args.folder = folder
        os.environ["BENCH_FOLDER"] = folder  # where the clients find the holds' ids
        flush = f"{fsync_ms(folder):.2f} ms"
        if args.fsync_delay_ms:
            slow_fsync(folder, args.fsync_delay_ms)
            delayed = fsync_ms(folder)
            if delayed < args.fsync_delay_ms:
                raise SystemExit(
                    f"a flush took {delayed:.2f} ms with bench/slow_fsync.c preloaded, less than "
                    "the delay: the preload did not take (it needs Linux's dynamic loader)"
                )
            flush += f"; in the processes this bench starts, {delayed:.2f} ms"
        print(
            f"a flush of {folder} (4 KiB appended, fsync, median): {flush}",
            file=sys.stderr,
        )
        backends = {"sqlite": lambda kind: f"sqlite:///{folder}/{kind}.db"}
        if args.postgres_url:
            backends["postgresql"] = lambda kind: _postgres_database(args.postgres_url, kind)
        print(f"{'backend':11} {'':8} {'charges/s':>10} {'p50 ms':>8} {'p99 ms':>8}  statuses")
        for label, make_url in backends.items():
            results = run_backend(label, make_url, args)
            for kind in kinds():
                r = results[kind]
                print(
                    f"{label:11} {kind:8} {r['rate']:10.0f} {r['p50']:8.2f} {r['p99']:8.2f}"
                    f"  {r['statuses']}"
                )
            rounds = ", ".join(f"{ratio:.2f}" for ratio in results["ratios"])
            print(
                f"{label:11} ratio service/ceiling: {results['ratio']:.2f} "
                f"(median of rounds: {rounds})"
            )
            if "draw_ratio" in results:
                draws = ", ".join(f"{ratio:.2f}" for ratio in results["draw_ratios"])
                print(
                    f"{label:11} ratio draw/ceiling: {results['draw_ratio']:.2f} "
                    f"(median of rounds: {draws})"
                )
            if "before_ratio" in results:
                befores = ", ".join(f"{ratio:.3f}" for ratio in results["before_ratios"])
                print(
                    f"{label:11} ratio service/before: {results['before_ratio']:.3f} "
                    f"(median of rounds: {befores})"
                )
            print(
                f"{label:11} raw driver, in process, 1 connection: "
                f"{raw_rate(make_url('raw'), min(args.seconds, 5), args.folder):.0f} charges/s"
            )


FLUSH_LOOP = """
import os, statistics, sys, time
path = os.path.join(sys.argv[1], "flush-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
times, deadline = [], time.monotonic() + 5
while len(times) < 200 and (len(times) < 5 or time.monotonic() < deadline):
    started = time.perf_counter()
    os.write(fd, b"x" * 4096)
    os.fsync(fd)
    times.append(time.perf_counter() - started)
os.close(fd)
os.unlink(path)
print(statistics.median(times) * 1000)
"""


def fsync_ms(folder: str) -> float:
    """The median time of a 4 KiB append and its fsync in ``folder`` (200 of them, or as
    many as 5 s allow), in a process of its own, started as this bench's servers are (after
    ``slow_fsync``, with its delay)."""
    done = subprocess.run(
        [sys.executable, "-c", FLUSH_LOOP, folder],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(done.stdout)


def slow_fsync(folder: str, delay_ms: float) -> None:
    """Build bench/slow_fsync.c in ``folder`` and preload it, with a delay of ``delay_ms``,
    into every process this bench starts from now on: its servers, their set-up (which it
    slows too), the raw driver and the clients (which flush nothing); not a PostgreSQL
    server."""
    library = str(Path(folder) / "slow_fsync.so")
    compiler = shlex.split(os.environ.get("CC", "cc"))
    flags = ["-O2", "-shared", "-fPIC", "-o", library]
    try:
        subprocess.run([*compiler, *flags, str(BENCH / "slow_fsync.c"), "-ldl"], check=True)
    except FileNotFoundError:
        raise SystemExit(
            f"--fsync-delay-ms builds bench/slow_fsync.c with {compiler[0]!r}, which is not "
            "installed: install a C compiler, or name one in CC"
        ) from None
    os.environ["LD_PRELOAD"] = " ".join(filter(None, [library, os.environ.get("LD_PRELOAD")]))
    os.environ["BENCH_FSYNC_DELAY_US"] = str(round(delay_ms * 1000))


_CREATED: list[str] = []


def _postgres_database(url: str, kind: str) -> str:
    """A new database on the server of ``url``, dropped by ``dropped_afterwards``."""
    from sqlalchemy.engine import make_url

    name = f"bench_{kind}_{uuid.uuid4().hex[:8]}"
    _admin(url, f"CREATE DATABASE {name}")
    _CREATED.append(name)
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@contextlib.contextmanager
def dropped_afterwards(url: str | None) -> Iterator[None]:
    """Drop the databases made with ``_postgres_database`` meanwhile, however it ends."""
    try:
        yield
    finally:
        while url and _CREATED:
            _admin(url, f"DROP DATABASE IF EXISTS {_CREATED.pop()} WITH (FORCE)")


def _admin(url: str, statement: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as connection:
        connection.execute(text(statement))


if __name__ == "__main__":
    main()
