"""The stack's ceiling: a bare Flask endpoint that does one charge's row writes through the
database driver and nothing else (no auth, validation, pricing, mechanism or ORM).

It writes what a granted one-partition charge writes: the dataset row (ledger head), s(p)
in the lifetime and consumer scopes, both scope rows, the charge count and one ledger entry, in one
transaction that locks the dataset first. On PostgreSQL it uses psycopg's pipeline mode as
the service does: the lock (with the implicit BEGIN) is one round trip, and the writes
travel with the COMMIT in a second one. Run by bench/charges.py under gunicorn.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from contextlib import nullcontext

from flask import Flask, request

URL = os.environ["CEILING_DATABASE_URL"]
IS_SQLITE = URL.startswith("sqlite")
app = Flask(__name__)
_local = threading.local()


def _connection():  # type: ignore[no-untyped-def]
    if not hasattr(_local, "connection"):
        if IS_SQLITE:
            import sqlite3

            connection = sqlite3.connect(
                URL.removeprefix("sqlite:///"), isolation_level=None, timeout=30
            )
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
        else:
            import psycopg

            connection = psycopg.connect(URL.replace("postgresql+psycopg", "postgresql"))
        _local.connection = connection
    return _local.connection


PARAM = "?" if IS_SQLITE else "%s"


def _sql(text: str) -> str:
    return text.replace("?", PARAM)


@app.post("/charge")
def charge() -> tuple[dict[str, str], int]:
    body = request.get_json()
    return {"hash": write_charge(_connection(), int(body["partition"]))}, 201


def write_charge(connection, partition: int) -> str:  # type: ignore[no-untyped-def]
    """One charge's writes in one transaction that locks the dataset first; the new head."""
    with nullcontext() if IS_SQLITE else connection.pipeline():
        cursor = connection.cursor()
        if IS_SQLITE:
            cursor.execute("BEGIN IMMEDIATE")  # psycopg begins one with the first statement
        cursor.execute(
            _sql(
                "SELECT ledger_seq, ledger_head FROM datasets WHERE id = ?"
                + ("" if IS_SQLITE else " FOR UPDATE")
            ),
            (1,),
        )
        seq, head = cursor.fetchone()
        cursor.execute(
            _sql(
                "INSERT INTO tally_spends (tally_id, partition_id, epsilon, delta, rho) "
                "SELECT id, ?, 10000000, 0, 0 FROM tallies WHERE id IN (1, 2) "
                "ON CONFLICT (tally_id, partition_id) DO UPDATE SET "
                "epsilon = tally_spends.epsilon + excluded.epsilon"
            ),
            (partition,),
        )
        cursor.executemany(
            _sql("UPDATE tallies SET total_epsilon = total_epsilon + 10000000 WHERE id = ?"),
            [(1,), (2,)],
        )
        cursor.execute(
            _sql(
                "INSERT INTO charge_counts (dataset_id, mechanism, outcome, count) "
                "VALUES (1, 'laplace', 'granted', 1) ON CONFLICT (dataset_id, mechanism, outcome) "
                "DO UPDATE SET count = charge_counts.count + 1"
            )
        )
        content = json.dumps({"seq": seq + 1, "partition": partition, "cost": 10000000})
        digest = hashlib.sha256((head + content).encode()).hexdigest()
        now = time.time_ns() // 1000
        cursor.execute(
            _sql(
                "INSERT INTO ledger_entries (seq, kind, dataset_id, status, partitions, params, "
                "cost_epsilon, cost_delta, cost_rho, multiplicity, detail, created_at, prev_hash, "
                "hash) VALUES (?, 'charge', 1, 'granted', '[]', '{}', 10000000, 0, 0, 1, '{}', ?, "
                "?, ?)"
            ),
            (seq + 1, now, head, digest),
        )
        cursor.execute(
            _sql("UPDATE datasets SET ledger_seq = ?, ledger_head = ? WHERE id = 1"),
            (seq + 1, digest),
        )
        cursor.execute("COMMIT")  # on PostgreSQL, sent with the writes; the block's end waits
    return digest
