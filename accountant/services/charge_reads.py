"""A charge's reads under its dataset's lock: what ``accounting.decide`` needs, as plain values.

``read`` sends, without waiting for any of them:

1. the statement that locks the dataset's row (``BEGIN IMMEDIATE`` on
   SQLite, ``FOR UPDATE`` on PostgreSQL) and reads it, one row per window
   budget, joined to its population's row (if it has one), the caller's
   consumer (its role), its grant and quota, and its API key, read again
   here so that a key revoked before the lock charges nothing
   (``KnownKeys``). Every scope of a charge belongs to one dataset, so this
   one lock serialises every charge that could touch the same totals,
   across processes and hosts. On PostgreSQL a statement before it locks
   the dataset's population, the one scope shared with other datasets:
   populations are always locked before datasets, so no two charges
   deadlock;
2. the charged partitions that exist, each with its s(p) in the lifetime
   scope when the dataset has a per-partition limit (decided in the
   statement itself, so that no other charge reads them);
3. every scope row the charge may touch, each with the largest old s(p)
   among the charged partitions: a bounded read whatever the history;
4. with an idempotency key, the response remembered for it;
5. for a charge that draws on a hold, the hold's row. Every write to a hold
   happens under its dataset's lock, so this read is as good as its own lock.

They name the dataset by name, not id, so none waits for another's
result: on PostgreSQL all of them come back in one round trip and, being
READ COMMITTED statements that start once the lock is granted, they see
every charge committed before. A dataset with the top-k rule then reads, for
each scope, the k largest s(p), s_J(p) and s_P(p) inside and outside the
charged set (``top_k_reads``), every one sent before any is read: one more
round trip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ScalarSelect,
    and_,
    bindparam,
    func,
    literal_column,
    null,
    or_,
    select,
)
from sqlalchemy.orm import aliased

from accountant.accounting.charge_inputs import (
    Caller,
    ChargeReads,
    ChargeRequest,
    DatasetState,
    PopulationState,
    ScopeRow,
    WindowLimit,
)
from accountant.accounting.decide import scope_keys, windows_at
from accountant.accounting.holds import HoldState
from accountant.accounting.windows import PERIODS, Window
from accountant.clock import Clock
from accountant.driver import Driver, Pending, Rows
from accountant.errors import NotFound, Unauthorized
from accountant.exact import Amount, Limit
from accountant.models import (
    ApiKey,
    Consumer,
    Dataset,
    Grant,
    Hold,
    Partition,
    Population,
    Tally,
    TallySpend,
    WindowBudget,
)
from accountant.services import idempotency, top_k_reads
from accountant.services.api_keys import UNKNOWN_KEY
from accountant.statements import Statement, statement


def read(
    driver: Driver, request: ChargeRequest, clock: Clock, *, outside: set[str] | None = None
) -> ChargeReads | idempotency.Remembered:
    """Lock ``request``'s dataset and read what its charge needs; or, for an idempotency key
    seen before, the response remembered for it. A 404 for a dataset that does not exist,
    then a 401 for a key revoked since it was authenticated. The charge's time is read from
    ``clock`` once the lock is held. ``outside``: the names of datasets known to belong to
    no population, which need no population lock (``send_dataset``)."""
    sent = _send(driver, request, clock.now_us() / 1e6, lock=True, outside=outside)
    # Sent after the lock: a duplicate that waited for it sees the first one's row.
    key, caller = request.key, request.principal
    remembered = None if key is None else idempotency.find(driver, caller.consumer_id, key)
    dataset = sent.dataset.result()  # no such dataset: a 404 before anything else
    if not dataset.key_valid:  # revoked since it was read, or remembered (``KnownKeys``)
        raise Unauthorized(UNKNOWN_KEY)
    if remembered is not None and (first := remembered.result()) is not None:
        return first
    return _complete(driver, sent, dataset, request, clock.now_us())


def read_unlocked(driver: Driver, request: ChargeRequest, now_us: int) -> ChargeReads:
    """What ``read`` reads, as it stands at ``now_us``, without the lock (a preview)."""
    sent = _send(driver, request, now_us / 1e6, lock=False)
    return _complete(driver, sent, sent.dataset.result(), request, now_us)


@dataclass(frozen=True)
class _Sent:
    """A charge's first reads, sent in this order before any is read."""

    dataset: Pending[DatasetState]
    partitions: Pending[Rows]
    scopes: Pending[Rows]
    keys: list[str] | None  # the charged partitions' keys (None: "*")
    at: float  # the clock's reading they were sent at (seconds)
    hold: Pending[HoldState | None] | None = None  # the hold a charge draws on


