"""Sealing a database from before seals: once, as it stands, because an operator says so.

The service never seals rows that exist (``accountant.seals``): a seal vouches that the
service set what it covers, and rows from before seals, or rows whose seals were removed,
were last set by whoever could write the database. ``accountant seals init`` is the
operator's statement that the rows as they stand are the ones to vouch for. It refuses a
database in which anything is sealed already (sealing again would vouch for whatever was
edited since), and one whose chains or terms digests do not verify; it appends to each
dataset's chain a ``limit_change`` entry of scope ``seals`` naming who ran it, so the chain
itself records when its dataset's terms were first vouched for, and by whom.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from accountant import seals
from accountant.driver import Driver
from accountant.errors import Conflict
from accountant.key_hashing import KeyHasher, ensure_registered
from accountant.models import ApiKey, Consumer, Dataset, Grant, KeyHashSecret
from accountant.services import ledger
from accountant.services.datasets import lifetime_loss


@dataclass(frozen=True)
class SealedConsumer:
    """A consumer as sealed: its name, role, the datasets it is granted and its live keys."""

    name: str
    role: str
    datasets: tuple[str, ...]
    keys: int


@dataclass(frozen=True)
class Sealed:
    """What ``init`` sealed: each dataset with its terms digest, and each consumer."""

    datasets: tuple[tuple[str, str], ...]
    consumers: tuple[SealedConsumer, ...]


def init(session: Session, hasher: KeyHasher, now: int, by: str) -> Sealed:
    """Seal every dataset and consumer as it stands, in the caller's write transaction, and
    record it (``key_hash_secrets.sealed_at``, one ledger entry per dataset naming ``by``).
    Raise ``Conflict`` if anything is sealed already or the chains do not verify."""
    ensure_registered(session, hasher)  # a database from before keyed hashing, too
    sealed_at = session.execute(select(KeyHashSecret.sealed_at)).scalar()
    found = seals.carried(session)
    if sealed_at is not None or found:
        raise Conflict(
            f"refused: this database is sealed already ({found} datasets and consumers "
            "carry seals"
            + ("" if sealed_at is None else ", and it records when its seals began")
            + "); sealing again would vouch for whatever was edited since. Check it with "
            "'accountant ledger verify'"
        )
    chains = ledger.verify(session)
    if not chains.ok:
        raise Conflict(
            f"refused: the ledger does not verify (dataset {chains.dataset!r}: "
            f"{chains.reason}); sealing would vouch for it. Restore the database from a "
            "backup, or find the edit with 'accountant ledger verify'"
        )
    datasets = session.execute(select(Dataset).order_by(Dataset.id).with_for_update()).scalars()
    sealed_datasets = []
    for dataset in datasets:
        dataset.terms_seal = seals.of_terms(hasher, dataset.name, dataset.terms_sha256)
        ledger.append(
            Driver.of(session),
            dataset,
            None,
            kind="limit_change",
            status="granted",
            created_at=now,
            detail={
                "scope": "seals",
                "old": None,
                "new": None,
                "reason": f"sealed as it stood by 'accountant seals init', run by {by}",
                "sealed_by": by,
                "terms_sha256": dataset.terms_sha256,
            },
            loss_after=lifetime_loss(session, dataset),
        )
        sealed_datasets.append((dataset.name, dataset.terms_sha256))
    session.flush()
    consumers = []
    for consumer_id, name, role in session.execute(
        select(Consumer.id, Consumer.name, Consumer.role).order_by(Consumer.id)
    ).all():
        seals.seal_consumer(session, hasher, consumer_id)
        granted = session.execute(
            select(Dataset.name)
            .join(Grant, Grant.dataset_id == Dataset.id)
            .where(Grant.consumer_id == consumer_id)
            .order_by(Dataset.name)
        ).scalars()
        keys = session.execute(
            select(ApiKey.id).where(ApiKey.consumer_id == consumer_id, ApiKey.revoked_at.is_(None))
        ).all()
        consumers.append(SealedConsumer(name, role, tuple(granted), len(keys)))
    session.execute(update(KeyHashSecret).values(sealed_at=now))
    return Sealed(tuple(sealed_datasets), tuple(consumers))
