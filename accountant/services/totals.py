"""Rebuilding the running totals from the ledger, to prove the two agree.

The charge path keeps T, max s(p) and s(p) per scope incrementally. Here the
same numbers are recomputed from the granted ledger entries alone: every
lifetime, consumer and window tally, partition by partition. A difference
means the totals or the ledger were changed outside the service.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from accountant.accounting.loss import ScopeBooks, ScopeKey
from accountant.exact import Amount
from accountant.models import Dataset, LedgerEntry, Partition, Tally, TallySpend


@dataclass(frozen=True)
class Difference:
    dataset: str
    scope: str
    what: str
    stored: Amount
    rebuilt: Amount


def check(session: Session) -> tuple[int, list[Difference]]:
    """(entries replayed, differences) over every dataset."""
    replayed = 0
    differences: list[Difference] = []
    for dataset in session.execute(select(Dataset).order_by(Dataset.id)).scalars():
        tallies = {
            (t.kind, t.consumer_id, t.period_seconds, t.window_start): t
            for t in session.execute(select(Tally).where(Tally.dataset_id == dataset.id)).scalars()
        }
        keys = dict(
            session.execute(
                select(Partition.id, Partition.key).where(Partition.dataset_id == dataset.id)
            ).all()
        )
        books: dict[ScopeKey, ScopeBooks] = defaultdict(ScopeBooks)
        for entry in session.execute(
            select(LedgerEntry)
            .where(
                LedgerEntry.dataset_id == dataset.id,
                LedgerEntry.kind == "charge",
                LedgerEntry.status == "granted",
            )
            .order_by(LedgerEntry.seq)
        ).scalars():
            replayed += 1
            scopes: list[ScopeKey] = [
                ("lifetime", 0, 0, 0),
                ("consumer", entry.consumer_id or 0, 0, 0),
            ]
            moment = entry.created_at // 1_000_000
            scopes += [
                key for key in tallies if key[0] == "window" and key[3] <= moment < key[3] + key[2]
            ]
            for key in scopes:
                books[key].add(entry.cost, entry.multiplicity, entry.partitions)
        for key in set(tallies) | set(books):
            rebuilt_books = books[key]
            tally = tallies.get(key)
            scope = key[0] if key[0] == "lifetime" else f"{key[0]}:{key[1] or key[3]}"
            stored_total = tally.total if tally else Amount()
            if stored_total != rebuilt_books.total:
                differences.append(
                    Difference(dataset.name, scope, "T", stored_total, rebuilt_books.total)
                )
            stored_spends = (
                {}
                if tally is None
                else {
                    keys[row.partition_id]: Amount(row.epsilon, row.delta, row.rho)
                    for row in session.execute(
                        select(TallySpend).where(TallySpend.tally_id == tally.id)
                    ).scalars()
                }
            )
            for partition in set(stored_spends) | set(rebuilt_books.spends):
                stored = stored_spends.get(partition, Amount())
                rebuilt = rebuilt_books.spends.get(partition, Amount())
                if stored != rebuilt:
                    differences.append(
                        Difference(dataset.name, scope, f"s({partition})", stored, rebuilt)
                    )
    return replayed, differences
