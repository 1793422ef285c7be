"""What the dashboard's dataset page shows besides the budget report, aggregated in SQL."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session

from accountant.accounting import checks as rules
from accountant.exact import Amount
from accountant.models import (
    Consumer,
    Dataset,
    Grant,
    Hold,
    LedgerEntry,
    Partition,
    Population,
    Tally,
    TallySpend,
)
from accountant.services import holds, ledger
from accountant.services.grants import quota_use
from accountant.services.ledger_reads import Owners, describe_entry

DAY_US = 86_400 * 1_000_000


@dataclass(frozen=True, kw_only=True)
class DatasetActivity:
    """A dataset's activity, in units of its measure (epsilon, or rho for zcdp).

    Args:
        charged_per_day: by day since the epoch, the cost x multiplicity granted.
        top_partitions: the partitions with the largest lifetime s(p), at most 20.
        consumer_totals: what each consumer's charges added to T.
        recent: the 20 latest ledger entries, described, newest first.
    """

    charged_per_day: dict[int, int]
    top_partitions: list[tuple[str, int]]
    consumer_totals: list[tuple[str, int]]
    recent: list[dict[str, Any]]


def activity(
    session: Session, dataset: Dataset, measure: str, *, by_key: bool = False
) -> DatasetActivity:
    cost = getattr(LedgerEntry, f"cost_{measure}")
    day = LedgerEntry.created_at // DAY_US
    per_day = session.execute(
        select(
            day,
            func.sum(
                case(
                    (LedgerEntry.kind == "settle", -cost * LedgerEntry.multiplicity),
                    else_=cost * LedgerEntry.multiplicity,
                )
            ),
        )
        .where(
            LedgerEntry.dataset_id == dataset.id,
            ledger.CHANGES_TOTALS,
        )
        .group_by(day)
        .order_by(day)
    ).all()
    lifetime = session.execute(
        select(Tally.id).where(Tally.dataset_id == dataset.id, Tally.kind == "lifetime")
    ).scalar_one()
    spend = getattr(TallySpend, measure)
    top = session.execute(
        select(Partition.key, spend)
        .join(
            TallySpend,
            (TallySpend.partition_id == Partition.id) & (TallySpend.tally_id == lifetime),
        )
        .order_by(Partition.key if by_key else spend.desc())
        .limit(20)
    ).all()
    shares = session.execute(
        select(Consumer.name, getattr(Tally, f"total_{measure}"))
        .join(Consumer, Consumer.id == Tally.consumer_id)
        .where(Tally.dataset_id == dataset.id, Tally.kind == "consumer")
    ).all()
    recent = session.execute(
        ledger.query(ledger.LedgerFilter(dataset_id=dataset.id, limit=20))
        .order_by(None)
        .order_by(LedgerEntry.id.desc())
    ).all()
    return DatasetActivity(
        charged_per_day={int(bucket): int(total or 0) for bucket, total in per_day},
        top_partitions=[(key, int(value)) for key, value in top],
        consumer_totals=[(name, int(total)) for name, total in shares],
        recent=[describe_entry(entry, dataset, consumer) for entry, _name, consumer in recent],
    )


#: Limit changes a dataset page lists at most, newest first (the ledger page has them all).
LIMIT_CHANGES = 50


def limit_changes(session: Session, dataset: Dataset) -> list[dict[str, Any]]:
    """The dataset's latest limit changes, described (each with its reason), newest first."""
    rows = session.execute(
        ledger.query(ledger.LedgerFilter(dataset_id=dataset.id, limit=LIMIT_CHANGES))
        .where(LedgerEntry.kind == "limit_change")
        .order_by(None)
        .order_by(LedgerEntry.id.desc())
    ).all()
    return [describe_entry(entry, dataset, consumer) for entry, _name, consumer in rows]


#: Points of the loss-over-time chart at most: the ledger is read grouped, never whole.
LOSS_POINTS = 240


