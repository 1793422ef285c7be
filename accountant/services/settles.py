"""Settling a hold: what its job used, and what goes back to every scope it charged.

``settle`` is one unit of work in its dataset's transaction (the charges'
group commit, ``GroupCommit.run``), read, decided, written:

1. its reads: the dataset's row, locked, with the caller's role and key as
   they stand (``charge_reads.send_dataset``); the answer remembered for its
   idempotency key; the hold's row, which only writers holding that lock
   change; and the dataset's lifetime books (T and every s(p)), from which
   the lifetime loss after the settle follows;
2. its decision (``accounting.holds.settle``), pure: who may settle, the hold
   open, what the job used between what its charges drew and the amount;
3. its writes (``_plan``): the returned amount taken off s(p) of each of the
   hold's partitions in every scope it charged (the windows it was charged
   to included), then those scopes' running totals and largest s(p), a
   ledger entry of kind ``settle``, the loss of the dataset's population
   lowered by what the dataset's own loss fell, the hold settled, and the answer's facts
   with a receipt of kind ``settle``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, func, literal_column, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from accountant.accounting.charge_inputs import Caller, DatasetState
from accountant.accounting.holds import HoldState, Settlement
from accountant.accounting.holds import settle as settled
from accountant.accounting.loss import PARTS, Books, Part, ScopeBooks, holds
from accountant.accounting.pricing import PricingError, price, stated
from accountant.accounting.windows import isoformat
from accountant.driver import Driver, Rows
from accountant.errors import IdempotencyKeyReused, NotFound, Unauthorized, field_error
from accountant.exact import COMPONENTS, Amount
from accountant.group_commit import Transaction
from accountant.mechanism import Mechanism
from accountant.models import Dataset, Hold, Partition, Tally, TallySpend
from accountant.models.tally import PART_PREFIXES
from accountant.services import charge_reads, charge_responses, idempotency, ledger, receipts
from accountant.services.api_keys import UNKNOWN_KEY
from accountant.services.charge_plan import Signing, population_loss
from accountant.services.charges import ChargeContext
from accountant.statements import Block, Statement, Write, WritePlan, statement


@dataclass(frozen=True, kw_only=True)
class SettleRequest:
    """A settle or a release as asked for.

    Args:
        hold_id: the hold.
        dataset: the hold's dataset's name (looked up before the lock: it never changes).
        principal: who asks.
        used: what the job used in all, stated in the dataset's measure.
        params: parameters merged into the hold's mechanism's, describing what ran outside
            the accountant: priced, then added to what charges drew.
        mechanism: the mechanism that priced the hold (None: a stated amount).
        key: the idempotency key, if any.
        fingerprint: the SHA-256 of the request (``idempotency.fingerprint``).
    """

    hold_id: str
    dataset: str
    principal: Caller
    used: Mapping[str, Any] | None = None
    params: Mapping[str, Any] | None = None
    mechanism: Mechanism | None = None
    key: str | None = None
    fingerprint: str = ""

    @property
    def field(self) -> str:
        """The request field a 400 about what was used names."""
        return "used" if self.used is not None else "params" if self.params else "hold"


@dataclass(frozen=True)
class Settled:
    facts: dict[str, Any]


def locate(driver: Driver, hold_id: str) -> tuple[str, str | None, dict[str, Any]]:
    """(the hold's dataset's name, the mechanism that priced it, its parameters): what a
    settle needs to know before its transaction. A 404 for no such hold."""
    row = driver.row(_LOCATE, {"id": hold_id})
    driver.end_read()
    if row is None:
        raise NotFound(f"no hold with id {hold_id!r}; list holds with GET /v1/holds")
    params = json.loads(row.params) if isinstance(row.params, str) else row.params
    return row.name, row.mechanism, idempotency.decode_params(params)


_LOCATE = statement(
    select(Dataset.name, Hold.mechanism, Hold.params)
    .join(Dataset, Dataset.id == Hold.dataset_id)
    .where(Hold.id == bindparam("id"))
)


def settle(
    connection: Driver, request: SettleRequest, context: ChargeContext
) -> Settled | idempotency.Remembered:
    """Settle ``request``'s hold once, or give its first answer again."""
    done = context.group.run(
        request.dataset,
        connection,
        functools.partial(_settle, request=request, context=context),
        duplicates=request.key is not None,
    )
    if isinstance(done, Settled):
        context.signer_published[0] = True
    return done


