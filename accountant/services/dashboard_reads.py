"""What the dashboard's dataset page shows besides the budget report, aggregated in SQL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from accountant.models import Consumer, Dataset, LedgerEntry, Partition, Tally, TallySpend
from accountant.services import ledger
from accountant.services.ledger_reads import describe_entry

DAY_US = 86_400 * 1_000_000


@dataclass(frozen=True)
class DatasetActivity:
    """Units of the dataset's measure (epsilon, or rho for zcdp)."""

    charged_per_day: dict[int, int]  # day since the epoch -> cost x multiplicity granted
    top_partitions: list[tuple[str, int]]  # lifetime s(p), at most 20
    consumer_totals: list[tuple[str, int]]  # what each consumer's charges added to T
    recent: list[dict[str, Any]]  # the 20 latest ledger entries, described, newest first


def activity(session: Session, dataset: Dataset, measure: str, *,
             by_key: bool = False) -> DatasetActivity:
    cost = getattr(LedgerEntry, f"cost_{measure}")
    day = LedgerEntry.created_at // DAY_US
    per_day = session.execute(
        select(day, func.sum(cost * LedgerEntry.multiplicity))
        .where(LedgerEntry.dataset_id == dataset.id, LedgerEntry.kind == "charge",
               LedgerEntry.status == "granted")
        .group_by(day).order_by(day)).all()
    lifetime = session.execute(select(Tally.id).where(
        Tally.dataset_id == dataset.id, Tally.kind == "lifetime")).scalar_one()
    spend = getattr(TallySpend, measure)
    top = session.execute(
        select(Partition.key, spend)
        .join(TallySpend, (TallySpend.partition_id == Partition.id)
              & (TallySpend.tally_id == lifetime))
        .order_by(Partition.key if by_key else spend.desc()).limit(20)).all()
    shares = session.execute(
        select(Consumer.name, getattr(Tally, f"total_{measure}"))
        .join(Consumer, Consumer.id == Tally.consumer_id)
        .where(Tally.dataset_id == dataset.id, Tally.kind == "consumer")).all()
    recent = session.execute(
        ledger.query(ledger.LedgerFilter(dataset_id=dataset.id, limit=20))
        .order_by(None).order_by(LedgerEntry.id.desc())).all()
    return DatasetActivity(
        {int(bucket): int(total or 0) for bucket, total in per_day},
        [(key, int(value)) for key, value in top],
        [(name, int(total)) for name, total in shares],
        [describe_entry(entry, dataset, consumer) for entry, _name, consumer in recent])