def _send(
    driver: Driver,
    request: ChargeRequest,
    now: float,
    *,
    lock: bool,
    outside: set[str] | None = None,
) -> _Sent:
    """Send the dataset's statement (``lock``: take its lock), then the charged partitions'
    and every scope row's; read none of them yet. The scope rows are those of the windows
    containing ``now`` and the next ones, of every window length: the dataset's window
    budgets are not known yet, and the charge's own clock is read after the lock."""
    caller, name = request.principal, request.dataset
    dataset = send_dataset(driver, name, caller, lock=lock, outside=outside)
    keys = None if request.partitions == "*" else list(request.partitions)
    params = {"name": name} | ({} if keys is None else {"keys": keys})
    partitions = driver.send(_PARTITIONS[keys is not None], params, list)
    scopes = _send_scopes(driver, name, caller.consumer_id, keys, now)
    hold = None if request.draw is None else send_hold(driver, request.draw)
    return _Sent(dataset, partitions, scopes, keys, now, hold)


def send_dataset(
    driver: Driver, name: str, caller: Caller, *, lock: bool, outside: set[str] | None = None
) -> Pending[DatasetState]:
    """Send the statement that reads dataset ``name`` with ``caller``'s role, grant, quota
    and key, and its population's row (``lock``: and takes the dataset's lock, after its
    population's); a 404 when read, if there is none. ``outside``: the names of datasets
    known to belong to no population, to which a dataset read as such is added: a dataset
    joins a population only when it is created, so theirs is never locked again."""
    if lock and driver.postgres and (outside is None or name not in outside):
        # Every writer of a member dataset's loss locks the population first, and a batch
        # locks every population before any dataset: no two of them deadlock. (SQLite's
        # write lock is the transaction's.)
        driver.send(_LOCK_POPULATION, {"name": name}, list)

    def state(rows: Rows) -> DatasetState:
        read = _state(name, rows)
        if outside is not None and read.population is None:
            outside.add(name)
        return read

    return driver.send(
        _DATASET[lock],
        {"name": name, "consumer": caller.consumer_id, "key": caller.key_id},
        state,
    )


def send_hold(driver: Driver, hold_id: str) -> Pending[HoldState | None]:
    """Send the read of hold ``hold_id`` (None when read, if there is none). Every write to
    a hold happens under its dataset's lock, so under that lock this read is current."""
    return driver.send(_HOLD, {"id": hold_id}, _hold)


def _complete(
    driver: Driver, sent: _Sent, dataset: DatasetState, request: ChargeRequest, now_us: int
) -> ChargeReads:
    """The reads ``sent`` began, with the top-k rule's, as one plain value."""
    found = sent.partitions.result()
    ids = {row.key: row.id for row in found}
    spends = {
        row.key: Amount(row.epsilon, row.delta, row.rho) for row in found if row.epsilon is not None
    }
    windows = windows_at(dataset, now_us)
    rows = sent.scopes.result()
    if any(w.start > Window.containing(w.period, sent.at).end for w in windows):
        # The lock took longer than a window to come: read the scopes of this one.
        rows = _send_scopes(
            driver, dataset.name, request.principal.consumer_id, sent.keys, now_us / 1e6
        ).result()
    wanted = set(scope_keys(request.principal.consumer_id, windows))
    # the charged partitions that exist, told apart from the others (not for "*")
    touched = [] if sent.keys is None else list(ids.values())
    tops = (
        top_k_reads.send(driver, dataset, rows, wanted, touched) if dataset.rule.uses_top_k else {}
    )
    scopes = {}
    for row in rows:
        key = (row.kind, row.consumer_id, row.period_seconds, row.window_start)
        if key in wanted:
            inside, outside = top_k_reads.tops(dataset, tops[key]) if key in tops else ({}, {})
            scopes[key] = ScopeRow(
                id=row.id,
                total=Amount(row.total_epsilon, row.total_delta, row.total_rho),
                max_spend=Amount(row.max_epsilon, row.max_delta, row.max_rho),
                max_touched=Amount(
                    row.touched_epsilon or 0, row.touched_delta or 0, row.touched_rho or 0
                ),
                joint_total=Amount(
                    row.total_joint_epsilon, row.total_joint_delta, row.total_joint_rho
                ),
                parallel_total=Amount(
                    row.total_parallel_epsilon, row.total_parallel_delta, row.total_parallel_rho
                ),
                inside=inside,
                outside=outside,
            )
    return ChargeReads(
        dataset=dataset,
        now_us=now_us,
        partitions=ids,
        scopes=scopes,
        spends=spends,
        hold=None if sent.hold is None else sent.hold.result(),
    )


_HOLD = statement(select(Hold).where(Hold.id == bindparam("id")))


