"""One batch of charges against the same charges one by one, and pricing a plan tightly.

For each backend (SQLite, and PostgreSQL when --postgres-url names a server where the
user may create databases, in a new database dropped afterwards), this starts `accountant
serve` on a prepared database (a `pure` dataset of epsilon 10^6, as bench/charges.py makes
it) and, over one keep-alive connection on 127.0.0.1, times in turn (a) --items `laplace`
charges (epsilon 0.01, sensitivity 1, one value each, partition p1) sent one by one to
`POST /v1/charges`, all of them, and (b) one `POST /v1/charges/batch` of the same items.
A round is one of each; the rounds alternate which goes first, so that a slow spell of a
shared machine, or whatever the first of the two leaves behind, falls on both alike. The
first round warms up and is not counted. It prints each round's times and the median
ratio batch / one by one (the target: below 0.25).

Then, in this process, it times pricing a 1000-item plan of Gaussians (sigma 10,
sensitivity 1) with privacy-loss distributions,
`plan_pricing.group_epsilon(items, delta=10^-6)`: the first call (cold: no distribution
built yet) and a second (warm: the distributions cached), with the epsilon in units of
10^-9; and, cold, a mixed plan of 500 laplaces (epsilon 0.01) and 500 gaussians of 5
sigmas none of which was priced before. Importing the pricing (dp_accounting) is timed
apart. While accountant/accounting/plan_pricing.py is missing it waits (--wait-minutes).

    python bench/batches.py [--rounds 5] [--items 100] [--workers 2] [--threads 4]
                            [--plan-items 1000] [--wait-minutes 30]
                            [--postgres-url postgresql+psycopg://postgres@127.0.0.1/postgres]
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
#: bench/charges.py: its set-up, server start and PostgreSQL databases (imported by name, so
#: that type checking this file does not type check that one).
charges: Any = importlib.import_module("charges")
ADMIN_KEY: str = charges.ADMIN_KEY

HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_KEY}"}
#: The charge each item and each single request makes.
CHARGE: dict[str, Any] = {
    "dataset": "bench",
    "partitions": ["p1"],
    "mechanism": "laplace",
    "params": {"epsilon": 0.01, "sensitivity": 1},
    "input": {"values": [1.0]},
}
#: The sigmas of the mixed plan's gaussians: none is the plain plan's 10, so it is cold.
MIXED_SIGMAS = (5, 20, 40, 80, 160)
DELTA = Fraction(1, 10**6)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def post(connection: http.client.HTTPConnection, path: str, body: Any) -> tuple[int, bytes]:
    connection.request("POST", path, body=json.dumps(body), headers=HEADERS)
    response = connection.getresponse()
    return response.status, response.read()


def one_by_one(connection: http.client.HTTPConnection, items: int) -> float:
    """Seconds ``items`` charges take, each sent when the one before is answered."""
    started = time.perf_counter()
    for _ in range(items):
        status, data = post(connection, "/v1/charges", CHARGE)
        if status != 201:
            raise RuntimeError(f"a charge answered {status}: {data[:500]!r}")
    return time.perf_counter() - started


def batch(connection: http.client.HTTPConnection, items: int) -> float:
    """Seconds one batch of ``items`` charges takes."""
    body = {"items": [CHARGE] * items}
    started = time.perf_counter()
    status, data = post(connection, "/v1/charges/batch", body)
    elapsed = time.perf_counter() - started
    if status != 201:
        raise RuntimeError(f"a batch answered {status}: {data[:500]!r}")
    return elapsed


def run_backend(label: str, url: str, args: argparse.Namespace) -> list[tuple[float, float]]:
    """(one by one, batch) seconds of every counted round on a server of ``url``."""
    progress(f"{label}: preparing the database ...")
    charges.prepare(url, args.folder)
    port = charges.free_port()
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": url,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
        "ACCOUNTANT_SIGNING_KEY_FILE": str(Path(args.folder) / "key.pem"),
    }
    command = [
        str(charges.BIN / "accountant"),
        "serve",
        "--port",
        str(port),
        "--workers",
        str(args.workers),
        "--threads",
        str(args.threads),
    ]
    progress(f"{label}: starting accountant serve on port {port} ...")
    proc = charges.serve(command, env, port, "/healthz")
    rounds = []
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for number in range(args.rounds + 1):  # round 0 warms up
            if number % 2:
                together = batch(connection, args.items)
                single = one_by_one(connection, args.items)
            else:
                single = one_by_one(connection, args.items)
                together = batch(connection, args.items)
            name = "warm-up" if number == 0 else f"round {number}"
            progress(
                f"{label} {name}: {args.items} one by one {single * 1000:.1f} ms, "
                f"one batch {together * 1000:.1f} ms, ratio {together / single:.3f}"
            )
            if number:
                rounds.append((single, together))
        connection.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return rounds


def plan_pricing_module(wait_minutes: float) -> Any:
    """accountant.accounting.plan_pricing, once it exists (it may still be being written)."""
    deadline = time.monotonic() + wait_minutes * 60
    while True:
        try:
            module = importlib.import_module("accountant.accounting.plan_pricing")
            if hasattr(module, "PlanItem") and hasattr(module, "group_epsilon"):
                return module
            sys.modules.pop("accountant.accounting.plan_pricing", None)
            reason = "has no PlanItem or group_epsilon yet"
        except ImportError as error:
            reason = str(error)
        if time.monotonic() >= deadline:
            raise SystemExit(f"plan_pricing is still not usable after {wait_minutes} min: {reason}")
        progress(f"plan_pricing not usable yet ({reason}); retrying in 120 s ...")
        time.sleep(120)
        importlib.invalidate_caches()


def timed(function: Any, *arguments: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = function(*arguments)
    return time.perf_counter() - started, result


def pricing(args: argparse.Namespace) -> list[str]:
    """Lines reporting the in-process pricing of the Gaussian and the mixed plan."""
    progress("pricing: importing plan_pricing and dp_accounting ...")
    started = time.perf_counter()
    plan_pricing = plan_pricing_module(args.wait_minutes)
    from dp_accounting.pld import privacy_loss_distribution  # noqa: F401  (timed import)

    from accountant.exact import EPSILON, Amount
    from accountant_plugins.gaussian import GAUSSIAN
    from accountant_plugins.laplace import LAPLACE

    imported = time.perf_counter() - started
    n = args.plan_items

    def gaussian(sigma: int) -> Any:
        return plan_pricing.PlanItem(
            mechanism=GAUSSIAN,
            params={"sigma": Decimal(sigma), "sensitivity": Decimal(1)},
            coordinates=1,
            single=None,
        )

    plain = [gaussian(10) for _ in range(n)]
    progress(f"pricing: {n} gaussians (sigma 10), cold ...")
    cold, epsilon = timed(plan_pricing.group_epsilon, plain, DELTA)
    progress(f"pricing: {n} gaussians (sigma 10), warm ...")
    warm, again = timed(plan_pricing.group_epsilon, plain, DELTA)
    assert again == epsilon, (again, epsilon)

    laplace = plan_pricing.PlanItem(
        mechanism=LAPLACE,
        params={"epsilon": Decimal("0.01"), "sensitivity": Decimal(1)},
        coordinates=1,
        single=Amount(epsilon=EPSILON.cost_units(Fraction(1, 100))),
    )
    half = n // 2
    mixed = [laplace] * (n - half) + [
        gaussian(MIXED_SIGMAS[i * len(MIXED_SIGMAS) // half]) for i in range(half)
    ]
    progress(f"pricing: mixed plan of {n - half} laplaces and {half} gaussians, cold ...")
    mixed_cold, mixed_epsilon = timed(plan_pricing.group_epsilon, mixed, DELTA)
    mixed_warm, mixed_again = timed(plan_pricing.group_epsilon, mixed, DELTA)
    assert mixed_again == mixed_epsilon, (mixed_again, mixed_epsilon)
    sigmas = ", ".join(str(s) for s in MIXED_SIGMAS)
    return [
        f"pricing   import plan_pricing + dp_accounting: {imported:.2f} s",
        f"pricing   {n} gaussians sigma 10, delta 1e-6: cold {cold:.3f} s, warm {warm:.3f} s, "
        f"epsilon {epsilon} (x 1e-9 = {epsilon / 1e9:.6f})",
        f"pricing   {n - half} laplaces eps 0.01 + {half} gaussians sigma {sigmas}, delta 1e-6: "
        f"cold {mixed_cold:.3f} s (warm {mixed_warm:.3f} s), epsilon {mixed_epsilon} "
        f"(x 1e-9 = {mixed_epsilon / 1e9:.6f})",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds, after a warm-up")
    parser.add_argument("--items", type=int, default=100, help="charges per batch (1 to 1000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--plan-items", type=int, default=1000, help="items of a priced plan")
    parser.add_argument(
        "--wait-minutes",
        type=float,
        default=30,
        help="how long to wait (retrying every 120 s) for plan_pricing to be importable",
    )
    parser.add_argument("--postgres-url", default=os.environ.get("ACCOUNTANT_BENCH_POSTGRES_URL"))
    args = parser.parse_args()
    if not 1 <= args.items <= 1000 or args.rounds < 1 or args.plan_items < 2:
        parser.error("--items must be 1 to 1000, --rounds at least 1, --plan-items at least 2")
    os.environ["BENCH_ACCOUNTING"] = "pure"  # what charges.prepare makes: epsilon 10^6
    lines = []
    with tempfile.TemporaryDirectory() as folder, charges.dropped_afterwards(args.postgres_url):
        args.folder = folder
        backends: dict[str, Callable[[], str]] = {
            "sqlite": lambda: f"sqlite:///{folder}/batches.db"
        }
        if args.postgres_url:
            backends["postgresql"] = lambda: charges._postgres_database(
                args.postgres_url, "batches"
            )
        for label, make_url in backends.items():
            rounds = run_backend(label, make_url(), args)
            for number, (single, together) in enumerate(rounds, 1):
                lines.append(
                    f"{label:10} round {number}: {args.items} one by one "
                    f"{single * 1000:8.1f} ms, one batch {together * 1000:7.1f} ms, "
                    f"ratio {together / single:.3f}"
                )
            ratios = [together / single for single, together in rounds]
            median = statistics.median(ratios)
            lines.append(
                f"{label:10} ratio batch / one by one: {median:.3f} (median of "
                f"{', '.join(f'{r:.3f}' for r in ratios)}; target < 0.25: "
                f"{'met' if median < 0.25 else 'NOT met'}); per charge: one by one "
                f"{statistics.median(s for s, _ in rounds) / args.items * 1000:.2f} ms, "
                f"in a batch {statistics.median(t for _, t in rounds) / args.items * 1000:.2f} ms"
            )
    lines.extend(pricing(args))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
