"""A batch: a release plan granted all together or not at all, in one transaction.

``submit`` is the whole life of a batch (DESIGN.md, "Release plans: batches"):

1. BEGIN, then the lock of every dataset the batch names, in name order, so
   that two batches over the same datasets never wait for each other in a
   cycle (a charge locks one dataset, so it cannot close one either). With an
   idempotency key, the answer remembered for it, read under those locks;
2. with a ``delta``, each ``approx`` dataset's items that are joint releases
   over the same partitions form a group, priced by composing their
   privacy-loss distributions (``accounting.plan_pricing``), and each item's
   share of its group's cost is fixed (``_shares``);
3. a savepoint; then each item in order is read, decided (``accounting.decide``)
   and written (``charge_plan.plan``) exactly as a charge alone would be, on
   the totals the items before it left (an item on the partitions of an
   earlier one has its reads folded from that one's and the writes since,
   without waiting for the database: ``folded_reads``), so that the items add up in every
   scope. Every scope that any item takes over its limit is a denial (the
   first item that does so is named); once one is found, no further mechanism
   runs, and the items still to come are written as if granted, only so that
   every scope the whole plan overflows is found;
4. a batch with a denial rolls back to the savepoint (nothing charged, nothing
   released: the outputs of the items before the first denial are dropped
   with it) and writes one denied ledger entry per dataset it names; a grant
   keeps every item's writes. Either way, with a key, its answer is
   remembered, and the transaction commits. A grant without a key builds its
   answer (every item's facts and signed receipt) after the commit, outside
   the locks; a refusal never builds its items' answers.

Each item's writes are a charge's own (partitions, scopes, ledger entry with
the batch's id and its group), so the verifier, the totals rebuild and the
dashboard read a batch as the charges it is.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError

from accountant.accounting import checks as rules
from accountant.accounting import pricing
from accountant.accounting.charge_inputs import Caller, ChargeRequest, DatasetState, PlanShare
from accountant.accounting.checks import ScopeCheck
from accountant.accounting.decide import (
    Decision,
    charged_partitions,
    decide,
    item_params,
    price_alone,
)
from accountant.accounting.modes import StatedCost
from accountant.accounting.windows import isoformat
from accountant.clock import FrozenClock
from accountant.driver import Driver
from accountant.errors import (
    AccountantError,
    InvalidRequest,
    Unauthorized,
    field_error,
)
from accountant.exact import DELTA, EPSILON, Amount
from accountant.mechanism import Mechanism
from accountant.models import Dataset, LedgerEntry, Population
from accountant.noise import NoiseSecret
from accountant.services import charge_plan, charge_reads, folded_reads, idempotency, ledger
from accountant.services.api_keys import UNKNOWN_KEY
from accountant.services.charge_responses import batch_detail, report, report_cost
from accountant.services.charges import ChargeContext, run_mechanism
from accountant.statements import Block, WritePlan, statement

#: What a refused batch's items write in place of an output digest: their writes are
#: rolled back, and only the scopes they reach are wanted.
_NO_OUTPUT = "0" * 64


@dataclass(frozen=True, kw_only=True)
class BatchRequest:
    """A batch as the caller asked for it.

    Args:
        batch_id: the new batch's id.
        items: its charges, in order (``ChargeRequest``; none draws on a hold).
        delta: the delta at which the groups of approx items are composed (None: every
            item is priced as a single charge).
        principal: who asks.
        key: the idempotency key, if any.
        fingerprint: the SHA-256 of the body (``idempotency.fingerprint``).
    """

    batch_id: str
    items: tuple[ChargeRequest, ...]
    delta: Decimal | None
    principal: Caller
    key: str | None = None
    fingerprint: str = ""


@dataclass(frozen=True)
class BatchGranted:
    facts: dict[str, Any]  # the batch's answer, its items' outputs left out
    outputs: list[dict[str, Any]]


@dataclass(frozen=True)
class BatchDenied:
    facts: dict[str, Any]  # every denial, and the reason


BatchDone = BatchGranted | BatchDenied


def submit(driver: Driver, batch: BatchRequest, context: ChargeContext) -> BatchDone:
    """Grant every item of ``batch`` or none; see the module's notes. A known key with the
    same body gives its first answer again (outputs regenerated exactly, or a 409
    ``replay-unavailable``)."""
    for attempt in (1, 2):
        try:
            return _once(driver, batch, context)
        except IntegrityError:
            # the same key committed meanwhile by a batch over other datasets: read it
            if batch.key is None or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _once(driver: Driver, batch: BatchRequest, context: ChargeContext) -> BatchDone:
    caller = batch.principal
    clock = FrozenClock(0)
    warm(driver, batch, context.clock.now_us())
    driver.begin_write()
    try:
        with driver.pipeline():  # PostgreSQL: each item's reads in one round trip
            states = lock(
                driver, sorted({item.dataset for item in batch.items}), caller, batch.items
            )
            first = (
                None
                if batch.key is None
                else idempotency.find(driver, caller.consumer_id, batch.key).result()
            )
            if first is None:
                # one moment for the whole batch: every item falls in the same windows
                clock = FrozenClock(context.clock.now_us())
                decided, run = _decided(driver, batch, states, clock, context)
                driver.commit()
    except BaseException:
        driver.rollback()
        raise
    if first is not None:  # a known key: nothing written
        driver.rollback()
        return replay(
            driver,
            idempotency.same_request(first, batch.key, batch.fingerprint),
            [(r.mechanism_to_run, r.data) for r in batch.items],
            context.noise,
        )
    # committed: a grant without a key is answered with facts built outside the locks
    done = _granted(batch, run) if decided is None else decided
    if isinstance(done, BatchGranted):  # after the commit, never failing the batch
        context.signer_published[0] = True
        for (decision, item, _, _), facts in zip(run.items, done.facts["items"], strict=True):
            context.alerts.after_grant(
                decision.checks,
                decision.mode.components,
                dataset=item.dataset,
                consumer=caller.name,
                charge_id=facts["charge_id"],
                at=clock.now_us() / 1e6,
            )
    return done


def _decided(
    driver: Driver,
    batch: BatchRequest,
    states: dict[str, DatasetState],
    clock: FrozenClock,
    context: ChargeContext,
) -> tuple[BatchDone | None, _Run]:
    """Price, decide and write every item, under the locks; then keep the writes of a
    grant, or undo them and ledger the refusal; with a key, remember the answer. The
    answer, or None for a grant without a key (its facts wait for the commit)."""
    shares, priced_as = _shares(driver, batch, clock)
    driver.run("SAVEPOINT batch_items")
    run = _items(driver, batch, shares, priced_as, clock, context)
    if run.denials:
        driver.run("ROLLBACK TO SAVEPOINT batch_items")
        done: BatchDone = BatchDenied(_denied_facts(batch, run))
        driver.apply(_refusal_writes(batch, run, states, clock.now_us(), context))
    elif batch.key is None:
        return None, run
    else:
        done = _granted(batch, run)
    if batch.key is not None:
        caller = batch.principal
        remembered = idempotency.remembered(
            caller.consumer_id, batch.key, batch.fingerprint, done.facts, clock.now_us()
        )
        driver.apply(WritePlan((Block((remembered,)),)))
    return done, run


def dry_run(
    driver: Driver, batch: BatchRequest, share: Fraction, now_us: int, context: ChargeContext
) -> tuple[bool, dict[str, Amount]]:
    """Whether ``batch`` would be granted now within ``share`` of what every scope has left,
    and what it would charge each dataset: the batch decided exactly as ``submit`` decides
    it, inside the caller's transaction (its datasets locked, ``lock``), every write undone
    and no mechanism run. A refusal of an item (a 400: a parameter out of its mechanism's
    range) does not fit."""
    driver.run("SAVEPOINT batch_plan")
    try:
        clock = FrozenClock(now_us)
        shares, priced_as = _shares(driver, batch, clock)
        run = _items(driver, batch, shares, priced_as, clock, context, share=share)
    except InvalidRequest:
        return False, {}
    finally:
        driver.run("ROLLBACK TO SAVEPOINT batch_plan")
        driver.run("RELEASE SAVEPOINT batch_plan")
    charged: dict[str, Amount] = {}
    for decision, item, _, _ in run.items:
        charged[item.dataset] = charged.get(item.dataset, Amount()).plus(decision.charged)
    return not run.denials, charged


def lock(
    driver: Driver, names: list[str], caller: Caller, items: Sequence[ChargeRequest] = ()
) -> dict[str, DatasetState]:
    """Lock the datasets' populations, then each dataset, each in name order (one at a time:
    each waits for the one before), and read each dataset with the caller's role and key; a
    404 for a dataset that does not exist (naming the first of ``items`` that names it), a
    401 for a key revoked since it was authenticated. Every other writer takes a
    population's lock before its dataset's, so no two of them deadlock."""
    if driver.postgres:  # SQLite's write lock is the transaction's
        driver.send(_LOCK_POPULATIONS, {"names": names}, list)
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.dataset, i)
    states = {}
    for name in names:
        with item_errors(first[name]) if name in first else nullcontext():
            state = charge_reads.send_dataset(driver, name, caller, lock=True).result()
        if not state.key_valid:
            raise Unauthorized(UNKNOWN_KEY)
        states[name] = state
    return states


#: The populations of the datasets named :names, locked in name order (a dataset's
#: population never changes, so reading it before its dataset's lock is safe).
_LOCK_POPULATIONS = statement(
    select(Population.id)
    .where(
        Population.id.in_(
            select(Dataset.population_id).where(
                Dataset.name.in_(bindparam("names", expanding=True))
            )
        )
    )
    .order_by(Population.name)
    .with_for_update()
)

#: A grouped item as its group was priced: the parameters it must run with and the
#: partitions it must charge.
PricedAs = tuple[dict[str, Any], frozenset[str]]


def _shares(
    driver: Driver, batch: BatchRequest, clock: FrozenClock, *, lock: bool = True
) -> tuple[dict[int, PlanShare], dict[int, PricedAs]]:
    """Each item's place in the batch, with its share of its group's composed cost: with a
    delta, the items of an approx dataset with basic composition that are joint releases
    over the same partitions form a group (a parallel release is a group of its own); the
    others are priced alone. Also what each grouped item was priced as, which it must be
    when it is charged. ``lock``: read under the datasets' locks (else as they stand)."""
    shares = {i: PlanShare(batch_id=batch.batch_id) for i in range(len(batch.items))}
    if batch.delta is None:
        return shares, {}
    # imported when first needed: privacy-loss distributions take a second to import
    from accountant.accounting import plan_pricing

    groups: dict[tuple[Any, ...], list[int]] = {}
    members: dict[int, Any] = {}  # plan_pricing.PlanItem
    priced_as: dict[int, PricedAs] = {}
    modes = {}
    for i, item in enumerate(batch.items):
        with item_errors(i):
            reads = (
                charge_reads.read(driver, item, clock)
                if lock
                else charge_reads.read_unlocked(driver, item, clock.now_us())
            )
            assert not isinstance(reads, idempotency.Remembered)  # items carry no key
            dataset = reads.dataset
            # the advanced filter needs each release's own (epsilon, delta): a share of a
            # group's is not one (docs/accounting.md), so its items are priced alone
            if dataset.accounting != "approx" or dataset.mode.advanced:
                continue
            keys = charged_partitions(reads, item)
            params = item_params(item, dataset, len(keys))
            single = _single_cost(item, dataset, len(keys))
        assert item.mechanism is not None
        together = ("joint", item.dataset, frozenset(keys)) if item.release == "joint" else (i,)
        groups.setdefault(together, []).append(i)
        members[i] = plan_pricing.PlanItem(
            mechanism=item.mechanism,
            params=params,
            coordinates=_coordinates(item.data),
            single=single,
        )
        priced_as[i] = (params, frozenset(keys))
        modes[i] = dataset.mode
    delta = Fraction(batch.delta)
    delta_units = DELTA.cost_units(delta)
    for number, group in enumerate(groups.values()):
        try:
            epsilon = _group_epsilon([members[i] for i in group], delta)
        except ValueError as error:
            raise field_error(f"items[{group[0]}]", str(error)) from None
        total = Amount(epsilon=epsilon, delta=delta_units)
        for i, part in zip(group, plan_pricing.split(total, len(group)), strict=True):
            cost = modes[i].amount_of(
                StatedCost(
                    epsilon=Fraction(EPSILON.to_decimal(part.epsilon)),
                    delta=Fraction(DELTA.to_decimal(part.delta)),
                    rho=None,
                )
            )
            shares[i] = PlanShare(
                batch_id=batch.batch_id,
                group=number,
                cost=cost,
                group_cost=total,
                delta=str(batch.delta),
            )
    return shares, priced_as


