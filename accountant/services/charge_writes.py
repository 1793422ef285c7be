"""What a charge writes under its dataset's lock: the scopes' new totals and its ledger entry.

A grant first creates the partitions and scope rows charged for the first
time (``open_scopes``), then adds the charge to every scope with one
set-based upsert of s(p) (and of s_J(p) or s_P(p), by its release kind) and
one update of the scope rows (their new T, T_J, T_P and max s(p) computed by
``accounting.loss``); every charge, granted or denied,
appends one ledger entry. None of these last statements depends on
another's writes, so on PostgreSQL they run as one (``Driver.together``),
sent with the COMMIT in one round trip.
"""

from __future__ import annotations

import functools
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnClause,
    Select,
    bindparam,
    case,
    delete,
    insert,
    literal_column,
    select,
    update,
)

from accountant.accounting.loss import Part, ScopeKey, holds, max_after, total_after
from accountant.accounting.windows import PERIODS
from accountant.driver import Driver, Statement, statement, upsert
from accountant.exact import COMPONENTS, Amount
from accountant.key_hashing import KeyHasher
from accountant.models import ChargeCount, Partition, Tally, TallySpend
from accountant.models.tally import PART_PREFIXES
from accountant.services import ledger
from accountant.services.evaluation import ChargeRequest, Evaluation


def record(
    driver: Driver,
    evaluation: Evaluation,
    request: ChargeRequest,
    charge_id: str,
    now_us: int,
    hasher: KeyHasher,
) -> ledger.ChainHead:
    """Append the charge's ledger entry; a grant records what produced its output. Every
    charge records the digest of the terms it was checked against, so that limits edited in
    the database show even before their first limit change. The chain's new head, sealed
    with ``hasher`` in the statement that advances it: the entry's seq and hash."""
    granted = evaluation.granted
    driver.run(
        _COUNT_CHARGE,
        {
            "d": evaluation.dataset.id,
            "m": request.mechanism.name,
            "o": "granted" if granted else "denied",
        },
    )
    detail = {} if granted else _denial_detail(evaluation)
    detail["terms_sha256"] = evaluation.dataset.terms_sha256
    return ledger.append(
        driver,
        evaluation.dataset,
        ledger.Actor(request.principal.consumer_id, request.principal.name),
        kind="charge",
        status="granted" if granted else "denied",
        created_at=now_us,
        charge_id=charge_id,
        mechanism=request.mechanism.name,
        release=request.release,
        partitions=evaluation.partitions,
        params=_plain_params(request),
        cost=evaluation.priced.cost,
        multiplicity=evaluation.priced.multiplicity,
        detail=detail,
        noise_secret=request.noise_secret if granted else None,
        implementation=request.mechanism.implementation if granted else None,
        loss_after=evaluation.lifetime_after if granted else evaluation.lifetime_now,
        hasher=hasher,
    )


_ONE: ColumnClause[Any] = literal_column("1")

#: /metrics reports these counts, so that a scrape never reads the ledger.
_COUNT_CHARGE = upsert(
    lambda insert: (
        insert(ChargeCount)
        .values(
            dataset_id=bindparam("d"), mechanism=bindparam("m"), outcome=bindparam("o"), count=_ONE
        )
        .on_conflict_do_update(
            index_elements=[ChargeCount.dataset_id, ChargeCount.mechanism, ChargeCount.outcome],
            set_={ChargeCount.count: ChargeCount.count + _ONE},
        )
    )
)


def _plain_params(request: ChargeRequest) -> dict[str, Any]:
    params = {k: str(v) if isinstance(v, Decimal) else v for k, v in request.params.items()}
    if request.sensitivity_unit is not None:
        params["sensitivity_unit"] = request.sensitivity_unit
    return params


def _denial_detail(evaluation: Evaluation) -> dict[str, Any]:
    denial = evaluation.denial
    assert denial is not None
    detail: dict[str, Any] = {"scope": denial.scope}
    if denial.partition is not None:
        detail["partition"] = denial.partition
    if denial.window is not None:
        detail["window_start"] = denial.window.start
        detail["period"] = denial.window.name
    return detail


