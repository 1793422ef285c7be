"""The charge transaction: lock, read every scope, check, write spends and ledger.

One charge is one transaction that reads top to bottom:

1. lock the dataset row (``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR
   UPDATE`` on PostgreSQL), reading with it its window budgets and the
   caller's quota. Every scope of a charge (lifetime, partitions, windows,
   the consumer's quota) belongs to one dataset, so this one lock serialises
   every charge that could touch the same totals, across processes and
   hosts, and no two charges can deadlock (each takes one lock);
2. read the charged partitions (``"*"``: those that exist now) and every
   scope row the charge may touch, each with the largest old s(p) among the
   charged partitions: a bounded read whatever the history. These reads
   depend only on the request, so they are sent right behind the lock
   statement (``send_reads``): on PostgreSQL all three come back in one
   round trip, and, being READ COMMITTED statements that start once the
   lock is granted, they see every charge committed before;
3. price the release with the mechanism's cost declaration and check every
   scope (the top-k rule reads the k largest s(p) inside and outside the
   charged set as well); a denial is ledgered and changes nothing else;
4. otherwise add the charge to every scope with one set-based upsert of
   s(p), update each scope row, and append the ledger entry. None of these
   writes needs another's result, so on PostgreSQL they travel with the
   COMMIT in one more round trip.

The caller then runs the mechanism, still inside the transaction, and
commits only once it has its output: no charge is committed without its
output, and no output is released before its charge is durable. Every statement here goes straight
through the database driver (``accountant.driver``): a simple charge holds
the lock for two round trips, as few as a bare driver-level transaction
doing the same writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from accountant.accounting import pricing
from accountant.accounting.loss import LossRule, ScopeState, loss_after, max_after
from accountant.accounting.modes import MODES, Mode
from accountant.accounting.windows import PERIODS, Window
from accountant.driver import Driver, Pending, Rows
from accountant.errors import Forbidden, field_error
from accountant.exact import Amount, ComponentName, Limit
from accountant.mechanism import Mechanism, UnusableParameters
from accountant.services import dataset_state, datasets, ledger
from accountant.services.consumers import Principal
from accountant.services.dataset_state import DatasetState

Key = tuple[str, int, int, int]  # (kind, consumer_id, period_seconds, window_start)


@dataclass(frozen=True)
class ChargeRequest:
    dataset: str
    partitions: list[str] | str
    release: str
    mechanism: Mechanism
    params: Mapping[str, Any]
    sensitivity_unit: str | None
    principal: Principal
    #: The input the mechanism will run on (None in a preview that sends none).
    data: Mapping[str, Any] | None = None
    #: The id of the noise secret the output is drawn with (recorded with a grant).
    noise_secret: str | None = None


@dataclass(frozen=True)
class _TallyRow:
    """A scope's row as read in the charge transaction: plain values, no ORM object."""

    id: int
    total: Amount
    max_spend: Amount
    max_touched: Amount  # the largest old s(p) among the charged partitions


@dataclass
class _Scope:
    key: Key
    tally: _TallyRow | None
    state: ScopeState = field(default_factory=ScopeState)


@dataclass(frozen=True)
class Evaluation:
    """Everything decided about a charge before anything is written."""

    dataset: DatasetState
    mode: Mode
    partitions: list[str]
    priced: pricing.Priced
    denial: pricing.Denial | None
    lifetime_after: Amount
    lifetime_now: Amount
    scopes: list[_Scope]
    partition_ids: dict[str, int]
    all_partitions: bool
    never_fits: bool = False
    checks: tuple[pricing.ScopeCheck, ...] = ()

    @property
    def granted(self) -> bool:
        return self.denial is None

    @property
    def remaining(self) -> Amount:
        loss = self.lifetime_after if self.granted else self.lifetime_now
        limit = self.dataset.limit
        return Amount(**{name: max(0, bound - loss[name]) for name in self.mode.components
                         if (bound := limit[name]) is not None})


@dataclass(frozen=True)
class ChargeResult:
    charge_id: str
    evaluation: Evaluation
    created_at: int


@dataclass(frozen=True)
class Reads:
    """A charge's reads, sent in this order before any is read (``send_reads``)."""

    dataset: Pending[DatasetState]
    partitions: Pending[Rows]
    scopes: Pending[Rows]
    now: float