#: Groups priced lately, by their items and delta: a batch priced before its locks (and
#: each dry run of a weighted plan) finds its groups here once it holds them.
_PRICED: OrderedDict[tuple[Any, ...], int] = OrderedDict()
_PRICED_LOCK = threading.Lock()


def _group_epsilon(members: list[Any], delta: Fraction) -> int:
    """``plan_pricing.group_epsilon``, remembered for the last 256 groups."""
    from accountant.accounting import plan_pricing

    key = (
        delta,
        tuple(
            (
                m.mechanism.implementation or m.mechanism.name,
                tuple(sorted((k, str(v)) for k, v in m.params.items())),
                m.coordinates,
                m.single,
            )
            for m in members
        ),
    )
    with _PRICED_LOCK:
        if key in _PRICED:
            _PRICED.move_to_end(key)
            return _PRICED[key]
    epsilon = plan_pricing.group_epsilon(members, delta)
    with _PRICED_LOCK:
        _PRICED[key] = epsilon
        while len(_PRICED) > 256:
            _PRICED.popitem(last=False)
    return epsilon


def warm(driver: Driver, batch: BatchRequest, now_us: int) -> None:
    """Price ``batch``'s groups on its datasets as they stand, without their locks, so that
    pricing them again under the locks finds them priced (``_group_epsilon``): composing
    privacy-loss distributions may take a second, which no lock should wait for. Refusals
    are left for the locked pass to raise."""
    if batch.delta is None:
        return
    driver.begin_read()
    try:
        _shares(driver, batch, FrozenClock(now_us), lock=False)
    except AccountantError:
        pass
    finally:
        driver.end_read()


