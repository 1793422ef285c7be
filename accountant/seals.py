"""Seals: keyed digests of what the service itself set, so that ``ledger verify`` tells the
service's writes from edits made directly in the database.

The ledger's hash chain shows any edit of its entries, and each charge and limit change
records the digest of its dataset's terms. But a plain digest can be recomputed by anyone
who can write to the database. A seal cannot: it is HMAC-SHA256 under a key derived from
the key-hash secret (``accountant.key_hashing``), a file on the service's hosts that the
database never holds. The service seals

- each dataset's terms digest (privacy unit, mode, bounds, lifetime, partition and window
  limits), when it creates the dataset and at every limit change;
- each consumer's name, role, grants, quotas and keys (ids, stored hashes, revocations),
  whenever any of them changes.

``ledger verify`` on a host with the secret recomputes every seal. A limit edited before a
dataset's first ledger entry, a quota raised, a role escalated, a revoked key restored or a
key moved to another consumer shows as a broken seal. A database from before seals is
sealed once, as it is, by the first process that registers the key-hash secret after the
upgrade (``key_hash_secrets.sealed_at``); from then on a missing seal is a broken one.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.orm import Session

from accountant.key_hashing import KeyHasher
from accountant.models import ApiKey, Consumer, Dataset, Grant

Executor = Connection | Session


def of_terms(hasher: KeyHasher, name: str, terms_sha256: str) -> str:
    """The seal of a dataset's terms digest (bound to its name, so seals cannot be swapped)."""
    return hasher.seal(_canonical({"dataset": name, "terms_sha256": terms_sha256}))


def seal_consumer(executor: Executor, hasher: KeyHasher, consumer_id: int) -> None:
    """Seal ``consumer_id`` as its rows now stand (call after the session's changes are
    flushed). The consumer row is locked first: a transaction that changed one of its keys
    or grants at the same moment has then committed, and the reads after the lock see its
    change (READ COMMITTED reads each statement afresh), so no seal leaves out another's."""
    # FOR NO KEY UPDATE: it waits for another sealer, not for the key-share lock that
    # inserting a key or grant row takes on its consumer
    executor.execute(
        select(Consumer.id).where(Consumer.id == consumer_id).with_for_update(key_share=True)
    )
    executor.execute(
        update(Consumer)
        .where(Consumer.id == consumer_id)
        .values(seal=of_consumer(executor, hasher, consumer_id))
    )


def of_consumer(executor: Executor, hasher: KeyHasher, consumer_id: int) -> str:
    """The seal of a consumer's name, role, grants with their quotas, and keys."""
    name, role = executor.execute(
        select(Consumer.name, Consumer.role).where(Consumer.id == consumer_id)
    ).one()
    grants = executor.execute(
        select(
            Grant.dataset_id,
            Grant.has_quota,
            Grant.quota_epsilon,
            Grant.quota_delta,
            Grant.quota_rho,
        )
        .where(Grant.consumer_id == consumer_id)
        .order_by(Grant.dataset_id)
    ).all()
    keys = executor.execute(
        select(ApiKey.id, ApiKey.key_hash, ApiKey.revoked_at)
        .where(ApiKey.consumer_id == consumer_id)
        .order_by(ApiKey.id)
    ).all()
    content = {
        "consumer": consumer_id,
        "name": name,
        "role": role,
        "grants": [[g[0], bool(g[1]), *map(_int_or_none, g[2:])] for g in grants],
        "keys": [[k[0], k[1], _int_or_none(k[2])] for k in keys],
    }
    return hasher.seal(_canonical(content))


def seal_everything(executor: Executor, hasher: KeyHasher) -> int:
    """Seal every dataset and consumer as it stands: once, when a database from before
    seals is first served. The number of rows sealed."""
    datasets = executor.execute(select(Dataset.id, Dataset.name, Dataset.terms_sha256)).all()
    for dataset_id, name, terms_sha256 in datasets:
        executor.execute(
            update(Dataset)
            .where(Dataset.id == dataset_id)
            .values(terms_seal=of_terms(hasher, name, terms_sha256))
        )
    consumers = executor.execute(select(Consumer.id)).scalars().all()
    for consumer_id in consumers:
        seal_consumer(executor, hasher, consumer_id)
    return len(datasets) + len(consumers)


def broken(session: Session, hasher: KeyHasher) -> tuple[str | None, str] | None:
    """The first dataset or consumer whose seal does not match its rows, as (the dataset's
    name or None, what is wrong); None if every seal holds. ``ledger.verify`` checks each
    dataset's terms digest against its rows first, so the seal covers its limits."""
    for name, terms_sha256, seal in session.execute(
        select(Dataset.name, Dataset.terms_sha256, Dataset.terms_seal).order_by(Dataset.id)
    ).all():
        if seal != of_terms(hasher, name, terms_sha256):
            return name, (
                "its terms are not the ones the service sealed "
                "(limits, bounds or windows edited in the database?)"
            )
    for consumer_id, name, seal in session.execute(
        select(Consumer.id, Consumer.name, Consumer.seal).order_by(Consumer.id)
    ).all():
        if seal != of_consumer(session, hasher, consumer_id):
            return None, (
                f"consumer {name!r}: its role, grants, quotas or keys are not the ones the "
                "service sealed (edited in the database?)"
            )
    return None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _canonical(content: dict[str, Any]) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