def send_reads(driver: Driver, request: ChargeRequest, now: float, *,
               lock: bool = False) -> Reads:
    """Send the dataset's statement (``lock``: take its lock), then the charged partitions'
    and every scope row's; read none of them yet.

    They name the dataset by name, not id, so none waits for another's
    result. The scope rows are those of the windows containing ``now`` and
    the next ones, of every window length: the dataset's window budgets are
    not known yet, and the charge's own clock is read after the lock.
    """
    if request.partitions != "*":
        datasets.check_keys(list(request.partitions), "partitions")
    dataset = dataset_state.send(driver, request.dataset, request.principal.consumer_id,
                                 lock=lock)
    keys = None if request.partitions == "*" else list(request.partitions)
    partitions = driver.send(
        "SELECT key, id FROM partitions WHERE dataset_id = "
        "(SELECT id FROM datasets WHERE name = :name)"
        + (" ORDER BY id" if keys is None else " AND key IN :keys"),
        {"name": request.dataset} | ({} if keys is None else {"keys": keys}), list)
    return Reads(dataset, partitions, _send_scopes(driver, request, keys, now), now)


def _send_scopes(driver: Driver, request: ChargeRequest, keys: list[str] | None,
                 now: float) -> Pending[Rows]:
    params: dict[str, Any] = {"name": request.dataset, "c": request.principal.consumer_id}
    for i, period in enumerate(PERIODS.values()):
        start = Window.containing(period, now).start
        params.update({f"p{i}": period, f"s{i}": start, f"n{i}": start + period})
    if keys is not None:
        params["keys"] = keys
    return driver.send(_scopes_sql(keys is not None), params, list)


def _scopes_sql(touched: bool) -> str:
    """Every scope row of a dataset a charge may touch and, when ``touched``, the largest old
    s(p) of each among the charged partitions (``:keys``)."""
    windows = " OR ".join(f"(t.period_seconds = :p{i} AND t.window_start IN (:s{i}, :n{i}))"
                          for i in range(len(PERIODS)))
    maxima = ("MAX(s.epsilon), MAX(s.delta), MAX(s.rho)" if touched else "NULL, NULL, NULL")
    # Not correlated with t: the charged partitions' ids are looked up once, by key, and
    # their s(p) rows by primary key, whatever the number of partitions and charges.
    join = (" LEFT JOIN tally_spends AS s ON s.tally_id = t.id AND s.partition_id IN "
            "(SELECT p.id FROM partitions AS p WHERE p.dataset_id = "
            "(SELECT id FROM datasets WHERE name = :name) AND p.key IN :keys)"
            if touched else "")
    return ("SELECT t.id, t.kind, t.consumer_id, t.period_seconds, t.window_start, "
            "t.total_epsilon, t.total_delta, t.total_rho, t.max_epsilon, t.max_delta, "
            f"t.max_rho, {maxima} FROM tallies AS t{join} "
            "WHERE t.dataset_id = (SELECT id FROM datasets WHERE name = :name) AND "
            "(t.kind = 'lifetime' OR (t.kind = 'consumer' AND t.consumer_id = :c) OR "
            f"(t.kind = 'window' AND t.consumer_id = 0 AND ({windows})))"
            + (" GROUP BY t.id" if touched else ""))