def _single_cost(item: ChargeRequest, dataset: DatasetState, n: int) -> Amount | None:
    """``item``'s cost as a charge alone (None: it cannot be priced alone, a gaussian
    stated by its sigma)."""
    try:
        return price_alone(item, dataset, n).cost
    except pricing.PricingError:
        return None


def _coordinates(data: Any) -> int:
    """How many values an additive release noises (1 when it states none)."""
    if isinstance(data, dict):
        if isinstance(data.get("values"), list):
            return max(1, len(data["values"]))
        size = data.get("size")
        if isinstance(size, int):
            return max(1, size)
    return 1


@dataclass(frozen=True)
class _Denial:
    """A scope the plan takes over its limit: the first item that does it, its check, and
    the decision it was found in (for the dataset's mode)."""

    item: int
    dataset: str
    check: ScopeCheck
    decision: Decision


@dataclass
class _Run:
    """The items as written in the transaction, and what the plan does to every scope."""

    #: each item's decision, request, facts (built when called) and output
    items: list[tuple[Decision, ChargeRequest, Callable[[], dict[str, Any]], dict[str, Any] | None]]
    denials: dict[tuple[Any, ...], _Denial]
    first: dict[tuple[Any, ...], ScopeCheck]  # each scope as the plan found it
    last: dict[tuple[Any, ...], ScopeCheck]  # and as its last item left it
    #: s(p) of each charged partition with a limit, before the batch and after its items
    partitions: dict[tuple[str, str], tuple[Amount, Amount]] = field(default_factory=dict)


