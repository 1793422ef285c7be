"""Prometheus metrics that span every gunicorn worker.

Counts and utilisation are read from the database at scrape time (the same
for every worker and host). Latencies and database errors are per-process
measurements, so they use prometheus_client's multiprocess mode: under
``accountant serve`` every worker writes to files in
``PROMETHEUS_MULTIPROC_DIR`` and a scrape of any worker sums them all. Label
sets stay bounded: dataset, scope, mechanism, outcome; never a partition or a key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

CHARGE_SECONDS = Histogram(
    "accountant_charge_duration_seconds",
    "Time to answer POST /v1/charges, by outcome.",
    ["outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
DATABASE_ERRORS = Counter(
    "accountant_database_errors_total", "Requests answered 503 because the database failed."
)


DATASET_TRANSACTION_SECONDS = Counter(
    "accountant_dataset_transaction_seconds",
    "Seconds of this service's transactions of charges, holds and settles on each "
    "dataset, to the end of their COMMIT: on SQLite from when BEGIN IMMEDIATE has the "
    "database's write lock, on PostgreSQL from BEGIN, so including the waits for the "
    "dataset's row lock (and its population's). Transactions in which every request was "
    "refused before writing (a 4xx, a failed mechanism), or that failed, are not counted.",
    ["dataset"],
)
DATASET_TRANSACTIONS = Counter(
    "accountant_dataset_transactions",
    "Transactions of charges, holds and settles on each dataset (group commit: each may "
    "carry several).",
    ["dataset"],
)
DATASET_TRANSACTION_UNITS = Counter(
    "accountant_dataset_transaction_units",
    "Charges, holds and settles run in those transactions, refused ones included.",
    ["dataset"],
)


def observe_transaction(dataset: str, seconds: float, units: int) -> None:
    """Count a transaction of ``units`` units of work on ``dataset`` that took ``seconds``
    to the end of its COMMIT, as ``DATASET_TRANSACTION_SECONDS`` says (``GroupCommit``)."""
    DATASET_TRANSACTION_SECONDS.labels(dataset).inc(seconds)
    DATASET_TRANSACTIONS.labels(dataset).inc()
    DATASET_TRANSACTION_UNITS.labels(dataset).inc(units)


def outcome_of(status: int) -> str:
    if status == 201:
        return "granted"
    if status in (409, 429):
        return "denied"
    return "refused" if status < 500 else "error"


def process_metrics() -> bytes:
    """The latency and error metrics of this process, or of all workers in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # prometheus_client's multiprocess module is untyped
        return generate_latest(registry)
    return generate_latest()


def record_metric(update: Callable[[], object]) -> None:
    """Update a metric; a failure (its multiprocess folder gone, a full disk) is logged and
    never turns an answer, least of all a committed charge, into an error."""
    try:
        update()
    except Exception as error:  # prometheus_client writes files; anything may fail
        logging.getLogger(__name__).error(
            "could not record a metric", extra={"error": repr(error)[:200]}
        )