def _settle(
    tx: Transaction, *, request: SettleRequest, context: ChargeContext
) -> Settled | idempotency.Remembered:
    """The settle's unit of work, in its dataset's transaction: read, decide, write."""
    read = _read(tx.driver, request, context.clock.now_us())
    if isinstance(read, idempotency.Remembered):
        if read.request_hash != request.fingerprint:
            raise IdempotencyKeyReused(
                f"idempotency key {request.key!r} was first used with a different "
                "request; use a new key for a new request"
            )
        return read
    dataset, hold, books, now = read
    settlement = settled(
        hold,
        hold_id=request.hold_id,
        used=_used(request, dataset, hold),
        consumer_id=request.principal.consumer_id,
        role=dataset.role,
        now_us=now,
        mode=dataset.mode,
        rule=dataset.rule,
        lifetime=books,
        whole_only=dataset.accounting == "approx"
        and request.mechanism is not None
        and not request.mechanism.runs,
        field_name=request.field,
    )
    signing = Signing(context.signer, not context.signer_published[0], context.hasher)
    writes, facts = _plan(settlement, dataset, request, now, signing)
    tx.apply(writes)
    return Settled(facts)


def _used(request: SettleRequest, dataset: DatasetState, hold: HoldState | None) -> Amount:
    """What the job used in all: as stated; or what charges drew plus the price of what ran
    outside the accountant; or, releasing, what charges drew."""
    if hold is None:
        return Amount()  # settle() answers 404
    mode, rule = dataset.mode, dataset.rule
    n = len(hold.partitions)
    try:
        if request.used is not None:
            return stated(
                amount=request.used,
                mode=mode,
                rule=rule,
                release=hold.release,
                n=n,
                field="used",
                zero_ok=True,
            ).cost
        if request.params:
            if request.mechanism is None:
                raise PricingError(
                    "this hold states an amount, not a mechanism: settle it with used", "params"
                )
            merged = {**hold.params, **request.params}
            unit = merged.pop("sensitivity_unit", None)
            ran = price(
                mechanism=request.mechanism,
                params=merged,
                sensitivity_unit=unit,
                mode=mode,
                rule=rule,
                max_records=dataset.max_records_per_user,
                release=hold.release,
                n=n,
            ).cost
            return hold.drawn.plus(ran)
    except PricingError as error:
        raise field_error(error.field, str(error)) from None
    return hold.drawn


_Read = tuple[DatasetState, HoldState | None, ScopeBooks, int]


def _read(driver: Driver, request: SettleRequest, now_us: int) -> _Read | idempotency.Remembered:
    """Lock the dataset and read what a settle decides on; or the answer remembered for its
    idempotency key. A 401 for a key revoked since it was authenticated."""
    caller = request.principal
    dataset = charge_reads.send_dataset(driver, request.dataset, caller, lock=True)
    key = request.key
    remembered = None if key is None else idempotency.find(driver, caller.consumer_id, key)
    hold = charge_reads.send_hold(driver, request.hold_id)
    totals = driver.send(_LIFETIME, {"name": request.dataset}, list)
    spends = driver.send(_LIFETIME_SPENDS, {"name": request.dataset}, list)
    state = dataset.result()
    if not state.key_valid:
        raise Unauthorized(UNKNOWN_KEY)
    if remembered is not None and (first := remembered.result()) is not None:
        return first
    return state, hold.result(), _books(totals.result(), spends.result()), now_us


def _books(totals: Rows, spends: Rows) -> ScopeBooks:
    """The lifetime scope's books: T of each part and every s(p)."""
    books = ScopeBooks({part: Books() for part in PARTS})
    for row in totals:
        for part in PARTS:
            prefix = PART_PREFIXES[part]
            books.parts[part].total = Amount(
                *(getattr(row, f"total_{prefix}{name}") for name in COMPONENTS)
            )
    for row in spends:
        for part in PARTS:
            prefix = PART_PREFIXES[part]
            books.parts[part].spends[row.key] = Amount(
                *(getattr(row, f"{prefix}{name}") for name in COMPONENTS)
            )
    return books