def loss_history(session: Session, dataset: Dataset, until_us: int) -> list[tuple[int, Amount]]:
    """(time in microseconds, lifetime loss after it) from the dataset's creation to
    ``until_us``: the loss after the last entry of each of at most LOSS_POINTS equal spans.
    The last entry of a span is the one with the largest id (entries of a dataset are
    written in order, under its lock); not the largest loss of the span, since a settle
    lowers the loss. Entries from before loss_after was stored are left out."""
    start = dataset.created_at
    span = max(1, until_us - start)
    bucket = (LedgerEntry.created_at - start) * LOSS_POINTS // span
    last = (
        select(func.max(LedgerEntry.id))
        .where(LedgerEntry.dataset_id == dataset.id, LedgerEntry.loss_after_epsilon.is_not(None))
        .group_by(bucket)
    )
    rows = session.execute(
        select(
            LedgerEntry.created_at,
            LedgerEntry.loss_after_epsilon,
            LedgerEntry.loss_after_delta,
            LedgerEntry.loss_after_rho,
        )
        .where(LedgerEntry.id.in_(last.scalar_subquery()))
        .order_by(LedgerEntry.id)
    ).all()
    return [
        (int(at), Amount(int(epsilon or 0), int(delta or 0), int(rho or 0)))
        for at, epsilon, delta, rho in rows
    ]


def population_of(session: Session, dataset: Dataset) -> Population | None:
    """The population ``dataset`` joined at its creation, or None."""
    if dataset.population_id is None:
        return None
    return session.get(Population, dataset.population_id)


def population_loss_history(
    session: Session, population: Population, until_us: int
) -> list[tuple[int, Amount]]:
    """(time in microseconds, the population's loss then) from its creation to
    ``until_us``, at the end of each of at most LOSS_POINTS equal spans that saw an entry of
    a member dataset.

    The population's loss is the sum of its datasets' lifetime losses (DESIGN.md), and each
    member's entries carry that dataset's lifetime loss after them (``loss_after``). So at
    the end of a span the population's loss is the sum, over its members, of the
    ``loss_after`` of each member's last entry up to then: its last entry (largest id, as
    ``loss_history`` takes it) in the latest span in which it has one. The ledger is read
    grouped, one row per member and span, so the cost does not grow with the ledger; the
    last point is the sum of every member's latest loss, the population's loss now. Each
    point is at the time of the last entry of its span."""
    start = population.created_at
    span = max(1, until_us - start)
    bucket = (LedgerEntry.created_at - start) * LOSS_POINTS // span
    members = select(Dataset.id).where(Dataset.population_id == population.id)
    last = (
        select(func.max(LedgerEntry.id))
        .where(
            LedgerEntry.dataset_id.in_(members.scalar_subquery()),
            LedgerEntry.loss_after_epsilon.is_not(None),
        )
        .group_by(LedgerEntry.dataset_id, bucket)
    )
    rows = session.execute(
        select(
            LedgerEntry.dataset_id,
            LedgerEntry.created_at,
            LedgerEntry.loss_after_epsilon,
            LedgerEntry.loss_after_delta,
            LedgerEntry.loss_after_rho,
        )
        .where(LedgerEntry.id.in_(last.scalar_subquery()))
        .order_by(LedgerEntry.id)
    ).all()
    spans: dict[int, list[tuple[int, int, Amount]]] = {}
    for dataset_id, at, epsilon, delta, rho in rows:
        # the same span as the statement's, in integers: floor division of non-negatives
        spans.setdefault((int(at) - start) * LOSS_POINTS // span, []).append(
            # dataset_id is never None here: the statement reads member datasets' entries
            (dataset_id or 0, int(at), Amount(int(epsilon or 0), int(delta or 0), int(rho or 0)))
        )
    latest: dict[int, Amount] = {}
    points = []
    for index in sorted(spans):
        for dataset_id, _at, loss in spans[index]:
            latest[dataset_id] = loss
        total = Amount()
        for loss in latest.values():
            total = total.plus(loss)
        points.append((max(at for _, at, _ in spans[index]), total))
    return points


def population_limit_changes(session: Session, population: Population) -> list[dict[str, Any]]:
    """The population's latest limit changes (its own chain, its creation first of them),
    described, newest first, at most LIMIT_CHANGES."""
    rows = session.execute(
        ledger.query(ledger.LedgerFilter(population_id=population.id, limit=LIMIT_CHANGES))
        .where(LedgerEntry.kind == "limit_change")
        .order_by(None)
        .order_by(LedgerEntry.id.desc())
    ).all()
    return [describe_entry(entry, population, consumer) for entry, _name, consumer in rows]


