"""A charge priced and checked under its dataset's lock: the reads and the decision.

``send_reads`` sends, right behind the statement that locks the dataset
(``dataset_state``), the charged partitions and every scope row the charge
may touch, each with the largest old s(p) among the charged partitions: a
bounded read whatever the history. These reads depend only on the request,
so on PostgreSQL all three come back in one round trip and, being READ
COMMITTED statements that start once the lock is granted, they see every
charge committed before.

``evaluate`` prices the release with the mechanism's cost declaration and
checks every scope with the rules of ``accounting.checks`` (the top-k rule
reads the k largest s(p), s_J(p) and s_P(p) inside and outside the charged
set as well, every one sent before any is read: one round trip on
PostgreSQL). It writes nothing; a preview runs it without the lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
    union_all,
)

from accountant.accounting import checks as rules
from accountant.accounting import pricing
from accountant.accounting.loss import (
    PARTS,
    LossRule,
    Part,
    ScopeKey,
    ScopeState,
    Top,
    charged,
    fresh,
)
from accountant.accounting.modes import Mode
from accountant.accounting.windows import PERIODS, Window
from accountant.driver import Driver, Pending, Rows, Statement, statement
from accountant.errors import Forbidden, field_error
from accountant.exact import Amount, ComponentName
from accountant.mechanism import Mechanism, UnusableParameters
from accountant.models import Dataset, Partition, Tally, TallySpend
from accountant.models.tally import PART_PREFIXES
from accountant.services import dataset_state, datasets
from accountant.services.consumers import Principal
from accountant.services.dataset_state import DatasetState


@dataclass(frozen=True)
class ChargeRequest:
    """A charge as the caller asked for it, validated as far as it can be without the
    database."""

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
    #: The idempotency key, if any, and the SHA-256 of the body (``idempotency.fingerprint``).
    key: str | None = None
    fingerprint: str = ""


@dataclass(frozen=True)
class _TallyRow:
    """A scope's row as read in the charge transaction: plain values, no ORM object."""

    id: int
    total: Amount
    max_spend: Amount
    max_touched: Amount  # the largest old s(p) among the charged partitions
    joint_total: Amount
    parallel_total: Amount


@dataclass
class _Scope:
    key: ScopeKey
    tally: _TallyRow | None
    state: ScopeState = field(default_factory=ScopeState)


@dataclass(frozen=True)
class Evaluation:
    """Everything decided about a charge before anything is written."""

    dataset: DatasetState
    mode: Mode
    partitions: list[str]
    priced: pricing.Priced
    denial: rules.Denial | None
    lifetime_after: Amount
    lifetime_now: Amount
    scopes: list[_Scope]
    partition_ids: dict[str, int]
    all_partitions: bool
    never_fits: bool
    checks: tuple[rules.ScopeCheck, ...]
    checker: ScopeChecker

    @property
    def granted(self) -> bool:
        return self.denial is None

    @property
    def remaining(self) -> Amount:
        loss = self.lifetime_after if self.granted else self.lifetime_now
        return rules.remaining(self.dataset.limit, loss, self.mode.components)

    @property
    def charged(self) -> Amount:
        return charged(self.priced.cost, self.priced.multiplicity)


@dataclass(frozen=True)
class Reads:
    """A charge's reads, sent in this order before any is read (``send_reads``)."""

    dataset: Pending[DatasetState]
    partitions: Pending[Rows]
    scopes: Pending[Rows]
    now: float


def send_reads(driver: Driver, request: ChargeRequest, now: float, *, lock: bool = False) -> Reads:
    """Send the dataset's statement (``lock``: take its lock), then the charged partitions'
    and every scope row's; read none of them yet.

    They name the dataset by name, not id, so none waits for another's
    result. The scope rows are those of the windows containing ``now`` and
    the next ones, of every window length: the dataset's window budgets are
    not known yet, and the charge's own clock is read after the lock.
    """
    if request.partitions != "*":
        datasets.check_keys(list(request.partitions), "partitions")
    caller = request.principal
    dataset = dataset_state.send(
        driver, request.dataset, caller.consumer_id, caller.key_id, lock=lock
    )
    keys = None if request.partitions == "*" else list(request.partitions)
    partitions = driver.send(
        _PARTITIONS[keys is not None],
        {"name": request.dataset} | ({} if keys is None else {"keys": keys}),
        list,
    )
    return Reads(dataset, partitions, _send_scopes(driver, request, keys, now), now)


