"""Sealing a database from before seals: once, as it stands, because an operator says so.

The service never seals rows that exist (``accountant.seals``): a seal vouches that the
service set what it covers, and rows from before seals, or rows whose seals were removed,
were last set by whoever could write the database. ``accountant seals init`` is the
operator's statement that the rows as they stand are the ones to vouch for. On a database
from before seals it seals every dataset's terms and chain head and every consumer; on one
sealed before chain heads were (migration 0016), every chain head. It refuses a database in
which what it would seal is sealed already (sealing again would vouch for whatever was
edited since), and one whose chains, terms digests, ``loss_after`` or seals do not verify;
it appends to each dataset's chain a ``limit_change`` entry of scope ``seals`` naming who
ran it and what it sealed, so the chain itself records when its dataset was first vouched
for, and by whom; the head sealed is the one after that entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from accountant import seals
from accountant.driver import Driver
from accountant.errors import Conflict
from accountant.key_hashing import KeyHasher, ensure_registered
from accountant.models import (
    AdminChain,
    ApiKey,
    Consumer,
    Dataset,
    Grant,
    KeyHashSecret,
    Population,
)
from accountant.services import ledger
from accountant.services.datasets import lifetime_loss
from accountant.services.verification import verify


@dataclass(frozen=True, kw_only=True)
class SealedConsumer:
    """A consumer as sealed.

    Args:
        name: its name.
        role: its role.
        datasets: the names of the datasets granted to it.
        keys: how many live keys it has.
    """

    name: str
    role: str
    datasets: tuple[str, ...]
    keys: int


@dataclass(frozen=True)
class SealedDataset:
    """A dataset as sealed: its name, terms digest and chain head (seq and hash)."""

    name: str
    terms_sha256: str
    head: ledger.ChainHead


@dataclass(frozen=True)
class Sealed:
    """What ``init`` sealed: each dataset with its terms digest and head, and each consumer
    (none when only the chain heads were sealed: ``heads_only``)."""

    datasets: tuple[SealedDataset, ...]
    consumers: tuple[SealedConsumer, ...]
    heads_only: bool


def init(session: Session, hasher: KeyHasher, now: int, by: str) -> Sealed:
    """Seal what a database from before seals, or from before head seals, has unsealed, as
    it stands, in the caller's write transaction, and record it (``key_hash_secrets``'s
    ``sealed_at`` and ``heads_sealed_at``, one ledger entry per dataset naming ``by``).
    Raise ``Conflict`` if what it would seal is sealed already, or the database does not
    verify."""
    ensure_registered(session, hasher)  # a database from before keyed hashing, too
    sealed_at, heads_at = session.execute(
        select(KeyHashSecret.sealed_at, KeyHashSecret.heads_sealed_at)
    ).one()
    found = seals.carried(session)
    heads = sum(
        session.execute(select(func.count(owner.head_seal))).scalar_one()
        for owner, _ in ledger.OWNERS
    )
    heads_only = sealed_at is not None  # sealed before head seals: seal the heads alone
    if heads or (heads_at is not None if heads_only else found):
        raise Conflict(
            f"refused: this database is sealed already ({found} datasets and consumers "
            f"carry seals, {heads} chain heads"
            + ("" if sealed_at is None else "; it records when its seals began")
            + ("" if heads_at is None else ", and when its chain heads' began")
            + "); sealing again would vouch for whatever was edited since. Check it with "
            "'accountant ledger verify'"
        )
    chains = verify(session)
    if not chains.ok:
        raise Conflict(
            f"refused: the ledger does not verify (dataset {chains.dataset!r}: "
            f"{chains.reason}); sealing would vouch for it. Restore the database from a "
            "backup, or find the edit with 'accountant ledger verify'"
        )
    broken = seals.problem(session, hasher) if heads_only else None
    if broken is not None:
        raise Conflict(
            f"refused: the seals do not verify ({broken[1]}); sealing the chain heads would "
            "vouch for the chains of a database edited behind the service. Restore it from a "
            "backup"
        )
    sealed = _seal_datasets(session, hasher, now, by, heads_only)
    if heads_only:
        session.execute(update(KeyHashSecret).values(heads_sealed_at=now))
        return Sealed(sealed, (), True)
    consumers = _seal_consumers(session, hasher)
    session.execute(update(KeyHashSecret).values(sealed_at=now, heads_sealed_at=now))
    return Sealed(sealed, consumers, False)


def _seal_datasets(
    session: Session, hasher: KeyHasher, now: int, by: str, heads_only: bool
) -> tuple[SealedDataset, ...]:
    """Seal each dataset's chain head (and its terms, unless ``heads_only``) after an entry
    recording it."""
    what = ["chain head"] if heads_only else ["terms", "chain head"]
    datasets = session.execute(select(Dataset).order_by(Dataset.id).with_for_update()).scalars()
    sealed = []
    for dataset in datasets:
        if not heads_only:
            dataset.terms_seal = seals.of_terms(hasher, dataset.name, dataset.terms_sha256)
        head = ledger.append(
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
                "reason": f"{' and '.join(what)} sealed as they stood by 'accountant seals "
                f"init', run by {by}",
                "sealed_by": by,
                "sealed": what,
                "terms_sha256": dataset.terms_sha256,
            },
            loss_after=lifetime_loss(session, dataset),
            hasher=hasher,  # the head was not sealed, so this does not seal it
        )
        dataset.head_seal = seals.of_head(hasher, dataset.name, head.seq, head.hash)
        sealed.append(SealedDataset(dataset.name, dataset.terms_sha256, head))
    # a population's chain (its limit changes, verified above), and the admins' chain, is
    # sealed at its head as is
    chains: list[Population | AdminChain] = [
        *session.execute(select(Population).with_for_update()).scalars(),
        *session.execute(select(AdminChain).with_for_update()).scalars(),
    ]
    for chain in chains:
        chain.head_seal = seals.of_head(
            hasher, chain.name, chain.ledger_seq, chain.ledger_head or ledger.GENESIS
        )
    session.flush()
    return tuple(sealed)


def _seal_consumers(session: Session, hasher: KeyHasher) -> tuple[SealedConsumer, ...]:
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
        consumers.append(
            SealedConsumer(name=name, role=role, datasets=tuple(granted), keys=len(keys))
        )
    return tuple(consumers)