def partitions_at_limit(session: Session, dataset: Dataset) -> list[str]:
    """The keys of the partitions whose lifetime spend is at the partition limit
    (``checks.at_limit``: in a component the dataset's mode binds), at most 20, by key; none
    without a partition limit."""
    limit = dataset.partition_limit if dataset.has_partition_limit else None
    if limit is None:
        return []
    reached = [  # checks.at_limit, as SQL over every partition's spend
        getattr(TallySpend, name) >= bound
        for name, bound in rules.bounds(limit, dataset.mode.components).items()
        if bound > 0
    ]
    if not reached:
        return []
    return list(
        session.execute(
            select(Partition.key)
            .join(TallySpend, TallySpend.partition_id == Partition.id)
            .join(Tally, (Tally.id == TallySpend.tally_id) & (Tally.kind == "lifetime"))
            .where(Partition.dataset_id == dataset.id, or_(*reached))
            .order_by(Partition.key)
            .limit(20)
        ).scalars()
    )


def quotas(session: Session, dataset: Dataset) -> list[tuple[str, dict[str, Any]]]:
    """Each consumer with a quota on ``dataset``: its name and its quota's use."""
    grants = session.execute(
        select(Grant, Consumer.name)
        .join(Consumer, Consumer.id == Grant.consumer_id)
        .where(Grant.dataset_id == dataset.id, Grant.has_quota)
        .order_by(Consumer.name)
    ).all()
    return [(name, quota_use(session, grant, dataset)) for grant, name in grants]


#: Holds a dataset page lists at most, open ones first (GET /v1/holds has them all).
HOLDS = 50


def dataset_holds(session: Session, dataset: Dataset, now_us: int) -> list[dict[str, Any]]:
    """The dataset's holds as the API describes them (``holds.describe``), at most HOLDS:
    the open ones first, then the expired (open, past ``expires_at``: still charged), then
    the settled, each newest first. Ordered in SQL, so that no open hold is left out behind
    settled ones."""
    rank = case(
        (and_(Hold.state == "open", Hold.expires_at > now_us), 0),
        (Hold.state == "open", 1),
        else_=2,
    )
    rows = session.execute(
        select(Hold, Consumer.name)
        .outerjoin(Consumer, Consumer.id == Hold.consumer_id)
        .where(Hold.dataset_id == dataset.id)
        .order_by(rank, Hold.created_at.desc(), Hold.id)
        .limit(HOLDS)
    ).all()
    return [holds.describe(hold, dataset, consumer, now_us) for hold, consumer in rows]


@dataclass(frozen=True, kw_only=True)
class LedgerView:
    """A page of the dashboard's ledger, newest first, with what its links need.

    Args:
        entries: the page's entries, described.
        count: how many entries match the filters.
        newer: whether entries newer than this page exist.
        older: whether entries older than this page exist.
    """

    entries: list[dict[str, Any]]
    count: int
    newer: bool
    older: bool


def ledger_view(
    session: Session,
    filters: ledger.LedgerFilter,
    *,
    before: int | None = None,
    after: int | None = None,
    oldest: bool = False,
) -> LedgerView:
    """Up to ``filters.limit`` entries, newest first: the newest (no position), those just
    before id ``before`` (older), those just after id ``after`` (newer), or the oldest."""
    if after is not None or oldest:
        page_filter = replace(filters, after_id=after or 0, newest_first=False)
    else:
        page_filter = replace(filters, before_id=before, newest_first=True)
    rows = list(session.execute(ledger.query(page_filter)).all())
    if not page_filter.newest_first:
        rows.reverse()
    owners = Owners(session)
    entries = [
        describe_entry(
            entry,
            owners.of(entry),
            consumer,
        )
        for entry, _name, consumer in rows
    ]
    plain = replace(filters, limit=1)
    count = session.execute(ledger.count(filters)).scalar_one()
    newer = older = False
    if entries:
        newer = bool(
            session.execute(ledger.query(replace(plain, after_id=entries[0]["id"]))).first()
        )
        older = bool(
            session.execute(ledger.query(replace(plain, before_id=entries[-1]["id"]))).first()
        )
    return LedgerView(entries=entries, count=count, newer=newer, older=older)


def names(session: Session) -> tuple[list[str], list[str]]:
    """Every chain's name (each dataset's and population's, and the admins' chain once it
    is begun) and every consumer's, sorted: the ledger filter's choices."""
    chains = [
        name for owner, _ in ledger.OWNERS for name in session.execute(select(owner.name)).scalars()
    ]
    return (
        sorted(chains),
        list(session.execute(select(Consumer.name).order_by(Consumer.name)).scalars()),
    )