def evaluate(driver: Driver, reads: Reads, request: ChargeRequest,
             now: float) -> Evaluation:
    """Price ``request`` and check it against every scope, writing nothing."""
    dataset = reads.dataset.result()
    principal = request.principal
    if not principal.may_read(dataset.id):
        raise Forbidden(f"dataset {dataset.name!r} is not granted to {principal.name!r}; "
                        "ask an admin for a grant")
    mode = MODES[dataset.accounting]
    rule = dataset.rule
    ids, keys, all_partitions = _resolve(reads.partitions.result(), dataset, request.partitions)
    try:
        priced = pricing.price(request.mechanism, request.params, request.sensitivity_unit, mode,
                               rule, dataset.max_records_per_user, request.release, len(keys))
    except pricing.PricingError as error:
        raise field_error(error.field, str(error)) from None
    prepare(request.mechanism, priced.run_params, request.data)
    windows = [Window.containing(w.period_seconds, now) for w in dataset.windows]
    rows = reads.scopes.result()
    if any(w.start > Window.containing(w.period, reads.now).end for w in windows):
        # The lock took longer than a window to come: read the scopes of this one.
        rows = _send_scopes(driver, request, None if all_partitions else keys, now).result()
    scopes = _read_scopes(driver, rows, rule, mode.components, principal.consumer_id,
                          windows, list(ids.values()), len(keys), all_partitions)
    by_key = {scope.key: scope for scope in scopes}
    cost, m, names = priced.cost, priced.multiplicity, mode.components

    def check(scope_name: str, key: Key, limit: Limit, **extra: Any) -> pricing.ScopeCheck:
        state = by_key[key].state
        return pricing.ScopeCheck(scope_name, limit, loss_after(rule, state, Amount(), 0, names),
                                  loss_after(rule, state, cost, m, names), **extra)

    lifetime_key: Key = ("lifetime", 0, 0, 0)
    checks = [check("dataset", lifetime_key, dataset.limit)]
    partition_limit = dataset.partition_limit
    if partition_limit is not None:
        checks.append(_partition_check(driver, by_key[lifetime_key], partition_limit, cost,
                                       names, ids, keys))
    quota = dataset.quota if dataset.id in principal.granted else None
    if quota is not None:
        checks.append(check("consumer", ("consumer", principal.consumer_id, 0, 0), quota))
    for budget, window in zip(dataset.windows, windows, strict=True):
        checks.append(check("window", ("window", 0, window.period, window.start), budget.limit,
                            window=window))
    denial = pricing.first_denial(checks, cost, names)
    never = denial is not None and denial.limit.is_exceeded_by(
        loss_after(rule, ScopeState(), cost, m, names), names)
    return Evaluation(dataset, mode, keys, priced, denial, checks[0].after, checks[0].spent,
                      scopes, ids, all_partitions, never, tuple(checks))


def prepare(mechanism: Mechanism, run_params: Mapping[str, Any],
            data: Mapping[str, Any] | None) -> None:
    """The mechanism's own check that it can run these parameters on this input: a 400
    naming the field and the usable range, before anything is charged."""
    if mechanism.prepare is None:
        return
    try:
        mechanism.prepare(run_params, data)
    except UnusableParameters as error:
        raise field_error(error.field, str(error)) from None
    except (ValueError, ArithmeticError) as error:
        raise field_error("params", f"mechanism {mechanism.name!r} cannot run with these "
                                    f"parameters: {error}") from None


def charge(driver: Driver, reads: Reads, request: ChargeRequest, now_us: int) -> ChargeResult:
    """Evaluate and record one charge from ``reads`` sent under the dataset lock; the caller
    commits, then runs the mechanism."""
    dataset = reads.dataset.result()
    if not request.principal.may_charge(dataset.id):
        raise Forbidden(f"{request.principal.name!r} (role {request.principal.role}) may not "
                        f"charge dataset {dataset.name!r}; ask an admin for a grant")
    evaluation = evaluate(driver, reads, request, now_us / 1e6)
    charge_id = str(uuid.uuid4())
    actor = ledger.Actor(request.principal.consumer_id, request.principal.name)
    status = "granted" if evaluation.granted else "denied"
    if evaluation.granted:
        _apply(driver, evaluation, request.principal.consumer_id, now_us)
    ledger.append(
        driver, dataset, actor, kind="charge", status=status, created_at=now_us,
        charge_id=charge_id, mechanism=request.mechanism.name, release=request.release,
        partitions=evaluation.partitions, params=_plain_params(request),
        cost=evaluation.priced.cost, multiplicity=evaluation.priced.multiplicity,
        detail={} if evaluation.denial is None else _denial_detail(evaluation),
        noise_secret=request.noise_secret if evaluation.granted else None,
        implementation=request.mechanism.implementation if evaluation.granted else None,
        loss_after=evaluation.lifetime_after if evaluation.granted else evaluation.lifetime_now,
    )
    return ChargeResult(charge_id, evaluation, now_us)


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


def _resolve(rows: Rows, dataset: DatasetState,
             requested: list[str] | str) -> tuple[dict[str, int], list[str], bool]:
    """(ids of existing charged partitions by key, the charged keys, whether P is "*")."""
    if requested == "*":
        if not rows:
            raise field_error("partitions", f"'*' resolved to no partition: dataset "
                              f"{dataset.name!r} has none yet; declare them with "
                              f"POST /v1/datasets/{dataset.name}/partitions or name them")
        return dict(rows), [row[0] for row in rows], True
    return dict(rows), list(requested), False


