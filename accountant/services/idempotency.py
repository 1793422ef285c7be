"""Idempotency keys: the same key and body replay the first response; another body is a 422.

What is kept. The row holds the facts of the first answer
(``charge_responses``: a grant's charge id, amounts, receipt, run parameters
and the SHA-256 of its output, never the output; a denial's scope and
amounts), not an HTTP response: ``api.charges.answer`` renders first answers
and replays alike. A replay regenerates the output
from the charge's keyed random source (``accountant.noise``), so the database
never holds noise; it does so only with the noise secret and the mechanism
implementation recorded with the charge (in its ledger entry), and releases
the output only if its hash is the first one's (``output_of``). Anything else
is a ``ReplayUnavailable`` that releases nothing: a retry never draws fresh
noise (which would let a caller average it away).

How long. Rows are kept as long as the ledger: a key is never forgotten, so
a retry however late can neither charge twice nor draw new noise. A row is
about 1 KB; clients that want to reuse key strings should not.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, insert, select

from accountant.driver import Driver, Pending, Rows
from accountant.errors import IdempotencyKeyReused, ReplayUnavailable, field_error
from accountant.mechanism import Mechanism
from accountant.models import IdempotencyKey, LedgerEntry
from accountant.noise import NoiseSecret
from accountant.services import receipts
from accountant.statements import Write, statement

log = logging.getLogger(__name__)


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
class Remembered:
    """A charge's answer as remembered for its key: the facts it stated
    (``charge_responses``), given again for the same key and body."""

    request_hash: str
    charge_id: str
    facts: dict[str, Any]
    #: What produced a granted charge's output (from its ledger entry).
    noise_secret: str | None = None
    implementation: str | None = None

    @property
    def granted(self) -> bool:
        return bool(self.facts["kind"] == "granted")


def find(driver: Driver, consumer_id: int, key: str) -> Pending[Remembered | None]:
    """The answer remembered for ``key``, if any: sent now, read on demand."""
    return driver.send(_FIND, {"c": consumer_id, "k": key}, _remembered)


_FIND = statement(
    select(
        IdempotencyKey.request_hash,
        IdempotencyKey.charge_id,
        IdempotencyKey.facts,
        LedgerEntry.noise_secret,
        LedgerEntry.implementation,
    )
    .outerjoin(LedgerEntry, LedgerEntry.charge_id == IdempotencyKey.charge_id)
    .where(IdempotencyKey.consumer_id == bindparam("c"), IdempotencyKey.key == bindparam("k"))
)


def _remembered(rows: Rows) -> Remembered | None:
    if not rows:
        return None
    row = rows[0]
    facts = json.loads(row.facts) if isinstance(row.facts, str) else row.facts  # SQLite: text
    return Remembered(row.request_hash, row.charge_id, facts, row.noise_secret, row.implementation)


def remembered(
    consumer_id: int, key: str, request_hash: str, facts: dict[str, Any], now: int
) -> Write:
    """The write that stores a charge's facts for ``key``, in the charge's transaction. A
    concurrent duplicate (unique consumer and key) fails at the latest at the commit, which
    then writes nothing."""
    return Write(
        _INSERT,
        {
            "consumer_id": consumer_id,
            "key": key,
            "request_hash": request_hash,
            # the id of what the key made: a charge, a hold or a batch
            "charge_id": facts.get("charge_id") or facts.get("hold_id") or facts["batch_id"],
            "facts": json.dumps(facts),
            "created_at": now,
        },
    )


_INSERT = statement(
    insert(IdempotencyKey).values(
        {
            name: bindparam(name)
            for name in ("consumer_id", "key", "request_hash", "charge_id", "facts", "created_at")
        }
    )
)


def first_answer(
    driver: Driver, consumer_id: int, key: str, request_hash: str
) -> Remembered | None:
    """The answer remembered for ``key``, read outside any lock (a committed key's answer
    never changes), for a request that this service would now refuse as it stands (a
    mechanism disabled since, a lower vector limit): its first answer is still the answer.
    A 422 if the key came with another body."""
    first = find(driver, consumer_id, key).result()
    driver.end_read()
    return None if first is None else same_request(first, key, request_hash)


def same_request(first: Remembered, key: str | None, request_hash: str) -> Remembered:
    """``first``, the answer remembered for ``key``, if it answered a request with this body
    (``request_hash``); else a 422: the key was used for another request."""
    if first.request_hash != request_hash:
        raise IdempotencyKeyReused(
            f"idempotency key {key!r} was first used with a different request; "
            "use a new key for a new request"
        )
    return first


def output_of(
    first: Remembered, mechanism: Mechanism | None, data: Any, noise: NoiseSecret
) -> dict[str, Any] | None:
    """The first answer's output (None for a denial), regenerated by ``mechanism`` (the one
    the request names; None if no such mechanism runs here now) from its input ``data``."""
    if not first.granted:
        return None
    stored = first.facts
    why = None
    if "output_sha256" not in stored:
        why = "it was recorded before this service kept what a replay needs"
    elif mechanism is None:
        why = "its mechanism is not registered here now (disabled or not installed)"
    elif first.noise_secret != noise.id:
        why = (
            f"its noise was drawn with noise secret {first.noise_secret}, and this host "
            f"has {noise.id}"
        )
    elif first.implementation != mechanism.implementation:
        why = (
            f"it was produced by {first.implementation}, and this service runs "
            f"{mechanism.implementation}"
        )
    output = None
    if why is None and mechanism is not None:
        try:
            output = mechanism.runner()(
                decode_params(stored["run_params"]),
                data or {},
                noise.source_for(first.charge_id),
            )
        except Exception as error:  # a plugin's run may raise anything
            log.error(
                "a replay's mechanism failed",
                extra={"mechanism": mechanism.name, "error": repr(error)[:500]},
            )
            why = f"its mechanism failed when run again ({type(error).__name__})"
        if output is not None and receipts.output_sha256(output) != stored["output_sha256"]:
            log.error(
                "a replay's output differs from the first; its implementation changed "
                "without a new version",
                extra={"implementation": mechanism.implementation, "charge_id": first.charge_id},
            )
            why = "regenerated, its output differs from the first one"
    if why is not None:
        raise ReplayUnavailable(
            f"the first response to this request (charge {first.charge_id}) cannot be "
            f"given again exactly: {why}. Nothing is released: a retry never draws new noise. "
            "The charge stands (GET /v1/charges/{id}); send a new request with a new "
            "idempotency key for a new release, which is charged again",
            extra={"charge_id": first.charge_id},
        )
    return output


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
