"""What a charge writes under its dataset's lock: the scopes' new totals and its ledger entry.

A grant adds the charge to every scope with one set-based upsert of s(p)
and one update of the scope rows (their new T and max s(p) computed by
``accounting.loss``); every charge, granted or denied, appends one ledger
entry. None of these statements needs another's result, so on PostgreSQL
they travel with the COMMIT in one round trip.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from accountant.accounting.loss import ScopeKey, max_after, total_after
from accountant.accounting.windows import PERIODS
from accountant.driver import Driver
from accountant.exact import Amount
from accountant.services import ledger
from accountant.services.evaluation import ChargeRequest, Evaluation


def record(
    driver: Driver, evaluation: Evaluation, request: ChargeRequest, charge_id: str, now_us: int
) -> ledger.ChainHead:
    """Append the charge's ledger entry; a grant records what produced its output. Every
    charge records the digest of the terms it was checked against, so that limits edited in
    the database show even before their first limit change. The chain's new head: the
    entry's seq and hash."""
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
    )


#: /metrics reports these counts, so that a scrape never reads the ledger.
_COUNT_CHARGE = (
    "INSERT INTO charge_counts (dataset_id, mechanism, outcome, count) "
    "VALUES (:d, :m, :o, 1) ON CONFLICT (dataset_id, mechanism, outcome) "
    "DO UPDATE SET count = charge_counts.count + 1"
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


def add_to_scopes(driver: Driver, evaluation: Evaluation, now_us: int) -> None:
    """Add a granted charge to every scope it touches, creating the partitions and scope
    rows charged for the first time."""
    dataset = evaluation.dataset
    missing = [key for key in evaluation.partitions if key not in evaluation.partition_ids]
    if missing:
        values = ", ".join(f"(:d, :k{i}, :t)" for i in range(len(missing)))
        params: dict[str, Any] = {"d": dataset.id, "t": now_us}
        params.update((f"k{i}", key) for i, key in enumerate(missing))
        driver.run(f"INSERT INTO partitions (dataset_id, key, created_at) VALUES {values}", params)
    fresh = _insert_tallies(
        driver, dataset.id, [s.key for s in evaluation.scopes if s.tally is None]
    )
    if any(key[0] == "window" for key in fresh):
        _prune_windows(driver, dataset.id, now_us // 1_000_000)
    tally_ids = [s.tally.id if s.tally is not None else fresh[s.key] for s in evaluation.scopes]
    cost, m = evaluation.priced.cost, evaluation.priced.multiplicity
    _upsert_spends(
        driver,
        dataset.id,
        tally_ids,
        cost,
        None if evaluation.all_partitions else evaluation.partitions,
    )
    rows, params = [], {}
    for i, (scope, tally_id) in enumerate(zip(evaluation.scopes, tally_ids, strict=True)):
        total = total_after(scope.state, cost, m)
        highest = max_after(scope.state, cost)
        rows.append(f"(:id{i}, :te{i}, :td{i}, :tr{i}, :me{i}, :md{i}, :mr{i})")
        params.update(
            {
                f"id{i}": tally_id,
                f"te{i}": total.epsilon,
                f"td{i}": total.delta,
                f"tr{i}": total.rho,
                f"me{i}": highest.epsilon,
                f"md{i}": highest.delta,
                f"mr{i}": highest.rho,
            }
        )
    # One statement for every scope row (VALUES names its columns column1... on both).
    driver.run(
        "UPDATE tallies SET total_epsilon = v.column2, total_delta = v.column3, "
        "total_rho = v.column4, max_epsilon = v.column5, max_delta = v.column6, "
        f"max_rho = v.column7 FROM (VALUES {', '.join(rows)}) AS v WHERE tallies.id = v.column1",
        params,
    )


def _prune_windows(driver: Driver, dataset_id: int, now: int) -> None:
    """A new window began: drop the tallies of windows that ended more than the longest
    window length ago. No charge or report reads them again (a charge reads the windows
    around its own clock, so a host whose clock lags by less than that still finds the
    window it charges), and the ledger keeps every charge."""
    old = (
        "SELECT id FROM tallies WHERE dataset_id = :d AND kind = 'window' "
        "AND window_start + period_seconds < :cutoff"
    )
    params = {"d": dataset_id, "cutoff": now - max(PERIODS.values())}
    driver.run(f"DELETE FROM tally_spends WHERE tally_id IN ({old})", params)
    driver.run(f"DELETE FROM tallies WHERE id IN ({old})", params)


def _insert_tallies(driver: Driver, dataset_id: int, keys: list[ScopeKey]) -> dict[ScopeKey, int]:
    """Rows for scopes charged for the first time (a new window, a new consumer): their ids."""
    if not keys:
        return {}
    values = ", ".join(
        f"(:d, :kind{i}, :c{i}, :p{i}, :s{i}, 0, 0, 0, 0, 0, 0)" for i in range(len(keys))
    )
    params: dict[str, Any] = {"d": dataset_id}
    for i, (kind, consumer, period, start) in enumerate(keys):
        params.update({f"kind{i}": kind, f"c{i}": consumer, f"p{i}": period, f"s{i}": start})
    rows = driver.rows(
        "INSERT INTO tallies (dataset_id, kind, consumer_id, period_seconds, window_start, "
        "total_epsilon, total_delta, total_rho, max_epsilon, max_delta, max_rho) "
        f"VALUES {values} RETURNING kind, consumer_id, period_seconds, window_start, id",
        params,
    )
    return {
        (row.kind, row.consumer_id, row.period_seconds, row.window_start): row.id for row in rows
    }


def _upsert_spends(
    driver: Driver, dataset_id: int, tally_ids: list[int], cost: Amount, keys: list[str] | None
) -> None:
    """Add the cost to s(p) of every charged partition (``keys``; None: all) in every scope:
    one statement, which finds partitions created earlier in the transaction by their key.

    ``ON CONFLICT ... DO UPDATE`` has the same syntax on SQLite and
    PostgreSQL; SQLite needs the WHERE clause of the SELECT to parse it.
    """
    only = "" if keys is None else " AND p.key IN :keys"
    params: dict[str, Any] = {
        "tallies": tally_ids,
        "dataset": dataset_id,
        "e": cost.epsilon,
        "d": cost.delta,
        "r": cost.rho,
    }
    if keys is not None:
        params["keys"] = keys
    driver.run(
        "INSERT INTO tally_spends (tally_id, partition_id, epsilon, delta, rho) "
        "SELECT t.id, p.id, :e, :d, :r FROM tallies AS t, partitions AS p "
        f"WHERE t.id IN :tallies AND p.dataset_id = :dataset{only} "
        "ON CONFLICT (tally_id, partition_id) DO UPDATE SET "
        "epsilon = tally_spends.epsilon + excluded.epsilon, "
        "delta = tally_spends.delta + excluded.delta, rho = tally_spends.rho + excluded.rho",
        params,
    )
