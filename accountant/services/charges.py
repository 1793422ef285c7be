"""The charge transaction: lock, read every scope, check, write spends and ledger.

One charge is one transaction that reads top to bottom:

1. lock the dataset row (``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR
   UPDATE`` on PostgreSQL). Every scope of a charge (lifetime, partitions,
   windows, the consumer's quota) belongs to one dataset, so this one lock
   serialises every charge that could touch the same totals, across
   processes and hosts, and no two charges can deadlock (each takes one lock);
2. resolve the partitions (``"*"`` to those that exist now) and price the
   release with the mechanism's cost declaration;
3. read the scopes' running totals: one row per scope, the largest old s(p)
   among the charged partitions, and for the top-k rule the k largest s(p)
   inside and outside the charged set: a bounded read whatever the history;
4. check every scope; a denial is ledgered and changes nothing else;
5. otherwise add the charge to every scope with one set-based upsert of
   s(p), update each scope row, and append the ledger entry.

The caller commits, and only then runs the mechanism: no noise exists
before its cost is durably recorded.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy import BindParameter, and_, bindparam, insert, or_, select, text
from sqlalchemy.orm import Session

from accountant.accounting import pricing
from accountant.accounting.loss import LossRule, ScopeState, loss_after, max_after
from accountant.accounting.modes import MODES, Mode
from accountant.accounting.windows import Window
from accountant.errors import Forbidden, field_error
from accountant.exact import Amount, ComponentName, Limit
from accountant.mechanism import Mechanism
from accountant.models import Dataset, Grant, Partition, Tally
from accountant.services import datasets, ledger
from accountant.services.consumers import Principal

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


@dataclass(frozen=True)
class _TallyRow:
    """A scope's row as read in the charge transaction: plain values, no ORM object."""

    id: int
    total: Amount
    max_spend: Amount


@dataclass
class _Scope:
    key: Key
    tally: _TallyRow | None
    state: ScopeState = field(default_factory=ScopeState)


@dataclass(frozen=True)
class Evaluation:
    """Everything decided about a charge before anything is written."""

    dataset: Dataset
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


