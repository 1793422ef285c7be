"""Rebuilding the running totals from the ledger, to prove the two agree.

The charge path keeps T, max s(p) and s(p) per scope incrementally, and
T_J, T_P, s_J(p) and s_P(p) on datasets with the top-k rule. Here the same
numbers are recomputed from the granted ledger entries alone: every
lifetime, consumer and window tally, partition by partition. A difference
means the totals or the ledger were changed outside the service (or, for
T_J, T_P, s_J and s_P only, that the tally dates from before migration 0014
and did not equal its ledger then, so all of its spend was counted as
parallel).

A population's loss (``populations.loss_*``) is the sum of its datasets' lifetime losses;
it is checked against the sum of the lifetime losses the ledger rebuilds, each by its
dataset's loss rule.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from accountant.accounting.loss import (
    PARTS,
    Books,
    LossRule,
    Part,
    ScopeBooks,
    ScopeKey,
    loss_now,
)
from accountant.exact import COMPONENTS, Amount, ComponentName
from accountant.models import Dataset, LedgerEntry, Partition, Population, Tally, TallySpend
from accountant.services.ledger import CHANGES_TOTALS


@dataclass(frozen=True, kw_only=True)
class Difference:
    """Where a dataset's stored totals, or a population's loss, differ from the ledger's.

    Args:
        dataset: the dataset's name (scope ``population``: the population's).
        scope: the scope's key.
        what: the figure: T, T_J or T_P, or s(p), s_J(p) or s_P(p) of a partition; a
            population's ``loss``.
        stored: the figure as stored.
        rebuilt: the figure as the ledger rebuilds it.
    """

    dataset: str
    scope: str
    what: str
    stored: Amount
    rebuilt: Amount


def check(session: Session) -> tuple[int, list[Difference]]:
    """(entries replayed, differences) over every dataset, and every population's loss."""
    replayed = 0
    differences: list[Difference] = []
    members: dict[int, Amount] = defaultdict(Amount)  # population id -> the sum rebuilt
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
        held: dict[str, list[ScopeKey]] = {}  # the scopes each hold charged
        for entry in session.execute(
            select(LedgerEntry)
            .where(
                LedgerEntry.dataset_id == dataset.id,
                CHANGES_TOTALS,
            )
            .order_by(LedgerEntry.seq)
        ).scalars():
            replayed += 1
            if entry.kind == "settle":  # back to the scopes its hold charged
                for key in held.get(entry.hold_id or "", []):
                    books[key].remove(
                        entry.cost, entry.multiplicity, entry.partitions, entry.release
                    )
                continue
            scopes: list[ScopeKey] = [
                ("lifetime", 0, 0, 0),
                ("consumer", entry.consumer_id or 0, 0, 0),
            ]
            moment = entry.created_at // 1_000_000
            scopes += [
                key for key in tallies if key[0] == "window" and key[3] <= moment < key[3] + key[2]
            ]
            if entry.kind == "hold" and entry.hold_id is not None:
                held[entry.hold_id] = scopes
            for key in scopes:
                books[key].add(entry.cost, entry.multiplicity, entry.partitions, entry.release)
        rule = LossRule(dataset.privacy_unit, dataset.max_partitions_per_user)
        for key in set(tallies) | set(books):
            tally = tallies.get(key)
            scope = key[0] if key[0] == "lifetime" else f"{key[0]}:{key[1] or key[3]}"
            stored = _stored(session, tally, keys)
            for part in rule.parts:
                rebuilt = books[key].parts[part]
                differences += _compare(dataset.name, scope, part, stored[part], rebuilt)
        if dataset.population_id is not None:
            lifetime = books[("lifetime", 0, 0, 0)]
            k = rule.max_partitions_per_user if rule.uses_top_k else None
            loss = loss_now(rule, lifetime.state(k), _components(dataset))
            members[dataset.population_id] = members[dataset.population_id].plus(loss)
    for population in session.execute(select(Population).order_by(Population.id)).scalars():
        summed = members[population.id]
        if population.loss != summed:
            differences.append(
                Difference(
                    dataset=population.name,
                    scope="population",
                    what="loss",
                    stored=population.loss,
                    rebuilt=summed,
                )
            )
    return replayed, differences


def _components(dataset: Dataset) -> tuple[ComponentName, ...]:
    """The components of the dataset's measure, in which its loss is stated; every one if
    its accounting names no mode (edited: ``ledger verify`` reports that)."""
    try:
        return dataset.mode.components
    except (KeyError, ValueError, ArithmeticError):
        return tuple(COMPONENTS)


def _stored(session: Session, tally: Tally | None, keys: dict[int, str]) -> dict[Part, Books]:
    """A tally's T and s(p) of each part as stored (nothing for a missing tally)."""
    parts = {part: Books() for part in PARTS}
    if tally is None:
        return parts
    parts["every"].total = tally.total
    parts["joint"].total = tally.joint_total
    parts["parallel"].total = tally.parallel_total
    for row in session.execute(select(TallySpend).where(TallySpend.tally_id == tally.id)).scalars():
        for part, books in parts.items():
            books.spends[keys[row.partition_id]] = row.parts[part]
    return parts


def _compare(
    dataset: str, scope: str, part: Part, stored: Books, rebuilt: Books
) -> list[Difference]:
    """Where a part's stored T and s(p) differ from the ledger's (T, T_J, T_P; s, s_J, s_P)."""
    suffix = {"every": "", "joint": "_J", "parallel": "_P"}[part]
    found = []
    if stored.total != rebuilt.total:
        found.append(
            Difference(
                dataset=dataset,
                scope=scope,
                what=f"T{suffix}",
                stored=stored.total,
                rebuilt=rebuilt.total,
            )
        )
    for partition in set(stored.spends) | set(rebuilt.spends):
        was = stored.spends.get(partition, Amount())
        should = rebuilt.spends.get(partition, Amount())
        if was != should:
            found.append(
                Difference(
                    dataset=dataset,
                    scope=scope,
                    what=f"s{suffix}({partition})",
                    stored=was,
                    rebuilt=should,
                )
            )
    return found