_LIFETIME_KIND: ColumnElement[str] = literal_column("'lifetime'")
_DATASET_ID = select(Dataset.id).where(Dataset.name == bindparam("name")).scalar_subquery()
_LIFETIME = statement(
    select(Tally).where(Tally.dataset_id == _DATASET_ID, Tally.kind == _LIFETIME_KIND)
)
_LIFETIME_SPENDS = statement(
    select(Partition.key, TallySpend)
    .join(Partition, Partition.id == TallySpend.partition_id)
    .join(Tally, Tally.id == TallySpend.tally_id)
    .where(Tally.dataset_id == _DATASET_ID, Tally.kind == _LIFETIME_KIND)
)


def _plan(
    settlement: Settlement,
    dataset: DatasetState,
    request: SettleRequest,
    now: int,
    signing: Signing,
) -> tuple[WritePlan, dict[str, Any]]:
    """The writes of a settle and the facts of its answer."""
    hold, returned = settlement.hold, settlement.returned
    kept = dataset.rule.parts
    parts = tuple(part for part in kept if holds(part, hold.release))
    scopes: dict[str, Any] = {"d": dataset.id}
    for i, (kind, consumer, period, start) in enumerate(hold.scopes):
        scopes.update({f"k{i}": kind, f"c{i}": consumer, f"p{i}": period, f"s{i}": start})
    back = returned.scaled(hold.multiplicity)
    spends = dict(scopes, keys=list(hold.partitions))
    totals = dict(scopes)
    for part in parts:
        prefix = PART_PREFIXES[part]
        spends.update({f"{prefix}{name}": returned[name] for name in COMPONENTS})
        totals.update({f"total_{prefix}{name}": back[name] for name in COMPONENTS})
    actor = ledger.Actor(request.principal.consumer_id, request.principal.name)
    entry = ledger.entry(
        dataset,
        actor,
        kind="settle",
        status="granted",
        created_at=now,
        hold_id=hold.id,
        mechanism=hold.mechanism,
        release=hold.release,
        partitions=list(hold.partitions),
        params=ledger.plain_params(request.params or {}),
        cost=returned,
        multiplicity=hold.multiplicity,
        detail={
            "amount": _units(hold.amount),
            "drawn": _units(hold.drawn),
            "used": _units(settlement.used),
            "terms_sha256": dataset.terms_sha256,
        },
        loss_after=settlement.lifetime_after,
        hasher=signing.hasher,
    )
    facts = _facts(settlement, dataset, now, entry.head, signing)
    last = [
        Write(_update_totals(len(hold.scopes), parts), totals),
        *entry.writes,
        *population_loss(dataset, _population_after(settlement, dataset)),
        Write(
            _SETTLE_HOLD,
            {
                "id": hold.id,
                "t": now,
                "by": request.principal.consumer_id,
                **{f"u{name}": settlement.used[name] for name in COMPONENTS},
            },
        ),
    ]
    if signing.publish:
        last.append(receipts.published(signing.signer, now))
    if request.key is not None:
        consumer = request.principal.consumer_id
        last.append(idempotency.remembered(consumer, request.key, request.fingerprint, facts, now))
    blocks = [Block((Write(_update_spends(len(hold.scopes), parts), spends),)), Block(tuple(last))]
    return WritePlan(tuple(blocks)), facts


def _population_after(settlement: Settlement, dataset: DatasetState) -> Amount | None:
    """The loss of the dataset's population once the dataset's own loss falls by what the
    settle gives back (None: it has no population)."""
    if dataset.population is None:
        return None
    fall = settlement.lifetime_before.minus(settlement.lifetime_after)
    return dataset.population.loss.minus(fall)


def _units(amount: Amount) -> list[int]:
    return [amount[name] for name in COMPONENTS]