def _items(
    driver: Driver,
    batch: BatchRequest,
    shares: dict[int, PlanShare],
    priced_as: dict[int, PricedAs],
    clock: FrozenClock,
    context: ChargeContext,
    *,
    share: Fraction | None = None,
) -> _Run:
    """Read, decide and write each item in order, as a charge alone would be (see the
    module's notes). ``share``: a dry run that runs no mechanism, for a plan that must fit
    that share of what every scope has left (``release_plans``)."""
    run = _Run([], {}, {}, {})
    folds = folded_reads.Folds()
    for i, request in enumerate(batch.items):
        # an item that comes with its cost fixed keeps it (a weighted plan's stand-in)
        item = request if request.share is not None else replace(request, share=shares[i])
        with item_errors(i), _delta_hint(batch, item):
            reads = folds.reads(item)
            if reads is None or folded_reads.checking():
                # the batch holds every lock it needs already (``lock``): read as they stand
                read = charge_reads.read_unlocked(driver, item, clock.now_us())
                if reads is not None:
                    folded_reads.check(reads, read)
                reads = read
            decision = decide(reads, item, preview=share is not None)
            if i in priced_as and priced_as[i] != (
                dict(decision.priced.run_params),
                frozenset(decision.partitions),
            ):
                raise field_error(
                    "partitions",
                    "'*' resolves to other partitions here than when its group was priced "
                    "(an item before it charges new partitions); name the partitions",
                )
        names = decision.mode.components
        for check in decision.checks:
            scope = _scope_of(item.dataset, check)
            before = run.first.setdefault(scope, check).spent
            run.last[scope] = check
            limit = check.limit if share is None else rules.shared_limit(check.limit, before, share)
            if limit.is_exceeded_by(check.after, names) and scope not in run.denials:
                run.denials[scope] = _Denial(i, item.dataset, check, decision)
        _partitions_over(run, i, item.dataset, decision, reads.spends, share)
        charge_id = str(uuid.uuid4())
        if run.denials or share is not None:  # nothing runs: only the overflows are wanted
            output, digest = None, _NO_OUTPUT
            decision = replace(decision, denial=None)
        else:
            output, digest = run_mechanism(item, decision, charge_id, context.noise)
        signing = charge_plan.Signing(
            context.signer, not context.signer_published[0] and i == 0, context.hasher
        )
        planned = charge_plan.plan(
            decision, item, charge_id=charge_id, output_sha256=digest, signing=signing
        )
        driver.apply(planned.writes)
        folds.written(item, reads, decision, planned.entry)
        run.items.append(
            (decision, item, functools.partial(_item_facts, planned, shares[i]), output)
        )
    return run


