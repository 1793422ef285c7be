"""Raising the rho limits of zcdp datasets made under an older, looser conversion.

Budgets of zcdp datasets are stated as (epsilon, delta) and enforced as rho
(``accounting.modes.rho_limit``, the Canonne, Kamath and Steinke 2020
conversion). Datasets created before it took that rho from the looser
rho + 2 sqrt(rho ln(1/delta)) bound. ``accountant db upgrade`` recomputes
every stated limit of every zcdp dataset (lifetime, partition, windows,
consumers' quotas) and raises the ones that are lower, each ledgered as a
limit change; a limit stated as rho is left as it is, and running it again
changes nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from accountant import seals
from accountant.accounting.modes import rho_limit
from accountant.accounting.windows import PERIOD_NAMES
from accountant.db import begin_write
from accountant.exact import DELTA, EPSILON, Limit
from accountant.key_hashing import KeyHasher
from accountant.models import Consumer, Dataset, Grant, KeyHashSecret
from accountant.services.datasets import (
    describe_limit,
    ledger_limit_changes,
    seal_terms,
    terms_hold,
)

REASON = (
    "zcdp limits recomputed from their stated (epsilon, delta) by the Canonne, Kamath "
    "and Steinke (2020) conversion, which allows a larger rho for the same guarantee"
)


def _raised(row: Any, prefix: str, dataset_delta: int) -> bool:
    """Raise ``row``'s rho limit (columns ``{prefix}_epsilon`` ...) to the conversion of its
    stated epsilon and delta, if that is larger; True if it was raised."""
    epsilon = getattr(row, f"{prefix}_epsilon")
    rho = getattr(row, f"{prefix}_rho")
    if epsilon is None or rho is None:
        return False
    delta = getattr(row, f"{prefix}_delta") or dataset_delta
    converted = rho_limit(EPSILON.to_decimal(epsilon), DELTA.to_decimal(delta))
    if converted <= rho:
        return False
    setattr(row, f"{prefix}_rho", converted)
    return True


def upgrade_zcdp_limits(session: Session, now: int, hasher: KeyHasher | None = None) -> int:
    """Raise every zcdp limit that the conversion allows to be larger; the datasets changed.
    With ``hasher``, reseal what changed if its seal held before (without it, on a host
    without the key-hash secret, the rows stay as sealed and ``ledger verify`` reports
    them). A database not sealed yet stays unsealed: ``accountant seals init`` seals it as
    converted, and refuses a database in which anything is sealed."""
    begin_write(session)
    if session.execute(select(KeyHashSecret.sealed_at)).scalar() is None:
        hasher = None
    holding = set()  # the consumers whose seals hold, read before anything changes
    if hasher is not None:
        for consumer_id in session.execute(select(Consumer.id)).scalars().all():
            if seals.consumer_holds(session, hasher, consumer_id):
                holding.add(consumer_id)
    changed = 0
    resealed: set[int] = set()
    for dataset in session.execute(
        select(Dataset).where(Dataset.accounting == "zcdp").order_by(Dataset.id).with_for_update()
    ).scalars():
        holds = hasher is not None and terms_hold(dataset, hasher)
        delta = dataset.limit_delta or 0
        changes: list[tuple[str, Any, Any]] = []
        old = describe_limit(dataset.limit, dataset.mode)
        if _raised(dataset, "limit", delta):
            changes.append(("dataset", old, describe_limit(dataset.limit, dataset.mode)))
        if dataset.has_partition_limit and dataset.partition_limit is not None:
            old = describe_limit(dataset.partition_limit, dataset.mode)
            if _raised(dataset, "partition_limit", delta):
                assert dataset.partition_limit is not None
                changes.append(
                    ("partition", old, describe_limit(dataset.partition_limit, dataset.mode))
                )
        for window in dataset.windows:
            old = describe_limit(_limit(window, "limit"), dataset.mode)
            if _raised(window, "limit", delta):
                changes.append(
                    (
                        f"window:{PERIOD_NAMES[window.period_seconds]}",
                        old,
                        describe_limit(_limit(window, "limit"), dataset.mode),
                    )
                )
        grants = session.execute(
            select(Grant, Consumer.name)
            .join(Consumer, Consumer.id == Grant.consumer_id)
            .where(Grant.dataset_id == dataset.id, Grant.has_quota)
        ).all()
        for grant, consumer in grants:
            old = describe_limit(_limit(grant, "quota"), dataset.mode)
            if _raised(grant, "quota", delta):
                resealed.add(grant.consumer_id)
                changes.append(
                    (
                        f"consumer:{consumer}",
                        old,
                        describe_limit(_limit(grant, "quota"), dataset.mode),
                    )
                )
        if not changes:
            continue
        changed += 1
        seal_terms(dataset, hasher if holds else None)
        session.flush()
        ledger_limit_changes(session, dataset, None, changes, REASON, now, hasher)
    if hasher is not None:
        session.flush()
        for consumer_id in sorted(resealed & holding):
            seals.seal_consumer(session, hasher, consumer_id)
    session.commit()
    return changed


def _limit(row: Any, prefix: str) -> Limit:
    return Limit(
        getattr(row, f"{prefix}_epsilon"),
        getattr(row, f"{prefix}_delta"),
        getattr(row, f"{prefix}_rho"),
    )