def _send_scopes(
    driver: Driver, request: ChargeRequest, keys: list[str] | None, now: float
) -> Pending[Rows]:
    params: dict[str, Any] = {"name": request.dataset, "c": request.principal.consumer_id}
    for i, period in enumerate(PERIODS.values()):
        start = Window.containing(period, now).start
        params.update({f"p{i}": period, f"s{i}": start, f"n{i}": start + period})
    if keys is not None:
        params["keys"] = keys
    return driver.send(_SCOPES[keys is not None], params, list)


def _dataset_id() -> ScalarSelect[int]:
    """The id of the dataset named :name, so that no read waits for another's result."""
    return select(Dataset.id).where(Dataset.name == bindparam("name")).scalar_subquery()


def _partitions_statement(some: bool) -> Statement:
    """(key, id) of the charged partitions that exist (:keys), or of every partition."""
    query = select(Partition.key, Partition.id).where(Partition.dataset_id == _dataset_id())
    if some:
        return statement(query.where(Partition.key.in_(bindparam("keys", expanding=True))))
    return statement(query.order_by(Partition.id))


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


_PARTITIONS = {some: _partitions_statement(some) for some in (False, True)}
_SCOPES = {touched: _scopes_statement(touched) for touched in (False, True)}


def evaluate(driver: Driver, reads: Reads, request: ChargeRequest, now: float) -> Evaluation:
    """Price ``request`` and check it against every scope, writing nothing."""
    dataset = reads.dataset.result()
    principal = request.principal
    # the grant as read with the dataset, not as the caller's key was authenticated with
    if not (principal.role in {"admin", "auditor"} or dataset.granted):
        raise Forbidden(
            f"dataset {dataset.name!r} is not granted to {principal.name!r}; "
            "ask an admin for a grant"
        )
    mode = dataset.mode
    rule = dataset.rule
    ids, keys, all_partitions = _resolve(reads.partitions.result(), dataset, request.partitions)
    try:
        priced = pricing.price(
            request.mechanism,
            request.params,
            request.sensitivity_unit,
            mode,
            rule,
            dataset.max_records_per_user,
            request.release,
            len(keys),
        )
    except pricing.PricingError as error:
        raise field_error(error.field, str(error)) from None
    prepare(request.mechanism, priced.run_params, request.data)
    windows = [Window.containing(w.period_seconds, now) for w in dataset.windows]
    rows = reads.scopes.result()
    if any(w.start > Window.containing(w.period, reads.now).end for w in windows):
        # The lock took longer than a window to come: read the scopes of this one.
        rows = _send_scopes(driver, request, None if all_partitions else keys, now).result()
    scopes = _read_scopes(
        driver,
        rows,
        rule,
        mode.components,
        principal.consumer_id,
        windows,
        list(ids.values()),
        len(keys),
        all_partitions,
    )
    lifetime_id = next((s.tally.id for s in scopes if s.key[0] == "lifetime" and s.tally), None)
    checker = ScopeChecker(
        dataset,
        rule,
        mode.components,
        principal,
        {scope.key: scope.state for scope in scopes},
        windows,
        keys,
        request.release,
        functools.cache(lambda: _spends(driver, lifetime_id, ids)),
    )
    cost, m = priced.cost, priced.multiplicity
    checks = checker.checks(cost, m)
    denial = rules.first_denial(checks, cost, mode.components)
    never = denial is not None and rules.never_fits(
        denial, rule, cost, m, request.release, mode.components, len(keys)
    )
    return Evaluation(
        dataset,
        mode,
        keys,
        priced,
        denial,
        checks[0].after,
        checks[0].spent,
        scopes,
        ids,
        all_partitions,
        never,
        tuple(checks),
        checker,
    )