def _partitions_over(
    run: _Run,
    i: int,
    dataset: str,
    decision: Decision,
    spends: Mapping[str, Amount],
    share: Fraction | None,
) -> None:
    """s(p) of each partition item ``i`` charges, as the batch moves it (from ``spends``, as
    the item read them); and each one the item takes over the per-partition limit (or its
    share of what it had left): a denial of its own. A charge's check names only the first
    such partition in request order; a refused batch lists every one."""
    limit = decision.dataset.partition_limit
    if limit is None:
        return
    names = decision.mode.components
    for key in decision.partitions:
        spent = spends.get(key, Amount())
        before = run.partitions.get((dataset, key), (spent, spent))[0]
        after = spent.plus(decision.priced.cost)
        run.partitions[dataset, key] = (before, after)
        check = ScopeCheck(scope="partition", limit=limit, spent=before, after=after, partition=key)
        scope = _scope_of(dataset, check)
        run.first.setdefault(scope, check)
        run.last[scope] = check
        bound = limit if share is None else rules.shared_limit(limit, before, share)
        if bound.is_exceeded_by(after, names) and scope not in run.denials:
            run.denials[scope] = _Denial(i, dataset, check, decision)


def _scope_of(dataset: str, check: ScopeCheck) -> tuple[Any, ...]:
    """A scope's identity across the items of a batch: a population's is shared by the
    items of all its datasets."""
    if check.scope == "population":
        return (None, check.scope, check.population, None)
    window = None if check.window is None else (check.window.period, check.window.start)
    partition = check.partition if check.scope == "partition" else None
    return (dataset, check.scope, partition, window)


