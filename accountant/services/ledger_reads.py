"""The ledger as its readers see it: entries described, pages, the export's rows, and the
first bad entry of a failed verification.

Besides the datasets' chains the ledger holds one chain per population, which records its
limit changes. Its entries are described as a dataset's are, under the population's name
(the ``dataset`` their hash covers: populations and datasets share one namespace of
names), with ``"population": true``, which is ``false`` on a dataset's entries. One more
chain, named ``_admins``, records each approved new admin consumer and admin key (kind
``admin_change``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from accountant.db import begin_snapshot
from accountant.errors import NotFound
from accountant.key_hashing import KeyHasher
from accountant.ledger_readable import readable
from accountant.models import (
    AdminChain,
    ChargeCount,
    Consumer,
    Dataset,
    LedgerEntry,
    Population,
)
from accountant.services import ledger
from accountant.services.ledger import LedgerFilter
from accountant.services.verification import verify


def describe_entry(
    entry: LedgerEntry, dataset: Dataset | Population | AdminChain, consumer: str | None
) -> dict[str, Any]:
    """One entry as the API, the export and the dashboard state it (docs/ledger.md), in the
    chain of ``dataset``: a dataset's, or a population's (``"population": true``; its
    ``loss_after`` is the population's loss, the sum of its datasets' lifetime losses)."""
    mode, delta = dataset.mode, dataset.limit_delta or 0
    shown = readable(
        kind=entry.kind,
        status=entry.status,
        hold_id=entry.hold_id,
        cost=entry.cost,
        multiplicity=entry.multiplicity,
        detail=entry.detail,
        created_at_us=entry.created_at,
        mode=mode,
        delta=delta,
    )
    return {
        "id": entry.id,
        "seq": entry.seq,
        "kind": entry.kind,
        "charge_id": entry.charge_id,
        "dataset": dataset.name,
        # not hashed: whether the chain is a population's (its name is in "dataset")
        "population": isinstance(dataset, Population),
        "consumer": consumer,
        "status": entry.status,
        "mechanism": entry.mechanism,
        "release": entry.release,
        "partitions": entry.partitions,
        "cost": shown["cost"],
        "multiplicity": entry.multiplicity,
        "charged": shown["charged"],
        "loss_after": None
        if (after := entry.loss_after) is None
        else mode.labelled(mode.report(after, delta), after),
        "detail": entry.detail or None,
        "created_at": shown["created_at"],
        "noise_secret": entry.noise_secret,
        "implementation": entry.implementation,
        "hold_id": entry.hold_id,
        "batch_id": shown["batch_id"],
        "group": shown["group"],
        "prev_hash": entry.prev_hash,
        "hash": entry.hash,
        # what the hash covers, in the form it covers it (docs/ledger.md)
        "params": entry.params,
        "cost_units": [entry.cost_epsilon, entry.cost_delta, entry.cost_rho],
        "created_at_us": entry.created_at,
        "reason": shown["reason"],
    }


def ids_of(
    session: Session, dataset: str | None, consumer: str | None
) -> tuple[int | None, int | None]:
    """The ids of a filter's dataset and consumer, each None when not named."""
    dataset_id = consumer_id = None
    if dataset is not None:
        dataset_id = session.execute(select(Dataset.id).where(Dataset.name == dataset)).scalar()
        if dataset_id is None:
            raise NotFound(f"no dataset named {dataset!r}")
    if consumer is not None:
        consumer_id = session.execute(select(Consumer.id).where(Consumer.name == consumer)).scalar()
        if consumer_id is None:
            raise NotFound(f"no consumer named {consumer!r}")
    return dataset_id, consumer_id


def named_chain(session: Session, name: str) -> ledger.Chain:
    """The chain named ``name``: a dataset's or a population's (one namespace), or the
    admins' chain; a 404 if none has that name."""
    chain = ledger.chain_of(session, name)
    if chain is None:
        raise NotFound(f"no dataset or population named {name!r}")
    return chain


class Owners:
    """Every dataset, population and admins' chain by id, to describe entries of any one's
    chain."""

    def __init__(self, session: Session) -> None:
        self.datasets = {d.id: d for d in session.execute(select(Dataset)).scalars()}
        self.populations = {p.id: p for p in session.execute(select(Population)).scalars()}
        self.admin_chains = {c.id: c for c in session.execute(select(AdminChain)).scalars()}

    def of(self, entry: LedgerEntry) -> Dataset | Population | AdminChain:
        if entry.population_id is not None:
            return self.populations[entry.population_id]
        if entry.admin_chain_id is not None:
            return self.admin_chains[entry.admin_chain_id]
        assert entry.dataset_id is not None
        return self.datasets[entry.dataset_id]