def open_scopes(driver: Driver, evaluation: Evaluation, now_us: int) -> list[int]:
    """Create the partitions and scope rows a granted charge touches for the first time;
    the ids of its scope rows, in the order of ``evaluation.scopes``."""
    dataset = evaluation.dataset
    missing = [key for key in evaluation.partitions if key not in evaluation.partition_ids]
    if missing:
        params: dict[str, Any] = {"d": dataset.id, "t": now_us}
        params.update((f"k{i}", key) for i, key in enumerate(missing))
        driver.run(_insert_partitions(len(missing)), params)
    fresh = _insert_tallies(
        driver, dataset.id, [s.key for s in evaluation.scopes if s.tally is None]
    )
    if any(key[0] == "window" for key in fresh):
        _prune_windows(driver, dataset.id, now_us // 1_000_000)
    return [s.tally.id if s.tally is not None else fresh[s.key] for s in evaluation.scopes]


def add_to_scopes(driver: Driver, evaluation: Evaluation, tally_ids: list[int]) -> None:
    """Add a granted charge to every scope it touches (``open_scopes`` gave their ids): two
    statements, neither of which depends on the other's writes."""
    cost, m = evaluation.priced.cost, evaluation.priced.multiplicity
    release, kept = evaluation.checker.release, evaluation.checker.rule.parts
    _upsert_spends(
        driver,
        evaluation.dataset.id,
        tally_ids,
        cost,
        release,
        kept,
        None if evaluation.all_partitions else evaluation.partitions,
    )
    params: dict[str, Any] = {}
    for i, (scope, tally_id) in enumerate(zip(evaluation.scopes, tally_ids, strict=True)):
        state = scope.state
        values = {
            prefix: total_after(state, cost, m, part, release)
            if part in kept
            else state.part_total(part)
            for prefix, part in _TOTALS.items()
        }
        values["m"] = max_after(state, cost)
        params[f"id{i}"] = tally_id
        for prefix, amount in values.items():
            params.update(
                {
                    f"{prefix}e{i}": amount.epsilon,
                    f"{prefix}d{i}": amount.delta,
                    f"{prefix}r{i}": amount.rho,
                }
            )
    driver.run(_update_tallies(len(tally_ids)), params)


@functools.lru_cache(maxsize=64)
def _insert_partitions(count: int) -> Statement:
    """Partitions charged for the first time: ``count`` rows in one statement."""
    rows: list[dict[Any, Any]] = [
        {
            Partition.dataset_id: bindparam("d"),
            Partition.key: bindparam(f"k{i}"),
            Partition.created_at: bindparam("t"),
        }
        for i in range(count)
    ]
    return statement(insert(Partition).values(rows))


#: The parameters' prefixes of T, T_J and T_P.
_TOTALS: dict[str, Part] = {"t": "every", "tj": "joint", "tp": "parallel"}

#: Each scope row's new totals (T, T_J, T_P) and maxima, by its id: one CASE per column.
_TALLY_COLUMNS = {
    "te": Tally.total_epsilon,
    "td": Tally.total_delta,
    "tr": Tally.total_rho,
    "me": Tally.max_epsilon,
    "md": Tally.max_delta,
    "mr": Tally.max_rho,
    "tje": Tally.total_joint_epsilon,
    "tjd": Tally.total_joint_delta,
    "tjr": Tally.total_joint_rho,
    "tpe": Tally.total_parallel_epsilon,
    "tpd": Tally.total_parallel_delta,
    "tpr": Tally.total_parallel_rho,
}


@functools.lru_cache(maxsize=16)
def _update_tallies(count: int) -> Statement:
    """Every scope row of a charge, updated in one statement (:id{i} and its new values)."""
    ids: list[BindParameter[Any]] = [bindparam(f"id{i}") for i in range(count)]
    return statement(
        update(Tally)
        .where(Tally.id.in_(ids))
        .values(
            {
                column: case(*((Tally.id == ids[i], bindparam(f"{name}{i}")) for i in range(count)))
                for name, column in _TALLY_COLUMNS.items()
            }
        )
    )


def _prune_windows(driver: Driver, dataset_id: int, now: int) -> None:
    """A new window began: drop the tallies of windows that ended more than the longest
    window length ago. No charge or report reads them again (a charge reads the windows
    around its own clock, so a host whose clock lags by less than that still finds the
    window it charges), and the ledger keeps every charge."""
    params = {"d": dataset_id, "cutoff": now - max(PERIODS.values())}
    driver.run(_PRUNE_SPENDS, params)
    driver.run(_PRUNE_TALLIES, params)


_ENDED = select(Tally.id).where(
    Tally.dataset_id == bindparam("d"),
    Tally.kind == literal_column("'window'"),
    Tally.window_start + Tally.period_seconds < bindparam("cutoff"),
)
_PRUNE_SPENDS = statement(delete(TallySpend).where(TallySpend.tally_id.in_(_ENDED)))
_PRUNE_TALLIES = statement(delete(Tally).where(Tally.id.in_(_ENDED)))


def _insert_tallies(driver: Driver, dataset_id: int, keys: list[ScopeKey]) -> dict[ScopeKey, int]:
    """Rows for scopes charged for the first time (a new window, a new consumer): their ids."""
    if not keys:
        return {}
    params: dict[str, Any] = {"d": dataset_id}
    for i, (kind, consumer, period, start) in enumerate(keys):
        params.update({f"kind{i}": kind, f"c{i}": consumer, f"p{i}": period, f"s{i}": start})
    rows = driver.rows(_insert_tallies_statement(len(keys)), params)
    return {
        (row.kind, row.consumer_id, row.period_seconds, row.window_start): row.id for row in rows
    }


@functools.lru_cache(maxsize=16)
def _insert_tallies_statement(count: int) -> Statement:
    """``count`` new scope rows, their totals at the tables' default (0); their ids back."""
    rows: list[dict[Any, Any]] = [
        {
            Tally.dataset_id: bindparam("d"),
            Tally.kind: bindparam(f"kind{i}"),
            Tally.consumer_id: bindparam(f"c{i}"),
            Tally.period_seconds: bindparam(f"p{i}"),
            Tally.window_start: bindparam(f"s{i}"),
        }
        for i in range(count)
    ]
    return statement(
        insert(Tally)
        .values(rows)
        .returning(
            Tally.kind, Tally.consumer_id, Tally.period_seconds, Tally.window_start, Tally.id
        )
    )


def _upsert_spends(
    driver: Driver,
    dataset_id: int,
    tally_ids: list[int],
    cost: Amount,
    release: str,
    kept: tuple[Part, ...],
    keys: list[str] | None,
) -> None:
    """Add the cost to s(p) and, of the ``kept`` parts, to s_J(p) or s_P(p) by the
    ``release`` kind, of every charged partition (``keys``; None: all) in every scope: one
    statement, which finds partitions created earlier in the transaction by their key."""
    params: dict[str, Any] = {"tallies": tally_ids, "dataset": dataset_id}
    for part in kept:  # each column's increment, bound by the column's name
        added = cost if holds(part, release) else Amount()
        params.update({f"{PART_PREFIXES[part]}{name}": added[name] for name in COMPONENTS})
    if keys is not None:
        params["keys"] = keys
    driver.run(_upsert_spends_statement(keys is not None, kept), params)


@functools.lru_cache(maxsize=4)
def _upsert_spends_statement(some: bool, kept: tuple[Part, ...]) -> Statement:
    """The cost added to the ``kept`` parts' spends (:epsilon, :joint_epsilon, ...) of every
    scope (:tallies) and partition (:keys if ``some``) (SQLite needs the WHERE clause of the
    SELECT to parse ``ON CONFLICT``). A dataset without the top-k rule keeps s(p) alone, so
    its charges never touch the other parts' columns or indexes."""
    spends = [f"{PART_PREFIXES[part]}{name}" for part in kept for name in COMPONENTS]
    charged: Select[Any] = select(  # type: ignore[assignment]  # typed by its columns
        Tally.id, Partition.id, *(bindparam(column) for column in spends)
    ).where(
        Tally.id.in_(bindparam("tallies", expanding=True)),
        Partition.dataset_id == bindparam("dataset"),
    )
    if some:
        charged = charged.where(Partition.key.in_(bindparam("keys", expanding=True)))

    def build(insert: Any) -> Any:
        rows = insert(TallySpend).from_select(["tally_id", "partition_id", *spends], charged)
        return rows.on_conflict_do_update(
            index_elements=[TallySpend.tally_id, TallySpend.partition_id],
            set_={
                name: getattr(TallySpend, name) + getattr(rows.excluded, name) for name in spends
            },
        )

    return upsert(build)