@contextmanager
def item_errors(i: int) -> Iterator[None]:
    """Name item ``i`` in the refusals raised inside the block (``items[i].field``)."""
    prefix = f"items[{i}]"
    try:
        yield
    except InvalidRequest as error:
        errors = [
            {**e, "field": f"{prefix}.{e['field']}" if e["field"] else prefix}
            for e in error.errors or [{"field": "", "message": error.detail}]
        ]
        raise InvalidRequest(f"{prefix}: {error.detail}", errors=errors) from None
    except AccountantError as error:
        error.detail = f"{prefix}: {error.detail}"
        error.args = (error.detail,)
        raise


@contextmanager
def _delta_hint(batch: BatchRequest, item: ChargeRequest) -> Iterator[None]:
    """A gaussian stated by its sigma on an approx dataset is priced only in a group: say
    so when a batch without delta is refused for it."""
    try:
        yield
    except InvalidRequest as error:
        if batch.delta is None and "sigma" in item.params and error.errors:
            hint = "; or give the batch a delta, at which its approx groups are composed"
            error.errors = [{**e, "message": e["message"] + hint} for e in error.errors]
            error.detail += hint
            error.args = (error.detail,)
        raise


def _item_facts(planned: charge_plan.Planned, share: PlanShare) -> dict[str, Any]:
    """An item's facts in a granted batch's answer: its own as a charge's, and its batch."""
    facts = dict(planned.facts)
    facts.update(batch_detail(share))
    return facts


def _granted(batch: BatchRequest, run: _Run) -> BatchGranted:
    outputs = [out for _, _, _, out in run.items if out is not None]
    return BatchGranted(_granted_facts(batch, run), outputs)


def _granted_facts(batch: BatchRequest, run: _Run) -> dict[str, Any]:
    """A granted batch's answer without its outputs: each item's facts, and what the batch
    charged each dataset."""
    charged: dict[str, tuple[Decision, Amount]] = {}
    for decision, item, _, _ in run.items:
        before = charged.get(item.dataset, (decision, Amount()))[1]
        charged[item.dataset] = (decision, before.plus(decision.charged))
    return {
        "kind": "batch",
        "batch_id": batch.batch_id,
        "items": [facts() for _, _, facts, _ in run.items],
        "cost": idempotency.decimals_as_floats(
            {name: report_cost(decision, amount) for name, (decision, amount) in charged.items()}
        ),
    }


def _denied_facts(batch: BatchRequest, run: _Run) -> dict[str, Any]:
    """A refused batch's answer: every scope the plan takes over its limit, with its limit,
    its loss before the batch, what the batch adds to it and the first item that takes it
    over; a 429 when only windows overflow, each by less than its whole limit."""
    listed = []
    waits, ends = [], []
    for scope, denial in run.denials.items():
        check, decision = denial.check, denial.decision
        spent, after = run.first[scope].spent, run.last[scope].after
        if check.scope == "partition" and check.partition is not None:
            spent, after = run.partitions[denial.dataset, check.partition]
        requested = Amount(
            max(0, after.epsilon - spent.epsilon),
            max(0, after.delta - spent.delta),
            max(0, after.rho - spent.rho),
        )
        # a population's amounts are stated at its own delta
        population = decision.dataset.population
        at = None if population is None or check.population is None else population.limit.delta
        entry: dict[str, Any] = {
            "item": denial.item,
            "dataset": denial.dataset,
            "scope": check.scope,
            "limit": report(decision, check.limit.bounds(), at),
            "spent": report(decision, spent, at),
            "requested": report_cost(decision, requested),
        }
        if check.scope == "partition":
            entry["partition"] = check.partition
        if check.population is not None:
            entry["population"] = check.population
        if check.window is not None:
            entry["resets_at"] = isoformat(check.window.end)
            ends.append(check.window.end)
            if not check.limit.is_exceeded_by(requested, decision.mode.components):
                waits.append(check.window.seconds_until_end(decision.now_us / 1e6))
        listed.append(entry)
    only_windows = all(d.check.scope == "window" for d in run.denials.values())
    facts: dict[str, Any] = {
        "kind": "batch_denied",
        "batch_id": batch.batch_id,
        "denials": listed,
        "reason": (
            f"the batch would take {len(listed)} scope(s) over their limit, listed in "
            "denials; nothing was charged or released. Drop or re-plan the items named, "
            "or ask an admin for more budget"
        ),
    }
    if only_windows and len(waits) == len(listed):  # a retry fits once the last one resets
        facts["fits_again_in_s"] = max(waits)
        facts["resets_at"] = isoformat(max(ends))
    stored: dict[str, Any] = idempotency.decimals_as_floats(facts)
    return stored