def _hold(rows: Rows) -> HoldState | None:
    if not rows:
        return None
    row = rows[0]
    partitions = json.loads(row.partitions) if isinstance(row.partitions, str) else row.partitions
    return HoldState(
        id=row.id,
        dataset_id=row.dataset_id,
        consumer_id=row.consumer_id,
        release=row.release,
        partitions=tuple(partitions),
        amount=Amount(row.amount_epsilon, row.amount_delta, row.amount_rho),
        drawn=Amount(row.drawn_epsilon, row.drawn_delta, row.drawn_rho),
        state=row.state,
        expires_at=row.expires_at,
        multiplicity=row.multiplicity,
        mechanism=row.mechanism,
        params=idempotency.decode_params(
            json.loads(row.params) if isinstance(row.params, str) else row.params
        ),
        scopes=tuple(
            (kind, consumer, period, start)
            for kind, consumer, period, start in (
                json.loads(row.scopes) if isinstance(row.scopes, str) else row.scopes
            )
        ),
    )


def _state(name: str, rows: Rows) -> DatasetState:
    if not rows:
        raise NotFound(f"no dataset named {name!r}; list datasets with GET /v1/datasets")
    d = rows[0]
    windows = tuple(
        WindowLimit(w.period_seconds, Limit(w.window_epsilon, w.window_delta, w.window_rho))
        for w in rows
        if w.period_seconds is not None
    )
    return DatasetState(
        id=d.id,
        name=d.name,
        privacy_unit=d.privacy_unit,
        accounting=d.accounting,
        rdp_order=d.rdp_order,
        composition_delta=d.composition_delta,
        max_partitions_per_user=d.max_partitions_per_user,
        max_records_per_user=d.max_records_per_user,
        limit=Limit(d.limit_epsilon, d.limit_delta, d.limit_rho),
        partition_limit=Limit(
            d.partition_limit_epsilon, d.partition_limit_delta, d.partition_limit_rho
        )
        if d.has_partition_limit
        else None,
        windows=windows,
        ledger_seq=d.ledger_seq,
        ledger_head=d.ledger_head,
        head_seal=d.head_seal,
        terms_sha256=d.terms_sha256,
        quota=Limit(d.quota_epsilon, d.quota_delta, d.quota_rho) if d.has_quota else None,
        granted=d.granted is not None,
        key_valid=d.key_id is not None,
        role=d.role,
        population=None
        if d.population_id is None
        else PopulationState(
            id=d.population_id,
            name=d.population_name,
            limit=Limit(
                d.population_limit_epsilon, d.population_limit_delta, d.population_limit_rho
            ),
            loss=Amount(d.population_loss_epsilon, d.population_loss_delta, d.population_loss_rho),
        ),
    )


def _dataset_statement(lock: bool) -> Statement:
    """The dataset by name, one row per window budget, with one consumer's role, grant and
    quota and one unrevoked API key; ``lock`` takes the dataset row's lock on PostgreSQL
    (SQLite's write lock is the transaction's)."""
    query = (
        select(
            Dataset.id,
            Dataset.name,
            Dataset.privacy_unit,
            Dataset.accounting,
            Dataset.rdp_order,
            Dataset.composition_delta,
            Dataset.max_partitions_per_user,
            Dataset.max_records_per_user,
            Dataset.limit_epsilon,
            Dataset.limit_delta,
            Dataset.limit_rho,
            Dataset.has_partition_limit,
            Dataset.partition_limit_epsilon,
            Dataset.partition_limit_delta,
            Dataset.partition_limit_rho,
            Dataset.ledger_seq,
            Dataset.ledger_head,
            Dataset.head_seal,
            Dataset.terms_sha256,
            WindowBudget.period_seconds,
            WindowBudget.limit_epsilon.label("window_epsilon"),
            WindowBudget.limit_delta.label("window_delta"),
            WindowBudget.limit_rho.label("window_rho"),
            Consumer.role,
            Grant.dataset_id.label("granted"),
            Grant.has_quota,
            Grant.quota_epsilon,
            Grant.quota_delta,
            Grant.quota_rho,
            ApiKey.id.label("key_id"),
            Population.id.label("population_id"),
            Population.name.label("population_name"),
            Population.limit_epsilon.label("population_limit_epsilon"),
            Population.limit_delta.label("population_limit_delta"),
            Population.limit_rho.label("population_limit_rho"),
            Population.loss_epsilon.label("population_loss_epsilon"),
            Population.loss_delta.label("population_loss_delta"),
            Population.loss_rho.label("population_loss_rho"),
        )
        .select_from(Dataset)
        .outerjoin(Population, Population.id == Dataset.population_id)
        .outerjoin(WindowBudget, WindowBudget.dataset_id == Dataset.id)
        .outerjoin(Consumer, Consumer.id == bindparam("consumer"))
        .outerjoin(
            Grant, and_(Grant.dataset_id == Dataset.id, Grant.consumer_id == bindparam("consumer"))
        )
        .outerjoin(ApiKey, and_(ApiKey.id == bindparam("key"), ApiKey.revoked_at.is_(None)))
        .where(Dataset.name == bindparam("name"))
        .order_by(WindowBudget.period_seconds)
    )
    return statement(query.with_for_update(of=Dataset) if lock else query)


