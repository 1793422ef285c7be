"""Idempotency keys: the same key and body replay the first response; another body is a 422.

What is kept. The row holds the first response without its output but with
its receipt and the SHA-256 of its output. A replay regenerates the output
from the charge's keyed random source (``accountant.noise``), so the database
never holds noise; it does so only with the noise secret and the mechanism
implementation recorded with the charge (in its ledger entry), and releases
the output only if its hash is the first one's. Anything else is refused: a
retry never draws fresh noise (which would let a caller average it away).

How long. Rows are kept as long as the ledger: a key is never forgotten, so
a retry however late can neither charge twice nor draw new noise. A row is
about 1 KB; clients that want to reuse key strings should not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, insert, select

from accountant.driver import Driver, Pending, Rows, statement
from accountant.errors import field_error
from accountant.models import IdempotencyKey, LedgerEntry


def key_of(body: dict[str, Any], header: str | None) -> str | None:
    """The request's key, from the header or the ``idempotency_key`` field (not both unequal)."""
    field = body.get("idempotency_key")
    if header is not None and field is not None and header != field:
        raise field_error("idempotency_key", "differs from the Idempotency-Key header; send one")
    key = header if header is not None else field
    if key is not None and not (1 <= len(key) <= 255 and key.isprintable()):
        raise field_error("idempotency_key", "must be 1-255 printable characters")
    return key


def fingerprint(body: Mapping[str, Any]) -> str:
    """SHA-256 of the request body without its key, numbers as their exact decimal text."""
    content = {k: v for k, v in body.items() if k != "idempotency_key"}
    return hashlib.sha256(
        json.dumps(content, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


@dataclass(frozen=True)
class Outcome:
    """A charge's response as remembered: replayed as it is for the same key and body."""

    request_hash: str
    charge_id: str
    status: int
    body: dict[str, Any]
    headers: dict[str, str]
    #: What produced a granted charge's output (from its ledger entry), when read back.
    noise_secret: str | None = None
    implementation: str | None = None


def find(driver: Driver, consumer_id: int, key: str) -> Pending[Outcome | None]:
    """The response remembered for ``key``, if any: sent now, read on demand."""
    return driver.send(_FIND, {"c": consumer_id, "k": key}, _outcome)


_FIND = statement(
    select(
        IdempotencyKey.request_hash,
        IdempotencyKey.charge_id,
        IdempotencyKey.status,
        IdempotencyKey.body,
        IdempotencyKey.headers,
        LedgerEntry.noise_secret,
        LedgerEntry.implementation,
    )
    .outerjoin(LedgerEntry, LedgerEntry.charge_id == IdempotencyKey.charge_id)
    .where(IdempotencyKey.consumer_id == bindparam("c"), IdempotencyKey.key == bindparam("k"))
)


def _outcome(rows: Rows) -> Outcome | None:
    if not rows:
        return None
    row = rows[0]
    return Outcome(
        row.request_hash,
        row.charge_id,
        row.status,
        _json(row.body),
        _json(row.headers),
        row.noise_secret,
        row.implementation,
    )


def _json(value: Any) -> Any:
    """A JSON column's value: SQLite hands back its text, psycopg the parsed value."""
    return json.loads(value) if isinstance(value, str) else value


def remember(driver: Driver, consumer_id: int, key: str, outcome: Outcome, now: int) -> None:
    """Store the response for ``key``, in the charge's transaction. A concurrent duplicate
    (unique consumer and key) fails at the latest at the commit, which then writes nothing."""
    driver.run(
        _INSERT,
        {
            "consumer_id": consumer_id,
            "key": key,
            "request_hash": outcome.request_hash,
            "charge_id": outcome.charge_id,
            "status": outcome.status,
            "body": json.dumps(outcome.body),
            "headers": json.dumps(outcome.headers),
            "created_at": now,
        },
    )


_INSERT = statement(
    insert(IdempotencyKey).values(
        {
            name: bindparam(name)
            for name in (
                "consumer_id",
                "key",
                "request_hash",
                "charge_id",
                "status",
                "body",
                "headers",
                "created_at",
            )
        }
    )
)


def encode_params(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: {"decimal": str(v)} if isinstance(v, Decimal) else v for k, v in params.items()}


def decode_params(stored: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: Decimal(v["decimal"]) if isinstance(v, dict) and set(v) == {"decimal"} else v
        for k, v in stored.items()
    }


def decimals_as_floats(value: Any) -> Any:
    """Decimals as JSON numbers' exact text cannot be stored in a JSON column; use floats,
    which is what the response carries anyway."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {k: decimals_as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decimals_as_floats(v) for v in value]
    return value