def _refusal_writes(
    batch: BatchRequest,
    run: _Run,
    states: dict[str, DatasetState],
    now_us: int,
    context: ChargeContext,
) -> WritePlan:
    """One denied ledger entry for each dataset the batch names, on its chain as it stood
    before the batch, with the denials on it."""
    caller = batch.principal
    blocks: list[Block] = []
    for name, state in states.items():
        mine = [d for d in run.denials.values() if d.dataset == name]
        decisions = [(d, item) for d, item, _, _ in run.items if item.dataset == name]
        partitions = sorted({key for d, _ in decisions for key in d.partitions})
        cost = Amount()
        for d, _ in decisions:
            cost = cost.plus(d.priced.cost)
        first = decisions[0][0]
        detail: dict[str, Any] = {
            "scope": mine[0].check.scope if mine else "batch",
            "batch_id": batch.batch_id,
            "items": [i for i, item in enumerate(batch.items) if item.dataset == name],
            "denials": [
                {"item": d.item, "scope": d.check.scope}
                | ({"partition": d.check.partition} if d.check.scope == "partition" else {})
                | ({"population": d.check.population} if d.check.population else {})
                for d in mine
            ],
            "terms_sha256": state.terms_sha256,
        }
        entry = ledger.entry(
            state,
            ledger.Actor(caller.consumer_id, caller.name),
            kind="charge",
            status="denied",
            created_at=now_us,
            charge_id=str(uuid.uuid4()),
            mechanism="batch",
            release="joint",
            partitions=partitions,
            params={},
            cost=cost,
            multiplicity=1,
            detail=detail,
            loss_after=first.lifetime_now,
            hasher=context.hasher,
        )
        blocks.append(Block(tuple(entry.writes)))  # each dataset's chain, in name order
    return WritePlan(tuple(blocks))


_ITEM_SOURCES = statement(
    select(LedgerEntry.charge_id, LedgerEntry.noise_secret, LedgerEntry.implementation).where(
        LedgerEntry.charge_id.in_(bindparam("ids", expanding=True))
    )
)


def replay(
    driver: Driver,
    first: idempotency.Remembered,
    runs: Sequence[tuple[Mechanism | None, Any]],
    noise: NoiseSecret,
) -> BatchDone:
    """The first answer to a batch's key, given again: every item's output regenerated
    exactly by its mechanism from its input (``runs``, by item: None for a mechanism that
    does not run here now), or a 409 that releases nothing."""
    facts = first.facts
    if facts["kind"] != "batch":
        return BatchDenied(facts)
    items: Sequence[dict[str, Any]] = facts["items"]
    rows = driver.rows(_ITEM_SOURCES, {"ids": [item["charge_id"] for item in items]})
    driver.end_read()
    sources = {row.charge_id: (row.noise_secret, row.implementation) for row in rows}
    outputs = []
    for item_facts, (mechanism, data) in zip(items, runs, strict=True):
        secret, implementation = sources.get(item_facts["charge_id"], (None, None))
        remembered = idempotency.Remembered(
            first.request_hash, item_facts["charge_id"], item_facts, secret, implementation
        )
        output = idempotency.output_of(remembered, mechanism, data, noise)
        assert output is not None
        outputs.append(output)
    return BatchGranted(facts, outputs)
