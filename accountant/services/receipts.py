"""Receipt keys in the database and the claims a receipt carries."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from accountant.models import Dataset, LedgerEntry, SigningKey
from accountant.signing import public_jwk, sign
from accountant.statements import Write, upsert


def register(session: Session, private: Ed25519PrivateKey, now: int) -> None:
    """Keep the public half of the current key (idempotent; the caller commits)."""
    jwk = public_jwk(private.public_key())
    if session.get(SigningKey, jwk["kid"]) is None:
        session.add(SigningKey(kid=jwk["kid"], public_jwk=jwk, created_at=now))


def published(private: Ed25519PrivateKey, now: int) -> Write:
    """The write that keeps the public half of ``private``, if it is not kept yet: the charge
    that first signs with a key publishes it, atomically with itself."""
    jwk = public_jwk(private.public_key())
    return Write(_PUBLISH, {"k": jwk["kid"], "j": json.dumps(jwk), "t": now})


_PUBLISH = upsert(
    lambda insert: (
        insert(SigningKey)
        .values(kid=bindparam("k"), public_jwk=bindparam("j"), created_at=bindparam("t"))
        .on_conflict_do_nothing(index_elements=[SigningKey.kid])
    )
)


def jwks(session: Session, private: Ed25519PrivateKey) -> list[dict[str, str]]:
    """Every verification key: the current one first, then older ones."""
    current = public_jwk(private.public_key())
    stored = session.execute(select(SigningKey).order_by(SigningKey.created_at.desc())).scalars()
    return [current] + [dict(k.public_jwk) for k in stored if k.kid != current["kid"]]


def in_ledger(session: Session, claims: dict[str, Any]) -> bool | None:
    """Whether the charge's ledger entry named by a receipt (its dataset, seq and hash) is
    in the dataset's chain as the receipt saw it; None for a receipt that names none (signed
    before receipts carried it). A ledger cut back behind a receipt, or an entry rewritten,
    shows here even where the chain itself verifies."""
    entry = claims.get("ledger")
    if not isinstance(entry, dict):
        return None
    found = session.execute(
        select(LedgerEntry.hash, LedgerEntry.charge_id, LedgerEntry.hold_id)
        .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
        .where(Dataset.name == claims.get("dataset"), LedgerEntry.seq == entry.get("seq"))
    ).first()
    return (
        found is not None
        and found.hash == entry.get("hash")
        and found.charge_id == claims.get("charge_id")
        and found.hold_id == claims.get("hold_id")
    )


def output_sha256(output: Any) -> str:
    """SHA-256 of the output exactly as the README states it:
    ``json.dumps(output, sort_keys=True, separators=(",", ":"))`` (ASCII escapes for other
    characters). NaN and infinities are refused: no output may contain them."""
    text = json.dumps(output, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def receipt(
    private: Ed25519PrivateKey,
    *,
    charge_id: str,
    dataset: str,
    partitions: list[str],
    mechanism: str,
    cost: dict[str, Decimal],
    multiplicity: int,
    charged: dict[str, Decimal],
    output_sha256: str,
    ledger: dict[str, Any],
    issued_at: int,
    hold_id: str | None = None,
    batch: dict[str, Any] | None = None,
) -> str:
    """The signed claims of a grant: ``cost`` per release, and ``charged`` = cost x
    ``multiplicity``, what the dataset's running total grew by (nothing for a draw on hold
    ``hold_id``, which its hold charged); ``ledger``, the seq and hash of the charge's
    ledger entry (the chain's head right after it). An item of a batch names its batch
    (``batch``, ``charge_responses.batch_detail``) and, priced in a group, the group and its
    whole cost: its own ``cost`` is then its share of what the group's releases cost
    together, not what its release alone would cost, and the receipt must not pass for
    that."""
    claims = {
        "kind": "charge",
        "charge_id": charge_id,
        "dataset": dataset,
        "partitions": partitions,
        "mechanism": mechanism,
        "cost": {k: float(v) for k, v in cost.items()},
        "multiplicity": multiplicity,
        "charged": {k: float(v) for k, v in charged.items()},
        "output_sha256": output_sha256,
        "ledger": ledger,
        "iat": issued_at,
    }
    if hold_id is not None:
        claims["hold_id"] = hold_id
    if batch is not None:
        claims["batch_id"] = batch["batch_id"]
        if "group" in batch:
            claims["group"] = batch["group"]
            claims["group_cost"] = {k: float(v) for k, v in batch["group_cost"].items()}
            claims["batch_delta"] = float(batch["batch_delta"])
    return sign(private, claims)


def hold_receipt(
    private: Ed25519PrivateKey,
    *,
    hold_id: str,
    dataset: str,
    partitions: list[str],
    release: str,
    mechanism: str | None,
    amount: dict[str, Decimal],
    multiplicity: int,
    charged: dict[str, Decimal],
    expires_at: str,
    ledger: dict[str, Any],
    issued_at: int,
) -> str:
    """The signed claims of a granted hold (``kind`` ``hold``, so that it cannot pass for a
    charge's or a settled cost's receipt): its per-release ``amount``, and ``charged`` =
    amount x ``multiplicity``, charged at once; ``ledger``, its entry's seq and hash."""
    claims = {
        "kind": "hold",
        "hold_id": hold_id,
        "dataset": dataset,
        "partitions": partitions,
        "release": release,
        "mechanism": mechanism,
        "amount": {k: float(v) for k, v in amount.items()},
        "multiplicity": multiplicity,
        "charged": {k: float(v) for k, v in charged.items()},
        "expires_at": expires_at,
        "ledger": ledger,
        "iat": issued_at,
    }
    return sign(private, claims)


def settle_receipt(
    private: Ed25519PrivateKey,
    *,
    hold_id: str,
    dataset: str,
    partitions: list[str],
    amount: dict[str, Decimal],
    used: dict[str, Decimal],
    returned: dict[str, Decimal],
    multiplicity: int,
    ledger: dict[str, Any],
    issued_at: int,
) -> str:
    """The signed claims of a settled hold (``kind`` ``settle``): the settled cost ``used``
    per release, which the job publishes with its output, what the hold had reserved
    (``amount``) and what went back (``returned``, times ``multiplicity`` in the totals);
    ``ledger``, the settle entry's seq and hash."""
    claims = {
        "kind": "settle",
        "hold_id": hold_id,
        "dataset": dataset,
        "partitions": partitions,
        "amount": {k: float(v) for k, v in amount.items()},
        "used": {k: float(v) for k, v in used.items()},
        "returned": {k: float(v) for k, v in returned.items()},
        "multiplicity": multiplicity,
        "ledger": ledger,
        "iat": issued_at,
    }
    return sign(private, claims)