def _read_scopes(driver: Driver, rows: Rows, rule: LossRule,
                 names: tuple[ComponentName, ...], consumer_id: int, windows: list[Window],
                 touched_ids: list[int], n: int, all_partitions: bool) -> list[_Scope]:
    keys: list[Key] = [("lifetime", 0, 0, 0), ("consumer", consumer_id, 0, 0)]
    keys += [("window", 0, w.period, w.start) for w in windows]
    found = {(row[1], row[2], row[3], row[4]): _TallyRow(
                 row[0], Amount(row[5], row[6], row[7]), Amount(row[8], row[9], row[10]),
                 Amount(row[11] or 0, row[12] or 0, row[13] or 0))
             for row in rows}
    scopes = [_Scope(key, found.get(key)) for key in keys]
    existing = [s for s in scopes if s.tally is not None]
    for scope in existing:
        tally = scope.tally
        assert tally is not None
        max_touched = tally.max_spend if all_partitions else tally.max_touched
        inside: dict[ComponentName, list[int]] = {}
        outside: dict[ComponentName, list[int]] = {}
        if rule.uses_top_k:
            k = rule.max_partitions_per_user
            assert k is not None
            for name in names:
                inside[name], outside[name] = _top_k(driver, tally.id, name, k, touched_ids,
                                                     all_partitions)
                inside[name] += [0] * (min(k, n) - len(inside[name]))
        scope.state = ScopeState(tally.total, tally.max_spend, max_touched, outside, inside)
    for scope in scopes:
        if scope.tally is None and rule.uses_top_k:
            k = rule.max_partitions_per_user
            assert k is not None
            scope.state = ScopeState(top_inside={name: [0] * min(k, n) for name in names})
    return scopes


def _top_k(driver: Driver, tally_id: int, name: str, k: int, touched_ids: list[int],
           all_partitions: bool) -> tuple[list[int], list[int]]:
    """The k largest s(p) inside and outside the charged set (an index range scan each)."""
    base = f"SELECT {name} FROM tally_spends WHERE tally_id = :t"
    order = f" ORDER BY {name} DESC LIMIT :k"
    def column(sql: str) -> list[int]:
        params = {"t": tally_id, "k": k} | ({"p": touched_ids} if ":p" in sql else {})
        return [row[0] for row in driver.rows(sql, params)]

    if all_partitions:
        return column(base + order), []
    if not touched_ids:
        return [], column(base + order)
    return (column(base + " AND partition_id IN :p" + order),
            column(base + " AND partition_id NOT IN :p" + order))


def _partition_check(driver: Driver, lifetime: _Scope, limit: Limit, cost: Amount,
                     names: tuple[ComponentName, ...], ids: dict[str, int],
                     keys: list[str]) -> pricing.ScopeCheck:
    """The per-partition limit: the charged partition with the largest s(p) after the charge."""
    state = lifetime.state
    after = Amount(**{name: state.max_touched[name] + cost[name] for name in names})
    if not limit.is_exceeded_by(after, names) or lifetime.tally is None or not ids:
        return pricing.ScopeCheck("partition", limit, state.max_touched, after, partition=keys[0])
    # Denied: name the first charged partition (in request order) that would go over.
    spends = {row[0]: Amount(row[1], row[2], row[3]) for row in driver.rows(
        "SELECT partition_id, epsilon, delta, rho FROM tally_spends "
        "WHERE tally_id = :t AND partition_id IN :p",
        {"t": lifetime.tally.id, "p": list(ids.values())})}
    for key in keys:
        spent = spends.get(ids.get(key, -1), Amount())
        if limit.is_exceeded_by(spent.plus(cost), names):
            return pricing.ScopeCheck("partition", limit, spent, spent.plus(cost), partition=key)
    return pricing.ScopeCheck("partition", limit, state.max_touched, after, partition=keys[0])