@dataclass(frozen=True)
class ScopeChecker:
    """Every scope a charge touches, as read under the lock, ready to check a cost."""

    dataset: DatasetState
    rule: LossRule
    names: tuple[ComponentName, ...]
    principal: Principal
    states: dict[ScopeKey, ScopeState]
    windows: list[Window]
    keys: list[str]
    release: str
    spends_of: Callable[[], dict[str, Amount]]  # the charged partitions' s(p), on demand

    def checks(self, cost: Amount, m: int) -> list[rules.ScopeCheck]:
        """Each scope's loss before and after a charge of per-release ``cost`` and
        multiplicity ``m`` (n identical charges are one of cost x n)."""
        dataset, rule, names, release = self.dataset, self.rule, self.names, self.release
        lifetime = self.states[("lifetime", 0, 0, 0)]
        checks = [
            rules.scope_check("dataset", dataset.limit, rule, lifetime, cost, m, release, names)
        ]
        if dataset.partition_limit is not None:
            checks.append(
                rules.partition_check(
                    dataset.partition_limit, lifetime, cost, names, self.keys, self.spends_of
                )
            )
        principal = self.principal
        if dataset.quota is not None and dataset.granted:
            checks.append(
                rules.scope_check(
                    "consumer",
                    dataset.quota,
                    rule,
                    self.states[("consumer", principal.consumer_id, 0, 0)],
                    cost,
                    m,
                    release,
                    names,
                )
            )
        for budget, window in zip(dataset.windows, self.windows, strict=True):
            checks.append(
                rules.scope_check(
                    "window",
                    budget.limit,
                    rule,
                    self.states[("window", 0, window.period, window.start)],
                    cost,
                    m,
                    release,
                    names,
                    window=window,
                )
            )
        return checks


def preview(driver: Driver, request: ChargeRequest, now_us: int) -> Evaluation:
    """``request`` evaluated as it would be now, without the lock, writing nothing."""
    driver.begin_read()
    try:
        with driver.pipeline():
            reads = send_reads(driver, request, now_us / 1e6)
            return evaluate(driver, reads, request, now_us / 1e6)
    finally:
        driver.rollback()


def prepare(
    mechanism: Mechanism, run_params: Mapping[str, Any], data: Mapping[str, Any] | None
) -> None:
    """The mechanism's own check that it can run these parameters on this input: a 400
    naming the field and the usable range, before anything is charged."""
    if mechanism.prepare is None:
        return
    try:
        mechanism.prepare(run_params, data)
    except UnusableParameters as error:
        raise field_error(error.field, str(error)) from None
    except (ValueError, ArithmeticError) as error:
        raise field_error(
            "params", f"mechanism {mechanism.name!r} cannot run with these parameters: {error}"
        ) from None


def _resolve(
    rows: Rows, dataset: DatasetState, requested: list[str] | str
) -> tuple[dict[str, int], list[str], bool]:
    """(ids of existing charged partitions by key, the charged keys, whether P is "*")."""
    if requested == "*":
        if not rows:
            raise field_error(
                "partitions",
                f"'*' resolved to no partition: dataset "
                f"{dataset.name!r} has none yet; declare them with "
                f"POST /v1/datasets/{dataset.name}/partitions or name them",
            )
        return dict(rows), [row.key for row in rows], True
    return dict(rows), list(requested), False


def _read_scopes(
    driver: Driver,
    rows: Rows,
    rule: LossRule,
    names: tuple[ComponentName, ...],
    consumer_id: int,
    windows: list[Window],
    touched_ids: list[int],
    n: int,
    all_partitions: bool,
) -> list[_Scope]:
    keys: list[ScopeKey] = [("lifetime", 0, 0, 0), ("consumer", consumer_id, 0, 0)]
    keys += [("window", 0, w.period, w.start) for w in windows]
    found = {
        (row.kind, row.consumer_id, row.period_seconds, row.window_start): _TallyRow(
            row.id,
            Amount(row.total_epsilon, row.total_delta, row.total_rho),
            Amount(row.max_epsilon, row.max_delta, row.max_rho),
            Amount(row.touched_epsilon or 0, row.touched_delta or 0, row.touched_rho or 0),
            Amount(row.total_joint_epsilon, row.total_joint_delta, row.total_joint_rho),
            Amount(row.total_parallel_epsilon, row.total_parallel_delta, row.total_parallel_rho),
        )
        for row in rows
    }
    scopes = [_Scope(key, found.get(key)) for key in keys]
    k = rule.max_partitions_per_user if rule.uses_top_k else None
    columns = tuple(f"{PART_PREFIXES[part]}{name}" for part in PARTS for name in names)
    # Every top-k read of every scope is sent before any is read: the charged partitions'
    # spends by primary key (the k largest inside P are among them), and the k largest
    # outside P (of every partition when P is "*" or holds no partition charged before).
    split = not all_partitions and bool(touched_ids)
    reads = {
        scope.key: (
            _send_spends(driver, scope.tally.id, columns, touched_ids if split else []),
            _send_tops(driver, scope.tally.id, columns, k, touched_ids if split else None),
        )
        for scope in scopes
        if scope.tally is not None and k is not None
    }
    for scope in scopes:
        tally = scope.tally
        if tally is None:
            scope.state = fresh(rule, n)
            continue
        top: dict[tuple[Part, ComponentName], Top] = {}
        if k is not None:
            inside_rows, outside_lists = reads[scope.key][0](), reads[scope.key][1].result()
            for part in PARTS:
                for name in names:
                    column = f"{PART_PREFIXES[part]}{name}"
                    inside = sorted((getattr(row, column) for row in inside_rows), reverse=True)
                    outside = outside_lists.get(column, [])
                    if all_partitions:
                        inside, outside = outside, []
                    padded = inside[:k] + [0] * (min(k, n) - len(inside[:k]))
                    top[part, name] = Top(tuple(outside), tuple(padded))
        scope.state = ScopeState(
            total=tally.total,
            max_all=tally.max_spend,
            max_touched=tally.max_spend if all_partitions else tally.max_touched,
            joint_total=tally.joint_total,
            parallel_total=tally.parallel_total,
            top=top,
        )
    return scopes