def _facts(
    settlement: Settlement,
    dataset: DatasetState,
    now: int,
    head: ledger.ChainHead,
    signing: Signing,
) -> dict[str, Any]:
    """A settle's answer, with its signed receipt (``kind`` ``settle``): the settled cost
    the job publishes with its output."""
    hold, mode, delta = settlement.hold, dataset.mode, dataset.limit_delta or 0

    def stated_as(amount: Amount) -> dict[str, Any]:
        return mode.labelled(mode.report_cost(amount, delta), amount)

    remaining = Amount(
        *(
            max((dataset.limit[name] or 0) - settlement.lifetime_after[name], 0)
            if name in mode.components
            else 0
            for name in COMPONENTS
        )
    )
    body: dict[str, Any] = idempotency.decimals_as_floats(
        {
            "kind": "settle",
            "hold_id": hold.id,
            "dataset": dataset.name,
            "partitions": list(hold.partitions),
            "release": hold.release,
            "state": "settled",
            "amount": stated_as(hold.amount),
            "drawn": stated_as(hold.drawn),
            "used": stated_as(settlement.used),
            "returned": stated_as(settlement.returned),
            "multiplicity": hold.multiplicity,
            "remaining": mode.labelled(mode.report(remaining, delta, bound=True), remaining),
            "settled_at": isoformat(now / 1e6),
            "ledger": {"seq": head.seq, "hash": head.hash},
        }
    )

    figures = charge_responses.figures
    body["receipt"] = receipts.settle_receipt(
        signing.signer,
        hold_id=hold.id,
        dataset=dataset.name,
        partitions=body["partitions"],
        amount=figures(body["amount"]),
        used=figures(body["used"]),
        returned=figures(body["returned"]),
        multiplicity=hold.multiplicity,
        ledger=body["ledger"],
        issued_at=now // 1_000_000,
    )
    return body


def _scopes_where(count: int) -> ColumnElement[bool]:
    """The scope rows of the dataset :d keyed (:k{i}, :c{i}, :p{i}, :s{i})."""
    return and_(
        Tally.dataset_id == bindparam("d"),
        or_(
            *(
                and_(
                    Tally.kind == bindparam(f"k{i}"),
                    Tally.consumer_id == bindparam(f"c{i}"),
                    Tally.period_seconds == bindparam(f"p{i}"),
                    Tally.window_start == bindparam(f"s{i}"),
                )
                for i in range(count)
            )
        ),
    )


@functools.lru_cache(maxsize=32)
def _update_spends(count: int, parts: tuple[Part, ...]) -> Statement:
    """The returned amount taken off s(p) (and s_J(p) or s_P(p), by the release kind, where
    the dataset keeps them) of the hold's partitions (:keys) in its ``count`` scopes."""
    columns = [f"{PART_PREFIXES[part]}{name}" for part in parts for name in COMPONENTS]
    return statement(
        update(TallySpend)
        .where(
            TallySpend.tally_id.in_(select(Tally.id).where(_scopes_where(count))),
            TallySpend.partition_id.in_(
                select(Partition.id).where(
                    Partition.dataset_id == bindparam("d"),
                    Partition.key.in_(bindparam("keys", expanding=True)),
                )
            ),
        )
        .values({name: getattr(TallySpend, name) - bindparam(name) for name in columns})
    )


@functools.lru_cache(maxsize=32)
def _update_totals(count: int, parts: tuple[Part, ...]) -> Statement:
    """The returned amount x multiplicity taken off the running totals of the parts it was
    added to, in the hold's ``count`` scopes, and each scope's largest s(p) found again
    from its s(p) (some fell)."""
    values: dict[Any, Any] = {}
    for part in parts:
        for name in COMPONENTS:
            column = getattr(Tally, f"total_{PART_PREFIXES[part]}{name}")
            values[column] = column - bindparam(f"total_{PART_PREFIXES[part]}{name}")
    for name in COMPONENTS:
        largest = (
            select(func.coalesce(func.max(getattr(TallySpend, name)), literal_column("0")))
            .where(TallySpend.tally_id == Tally.id)
            .scalar_subquery()
        )
        values[getattr(Tally, f"max_{name}")] = largest
    return statement(update(Tally).where(_scopes_where(count)).values(values))


_SETTLE_HOLD = statement(
    update(Hold)
    .where(Hold.id == bindparam("id"))
    .values(
        state=literal_column("'settled'"),
        settled_at=bindparam("t"),
        settled_by=bindparam("by"),
        used_epsilon=bindparam("uepsilon"),
        used_delta=bindparam("udelta"),
        used_rho=bindparam("urho"),
    )
)