def page(session: Session, filters: LedgerFilter) -> tuple[list[dict[str, Any]], str | None]:
    """One page of entries and the cursor of the next (None on the last page)."""
    owners = Owners(session)
    rows = session.execute(ledger.query(filters)).all()
    entries = [describe_entry(entry, owners.of(entry), consumer) for entry, _name, consumer in rows]
    return entries, str(rows[-1][0].id) if len(rows) == filters.limit else None


def export_rows(
    session: Session, filters: LedgerFilter, heads: dict[str, dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """Every entry ``filters`` selects up to its chain's head in ``heads`` (``export_end``),
    described, read 1000 at a time: each page in a read transaction of its own (never a
    snapshot held for a whole download), its objects forgotten after it, so memory stays
    flat. An entry past its chain's head is left out: ids are drawn before commit, so an
    entry of another chain with an id below the export's last may commit after its heads
    were read; a chain's own entries commit in ``seq`` order, under its owner's row lock."""
    after, left = filters.after_id, filters.limit
    while left > 0:
        owners = Owners(session)
        page_filter = replace(filters, after_id=after, limit=min(1000, left))
        rows = session.execute(ledger.query(page_filter)).all()
        described = [
            describe_entry(entry, owners.of(entry), consumer)
            for entry, name, consumer in rows
            if entry.seq <= heads.get(name, {"seq": 0})["seq"]
        ]
        last_id = rows[-1][0].id if rows else after
        session.rollback()
        session.expunge_all()
        yield from described
        if len(rows) < page_filter.limit:
            return
        after, left = last_id, left - len(rows)


def verification(session: Session, hasher: KeyHasher) -> dict[str, Any]:
    """``verify`` (seals included) as the API reports it, with the first bad entry
    described."""
    begin_snapshot(session)
    result = verify(session, hasher=hasher)
    if result.ok:
        return {
            "ok": True,
            "entries": result.entries,
            "heads": result.heads,
            "seals_checked": result.seals_checked,
        }
    bad = None
    if result.first_bad is not None:
        consumer = session.execute(
            select(Consumer.name).where(Consumer.id == result.first_bad.consumer_id)
        ).scalar()
        bad = describe_entry(result.first_bad, Owners(session).of(result.first_bad), consumer)
    return {
        "ok": False,
        "entries": result.entries,
        "dataset": result.dataset,
        "reason": result.reason,
        "first_bad_entry": bad,
        "seals_checked": result.seals_checked,
    }


def charge_counts(session: Session) -> list[tuple[str, str, str, int]]:
    """(dataset, mechanism, outcome, count) of every charge, as each charge counted itself:
    no ledger read."""
    rows = session.execute(
        select(Dataset.name, ChargeCount.mechanism, ChargeCount.outcome, ChargeCount.count).join(
            Dataset, Dataset.id == ChargeCount.dataset_id
        )
    ).all()
    return [(dataset, mechanism, outcome, count) for dataset, mechanism, outcome, count in rows]


def schema_revision(session: Session) -> str | None:
    """The migration the database is at."""
    revision: str | None = session.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return revision


def export_end(session: Session, filters: LedgerFilter) -> tuple[int, dict[str, Any]]:
    """(the last entry's id now, the head at that entry of each chain ``filters`` reads:
    every dataset's, population's and the admins', or the one chain it names; its seq and
    hash, by its owner's name). An export stops at that id, so that what it contains and
    the heads it is signed with describe the same moment."""
    through = session.execute(select(func.max(LedgerEntry.id))).scalar() or 0
    last = (
        select(
            LedgerEntry.dataset_id,
            LedgerEntry.population_id,
            LedgerEntry.admin_chain_id,
            func.max(LedgerEntry.id).label("id"),
        )
        .where(LedgerEntry.id <= through)
        .group_by(LedgerEntry.dataset_id, LedgerEntry.population_id, LedgerEntry.admin_chain_id)
    )
    if filters.dataset_id is not None:
        last = last.where(LedgerEntry.dataset_id == filters.dataset_id)
    elif filters.population_id is not None:
        last = last.where(LedgerEntry.population_id == filters.population_id)
    elif filters.admin_chain_id is not None:
        last = last.where(LedgerEntry.admin_chain_id == filters.admin_chain_id)
    ends = last.subquery()
    owner = ledger.OWNER_NAME
    rows = session.execute(
        select(owner, LedgerEntry.seq, LedgerEntry.hash)
        .join(ends, ends.c.id == LedgerEntry.id)
        .outerjoin(Dataset, Dataset.id == LedgerEntry.dataset_id)
        .outerjoin(Population, Population.id == LedgerEntry.population_id)
        .outerjoin(AdminChain, AdminChain.id == LedgerEntry.admin_chain_id)
        .order_by(owner)
    ).all()
    return through, {name: {"seq": seq, "hash": hash_} for name, seq, hash_ in rows}