def _apply(driver: Driver, evaluation: Evaluation, consumer_id: int, now_us: int) -> None:
    dataset = evaluation.dataset
    missing = [key for key in evaluation.partitions if key not in evaluation.partition_ids]
    if missing:
        values = ", ".join(f"(:d, :k{i}, :t)" for i in range(len(missing)))
        params: dict[str, Any] = {"d": dataset.id, "t": now_us}
        params.update((f"k{i}", key) for i, key in enumerate(missing))
        driver.run(f"INSERT INTO partitions (dataset_id, key, created_at) VALUES {values}",
                   params)
    fresh = _insert_tallies(driver, dataset.id,
                            [s.key for s in evaluation.scopes if s.tally is None])
    tally_ids = [s.tally.id if s.tally is not None else fresh[s.key] for s in evaluation.scopes]
    cost, m = evaluation.priced.cost, evaluation.priced.multiplicity
    _upsert_spends(driver, dataset.id, tally_ids, cost,
                   None if evaluation.all_partitions else evaluation.partitions)
    rows, params = [], {}
    for i, (scope, tally_id) in enumerate(zip(evaluation.scopes, tally_ids, strict=True)):
        total = scope.state.total.plus(cost.scaled(m))
        highest = max_after(scope.state, cost)
        rows.append(f"(:id{i}, :te{i}, :td{i}, :tr{i}, :me{i}, :md{i}, :mr{i})")
        params.update({f"id{i}": tally_id, f"te{i}": total.epsilon, f"td{i}": total.delta,
                       f"tr{i}": total.rho, f"me{i}": highest.epsilon,
                       f"md{i}": highest.delta, f"mr{i}": highest.rho})
    # One statement for every scope row (VALUES names its columns column1... on both).
    driver.run(
        "UPDATE tallies SET total_epsilon = v.column2, total_delta = v.column3, "
        "total_rho = v.column4, max_epsilon = v.column5, max_delta = v.column6, "
        f"max_rho = v.column7 FROM (VALUES {', '.join(rows)}) AS v WHERE tallies.id = v.column1",
        params)


def _insert_tallies(driver: Driver, dataset_id: int, keys: list[Key]) -> dict[Key, int]:
    """Rows for scopes charged for the first time (a new window, a new consumer): their ids."""
    if not keys:
        return {}
    values = ", ".join(f"(:d, :kind{i}, :c{i}, :p{i}, :s{i}, 0, 0, 0, 0, 0, 0)"
                       for i in range(len(keys)))
    params: dict[str, Any] = {"d": dataset_id}
    for i, (kind, consumer, period, start) in enumerate(keys):
        params.update({f"kind{i}": kind, f"c{i}": consumer, f"p{i}": period, f"s{i}": start})
    rows = driver.rows(
        "INSERT INTO tallies (dataset_id, kind, consumer_id, period_seconds, window_start, "
        "total_epsilon, total_delta, total_rho, max_epsilon, max_delta, max_rho) "
        f"VALUES {values} RETURNING kind, consumer_id, period_seconds, window_start, id", params)
    return {(row[0], row[1], row[2], row[3]): row[4] for row in rows}


def _upsert_spends(driver: Driver, dataset_id: int, tally_ids: list[int], cost: Amount,
                   keys: list[str] | None) -> None:
    """Add the cost to s(p) of every charged partition (``keys``; None: all) in every scope:
    one statement, which finds partitions created earlier in the transaction by their key.

    ``ON CONFLICT ... DO UPDATE`` has the same syntax on SQLite and
    PostgreSQL; SQLite needs the WHERE clause of the SELECT to parse it.
    """
    only = "" if keys is None else " AND p.key IN :keys"
    params: dict[str, Any] = {"tallies": tally_ids, "dataset": dataset_id, "e": cost.epsilon,
                              "d": cost.delta, "r": cost.rho}
    if keys is not None:
        params["keys"] = keys
    driver.run(
        "INSERT INTO tally_spends (tally_id, partition_id, epsilon, delta, rho) "
        "SELECT t.id, p.id, :e, :d, :r FROM tallies AS t, partitions AS p "
        f"WHERE t.id IN :tallies AND p.dataset_id = :dataset{only} "
        "ON CONFLICT (tally_id, partition_id) DO UPDATE SET "
        "epsilon = tally_spends.epsilon + excluded.epsilon, "
        "delta = tally_spends.delta + excluded.delta, rho = tally_spends.rho + excluded.rho",
        params)