def evaluate(session: Session, dataset: Dataset, request: ChargeRequest, now: float) -> Evaluation:
    """Price ``request`` and check it against every scope, writing nothing."""
    principal = request.principal
    if not principal.may_read(dataset.id):
        raise Forbidden(f"dataset {dataset.name!r} is not granted to {principal.name!r}; "
                        "ask an admin for a grant")
    mode = MODES[dataset.accounting]
    rule = datasets.rule_of(dataset)
    ids, keys, all_partitions = _resolve(session, dataset, request.partitions)
    try:
        priced = pricing.price(request.mechanism, request.params, request.sensitivity_unit, mode,
                               rule, dataset.max_records_per_user, request.release, len(keys))
    except pricing.PricingError as error:
        raise field_error(error.field, str(error)) from None
    windows = [Window.containing(w.period_seconds, now) for w in dataset.windows]
    scopes = _read_scopes(session, dataset, rule, mode.components, principal.consumer_id,
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
        checks.append(_partition_check(session, by_key[lifetime_key], partition_limit, cost,
                                       names, ids, keys))
    quota = _quota(session, dataset, principal)
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


def charge(session: Session, dataset: Dataset, request: ChargeRequest,
           now_us: int) -> ChargeResult:
    """Evaluate and record one charge on the locked ``dataset``; the caller commits, then
    runs the mechanism."""
    if not request.principal.may_charge(dataset.id):
        raise Forbidden(f"{request.principal.name!r} (role {request.principal.role}) may not "
                        f"charge dataset {dataset.name!r}; ask an admin for a grant")
    evaluation = evaluate(session, dataset, request, now_us / 1e6)
    charge_id = str(uuid.uuid4())
    actor = ledger.Actor(request.principal.consumer_id, request.principal.name)
    status = "granted" if evaluation.granted else "denied"
    if evaluation.granted:
        _apply(session, evaluation, request.principal.consumer_id, now_us)
    ledger.append(
        session, dataset, actor, kind="charge", status=status, created_at=now_us,
        charge_id=charge_id, mechanism=request.mechanism.name, release=request.release,
        partitions=evaluation.partitions, params=_plain_params(request),
        cost=evaluation.priced.cost, multiplicity=evaluation.priced.multiplicity,
        detail={} if evaluation.denial is None else _denial_detail(evaluation),
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


def _resolve(session: Session, dataset: Dataset,
             requested: list[str] | str) -> tuple[dict[str, int], list[str], bool]:
    """(ids of existing charged partitions by key, the charged keys, whether P is "*")."""
    if requested == "*":
        rows = session.execute(select(Partition.key, Partition.id).where(
            Partition.dataset_id == dataset.id).order_by(Partition.id)).all()
        if not rows:
            raise field_error("partitions", f"'*' resolved to no partition: dataset "
                              f"{dataset.name!r} has none yet; declare them with "
                              f"POST /v1/datasets/{dataset.name}/partitions or name them")
        return {row.key: row.id for row in rows}, [row.key for row in rows], True
    keys = list(requested)
    datasets.check_keys(keys, "partitions")
    ids = {row.key: row.id for row in session.execute(select(Partition.key, Partition.id).where(
        Partition.dataset_id == dataset.id, Partition.key.in_(keys)))}
    return ids, keys, False


def _quota(session: Session, dataset: Dataset, principal: Principal) -> Limit | None:
    if dataset.id not in principal.granted:
        return None
    grant = session.execute(select(Grant).where(
        Grant.consumer_id == principal.consumer_id, Grant.dataset_id == dataset.id)
    ).scalar_one_or_none()
    return None if grant is None else grant.quota


def _read_scopes(session: Session, dataset: Dataset, rule: LossRule,
                 names: tuple[ComponentName, ...], consumer_id: int, windows: list[Window],
                 touched_ids: list[int], n: int, all_partitions: bool) -> list[_Scope]:
    keys: list[Key] = [("lifetime", 0, 0, 0), ("consumer", consumer_id, 0, 0)]
    keys += [("window", 0, w.period, w.start) for w in windows]
    conditions = [Tally.kind == "lifetime",
                  and_(Tally.kind == "consumer", Tally.consumer_id == consumer_id)]
    conditions += [and_(Tally.kind == "window", Tally.period_seconds == w.period,
                        Tally.window_start == w.start) for w in windows]
    found = {(row.kind, row.consumer_id, row.period_seconds, row.window_start): _TallyRow(
                 row.id, Amount(row.total_epsilon, row.total_delta, row.total_rho),
                 Amount(row.max_epsilon, row.max_delta, row.max_rho))
             for row in session.execute(select(
                 Tally.id, Tally.kind, Tally.consumer_id, Tally.period_seconds,
                 Tally.window_start, Tally.total_epsilon, Tally.total_delta, Tally.total_rho,
                 Tally.max_epsilon, Tally.max_delta, Tally.max_rho).where(
                 Tally.dataset_id == dataset.id, or_(*conditions)))}
    scopes = [_Scope(key, found.get(key)) for key in keys]
    existing = [s for s in scopes if s.tally is not None]
    touched_max: dict[int, Amount] = {}
    if existing and touched_ids and not all_partitions:
        rows = session.execute(text(
            "SELECT tally_id, MAX(epsilon), MAX(delta), MAX(rho) FROM tally_spends "
            "WHERE tally_id IN :tallies AND partition_id IN :partitions GROUP BY tally_id"
        ).bindparams(bindparam("tallies", expanding=True), bindparam("partitions", expanding=True)),
            {"tallies": [s.tally.id for s in existing if s.tally], "partitions": touched_ids})
        touched_max = {row[0]: Amount(row[1], row[2], row[3]) for row in rows}
    for scope in existing:
        tally = scope.tally
        assert tally is not None
        max_touched = tally.max_spend if all_partitions else touched_max.get(tally.id, Amount())
        inside: dict[ComponentName, list[int]] = {}
        outside: dict[ComponentName, list[int]] = {}
        if rule.uses_top_k:
            k = rule.max_partitions_per_user
            assert k is not None
            for name in names:
                inside[name], outside[name] = _top_k(session, tally.id, name, k, touched_ids,
                                                     all_partitions)
                inside[name] += [0] * (min(k, n) - len(inside[name]))
        scope.state = ScopeState(tally.total, tally.max_spend, max_touched, outside, inside)
    for scope in scopes:
        if scope.tally is None and rule.uses_top_k:
            k = rule.max_partitions_per_user
            assert k is not None
            scope.state = ScopeState(top_inside={name: [0] * min(k, n) for name in names})
    return scopes


def _top_k(session: Session, tally_id: int, name: str, k: int, touched_ids: list[int],
           all_partitions: bool) -> tuple[list[int], list[int]]:
    """The k largest s(p) inside and outside the charged set (an index range scan each)."""
    base = f"SELECT {name} FROM tally_spends WHERE tally_id = :t"
    order = f" ORDER BY {name} DESC LIMIT :k"
    if all_partitions:
        return list(session.execute(text(base + order), {"t": tally_id, "k": k}).scalars()), []
    if not touched_ids:
        return [], list(session.execute(text(base + order), {"t": tally_id, "k": k}).scalars())
    expanding: BindParameter[list[int]] = bindparam("p", expanding=True)
    inside = session.execute(text(base + " AND partition_id IN :p" + order).bindparams(expanding),
                             {"t": tally_id, "k": k, "p": touched_ids}).scalars()
    outside = session.execute(
        text(base + " AND partition_id NOT IN :p" + order).bindparams(expanding),
        {"t": tally_id, "k": k, "p": touched_ids}).scalars()
    return list(inside), list(outside)


def _partition_check(session: Session, lifetime: _Scope, limit: Limit, cost: Amount,
                     names: tuple[ComponentName, ...], ids: dict[str, int],
                     keys: list[str]) -> pricing.ScopeCheck:
    """The per-partition limit: the charged partition with the largest s(p) after the charge."""
    state = lifetime.state
    after = Amount(**{name: state.max_touched[name] + cost[name] for name in names})
    if not limit.is_exceeded_by(after, names) or lifetime.tally is None:
        return pricing.ScopeCheck("partition", limit, state.max_touched, after, partition=keys[0])
    # Denied: name the first charged partition (in request order) that would go over.
    spends = {row[0]: Amount(row[1], row[2], row[3]) for row in session.execute(text(
        "SELECT partition_id, epsilon, delta, rho FROM tally_spends "
        "WHERE tally_id = :t AND partition_id IN :p").bindparams(
        bindparam("p", expanding=True)), {"t": lifetime.tally.id, "p": list(ids.values())})}
    for key in keys:
        spent = spends.get(ids.get(key, -1), Amount())
        if limit.is_exceeded_by(spent.plus(cost), names):
            return pricing.ScopeCheck("partition", limit, spent, spent.plus(cost), partition=key)
    return pricing.ScopeCheck("partition", limit, state.max_touched, after, partition=keys[0])


def _apply(session: Session, evaluation: Evaluation, consumer_id: int, now_us: int) -> None:
    dataset = evaluation.dataset
    missing = [key for key in evaluation.partitions if key not in evaluation.partition_ids]
    ids = dict(evaluation.partition_ids)
    if missing:
        rows = session.execute(
            insert(Partition).returning(Partition.key, Partition.id),
            [{"dataset_id": dataset.id, "key": key, "created_at": now_us} for key in missing])
        ids.update({row.key: row.id for row in rows})
    new_scopes = [s for s in evaluation.scopes if s.tally is None]
    tally_ids = [s.tally.id for s in evaluation.scopes if s.tally is not None]
    if new_scopes:
        rows = session.execute(insert(Tally).returning(Tally.id, sort_by_parameter_order=True), [
            {"dataset_id": dataset.id, "kind": s.key[0], "consumer_id": s.key[1],
             "period_seconds": s.key[2], "window_start": s.key[3]} for s in new_scopes])
        tally_ids += [row.id for row in rows]
        fresh = dict(zip([s.key for s in new_scopes], tally_ids[-len(new_scopes):], strict=True))
    else:
        fresh = {}
    cost, m = evaluation.priced.cost, evaluation.priced.multiplicity
    _upsert_spends(session, dataset.id, tally_ids, cost,
                   None if evaluation.all_partitions else list(ids.values()))
    updates = []
    for scope in evaluation.scopes:
        tally_id = scope.tally.id if scope.tally is not None else fresh[scope.key]
        total = scope.state.total.plus(cost.scaled(m))
        highest = max_after(scope.state, cost)
        updates.append({"tid": tally_id, "te": total.epsilon, "td": total.delta,
                        "tr": total.rho, "me": highest.epsilon, "md": highest.delta,
                        "mr": highest.rho})
    session.execute(_UPDATE_TALLY, updates)  # one executemany, no ORM objects


_UPDATE_TALLY = text(
    "UPDATE tallies SET total_epsilon = :te, total_delta = :td, total_rho = :tr, "
    "max_epsilon = :me, max_delta = :md, max_rho = :mr WHERE id = :tid")


def _upsert_spends(session: Session, dataset_id: int, tally_ids: list[int], cost: Amount,
                   partition_ids: list[int] | None) -> None:
    """Add the cost to s(p) of every charged partition in every scope: one statement.

    ``ON CONFLICT ... DO UPDATE`` has the same syntax on SQLite and
    PostgreSQL; SQLite needs the WHERE clause of the SELECT to parse it.
    """
    where = "t.id IN :tallies AND p.dataset_id = :dataset"
    statement = text(
        "INSERT INTO tally_spends (tally_id, partition_id, epsilon, delta, rho) "
        "SELECT t.id, p.id, :e, :d, :r FROM tallies AS t, partitions AS p "
        f"WHERE {where}{' AND p.id IN :partitions' if partition_ids is not None else ''} "
        "ON CONFLICT (tally_id, partition_id) DO UPDATE SET "
        "epsilon = tally_spends.epsilon + excluded.epsilon, "
        "delta = tally_spends.delta + excluded.delta, rho = tally_spends.rho + excluded.rho")
    statement = statement.bindparams(bindparam("tallies", expanding=True))
    values: dict[str, Any] = {"tallies": tally_ids, "dataset": dataset_id, "e": cost.epsilon,
                              "d": cost.delta, "r": cost.rho}
    if partition_ids is not None:
        statement = statement.bindparams(bindparam("partitions", expanding=True))
        values["partitions"] = partition_ids
    session.execute(statement, values)