def _dataset_id() -> ScalarSelect[int]:
    """The id of the dataset named :name, so that no read waits for another's result."""
    return select(Dataset.id).where(Dataset.name == bindparam("name")).scalar_subquery()


def _partitions_statement(some: bool) -> Statement:
    """(key, id) of the charged partitions that exist (:keys), or of every partition, each
    with its s(p) in the lifetime scope if the dataset has a per-partition limit (else
    NULL: the join is empty, and no s(p) is read)."""
    lifetime = aliased(Tally)
    limited = (
        select(Dataset.has_partition_limit)
        .where(Dataset.name == bindparam("name"))
        .scalar_subquery()
    )
    query = (
        select(Partition.key, Partition.id, TallySpend.epsilon, TallySpend.delta, TallySpend.rho)
        .select_from(Partition)
        .outerjoin(
            lifetime,
            and_(
                lifetime.dataset_id == Partition.dataset_id,
                lifetime.kind == literal_column("'lifetime'"),
                limited,
            ),
        )
        .outerjoin(
            TallySpend,
            and_(TallySpend.tally_id == lifetime.id, TallySpend.partition_id == Partition.id),
        )
        .where(Partition.dataset_id == _dataset_id())
    )
    if some:
        return statement(query.where(Partition.key.in_(bindparam("keys", expanding=True))))
    return statement(query.order_by(Partition.id))


def _send_scopes(
    driver: Driver, name: str, consumer_id: int, keys: list[str] | None, now: float
) -> Pending[Rows]:
    params: dict[str, Any] = {"name": name, "c": consumer_id}
    for i, period in enumerate(PERIODS.values()):
        start = Window.containing(period, now).start
        params.update({f"p{i}": period, f"s{i}": start, f"n{i}": start + period})
    if keys is not None:
        params["keys"] = keys
    return driver.send(_SCOPES[keys is not None], params, list)


def _scopes_statement(touched: bool) -> Statement:
    """Every scope row of a dataset a charge may touch and, when ``touched``, the largest old
    s(p) of each among the charged partitions (``:keys``)."""
    windows = or_(
        *(
            and_(
                Tally.period_seconds == bindparam(f"p{i}"),
                Tally.window_start.in_([bindparam(f"s{i}"), bindparam(f"n{i}")]),
            )
            for i in range(len(PERIODS))
        )
    )
    components = ("epsilon", "delta", "rho")
    maxima = [
        (func.max(getattr(TallySpend, name)) if touched else null()).label(f"touched_{name}")
        for name in components
    ]
    query = select(
        Tally.id,
        Tally.kind,
        Tally.consumer_id,
        Tally.period_seconds,
        Tally.window_start,
        Tally.total_epsilon,
        Tally.total_delta,
        Tally.total_rho,
        Tally.max_epsilon,
        Tally.max_delta,
        Tally.max_rho,
        Tally.total_joint_epsilon,
        Tally.total_joint_delta,
        Tally.total_joint_rho,
        Tally.total_parallel_epsilon,
        Tally.total_parallel_delta,
        Tally.total_parallel_rho,
        *maxima,
    )
    if touched:
        # Not correlated with the tally: the charged partitions' ids are looked up once, by
        # key, and their s(p) rows by primary key, whatever the number of partitions.
        charged_ids = select(Partition.id).where(
            Partition.dataset_id == _dataset_id(),
            Partition.key.in_(bindparam("keys", expanding=True)),
        )
        query = query.outerjoin(
            TallySpend,
            and_(TallySpend.tally_id == Tally.id, TallySpend.partition_id.in_(charged_ids)),
        ).group_by(Tally.id)
    return statement(
        query.where(
            Tally.dataset_id == _dataset_id(),
            or_(
                Tally.kind == literal_column("'lifetime'"),
                and_(
                    Tally.kind == literal_column("'consumer'"), Tally.consumer_id == bindparam("c")
                ),
                and_(
                    Tally.kind == literal_column("'window'"),
                    Tally.consumer_id == literal_column("0"),
                    windows,
                ),
            ),
        )
    )


_DATASET = {lock: _dataset_statement(lock) for lock in (False, True)}
#: The lock of the population of the dataset named :name (no row: it has none).
_LOCK_POPULATION = statement(
    select(Population.id)
    .where(
        Population.id
        == select(Dataset.population_id).where(Dataset.name == bindparam("name")).scalar_subquery()
    )
    .with_for_update()
)
_PARTITIONS = {some: _partitions_statement(some) for some in (False, True)}
_SCOPES = {touched: _scopes_statement(touched) for touched in (False, True)}