def _send_spends(
    driver: Driver, tally_id: int, columns: tuple[str, ...], touched: list[int]
) -> Callable[[], Rows]:
    """``columns`` of the charged partitions ``touched`` in a tally, by primary key: one
    row each (none if ``touched`` is empty), sent now, read when called."""
    if not touched:
        return list
    return driver.send(_inside_statement(columns), {"t": tally_id, "p": touched}, list).result


@functools.lru_cache(maxsize=8)
def _inside_statement(columns: tuple[str, ...]) -> Statement:
    """``columns`` of the partitions :p in tally :t (a primary-key lookup each)."""
    return statement(
        select(*(getattr(TallySpend, column) for column in columns)).where(
            TallySpend.tally_id == bindparam("t"),
            TallySpend.partition_id.in_(bindparam("p", expanding=True)),
        )
    )


def _send_tops(
    driver: Driver, tally_id: int, columns: tuple[str, ...], k: int, touched: list[int] | None
) -> Pending[dict[str, list[int]]]:
    """The k largest values of each of ``columns`` (s(p), s_J(p), s_P(p) per component) in
    a tally, outside the charged set (``touched``: their ids) or of every partition
    (``touched`` None): one statement, sent now, read on demand."""

    def lists(rows: Rows) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for row in rows:
            found.setdefault(row.spend, []).append(row.value)
        return {column: sorted(values, reverse=True) for column, values in found.items()}

    params = {"t": tally_id, "k": k} | ({} if touched is None else {"p": touched})
    return driver.send(_tops_statement(columns, touched is not None), params, lists)


@functools.lru_cache(maxsize=16)
def _tops_statement(columns: tuple[str, ...], outside: bool) -> Statement:
    """The :k largest values of each of ``columns`` in tally :t, as rows (spend, value): of
    the partitions other than :p if ``outside``, else of every partition. An index range
    scan each, in one statement."""
    lists = []
    for column in columns:
        spend = getattr(TallySpend, column)
        # positive: zeros add nothing to a top-k sum, and s_J, s_P are indexed where positive
        query = select(spend.label("value")).where(
            TallySpend.tally_id == bindparam("t"), spend > literal_column("0")
        )
        if outside:
            query = query.where(TallySpend.partition_id.not_in(bindparam("p", expanding=True)))
        # the driver's :k as text, and an OFFSET written out, which SQLite's dialect would bind
        limited = (
            query.order_by(spend.desc())
            .limit(literal_column(":k"))
            .offset(literal_column("0"))
            .subquery()
        )
        lists.append(select(literal_column(f"'{column}'").label("spend"), limited.c.value))
    return statement(union_all(*lists))


_SPENDS = statement(
    select(TallySpend.partition_id, TallySpend.epsilon, TallySpend.delta, TallySpend.rho).where(
        TallySpend.tally_id == bindparam("t"),
        TallySpend.partition_id.in_(bindparam("p", expanding=True)),
    )
)


def _spends(driver: Driver, tally_id: int | None, ids: dict[str, int]) -> dict[str, Amount]:
    """s(p) of the charged partitions that exist, by key, in the lifetime scope."""
    if tally_id is None or not ids:
        return {}
    keys = {partition_id: key for key, partition_id in ids.items()}
    return {
        keys[row.partition_id]: Amount(row.epsilon, row.delta, row.rho)
        for row in driver.rows(_SPENDS, {"t": tally_id, "p": list(ids.values())})
    }
