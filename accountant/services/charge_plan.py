"""What a charge writes: its decision as a plan of writes (``statements.WritePlan``).

``plan`` turns a ``Decision`` into the statements that record it, in blocks
whose statements do not depend on each other's writes (each block runs as
one statement on PostgreSQL, ``Driver.together``; ``statements.Block`` checks
the rule when the block is built):

- a grant that charges partitions or scopes for the first time first
  creates their rows: the partitions, and the new scope rows with the
  charge already in their figures. A new window also drops the windows that
  ended long ago, first their s(p), then their rows (two blocks more: each
  writes a table that another opening statement writes or reads);
- then one block. A grant adds its cost to s(p) (and to s_J(p) or s_P(p),
  by its release kind) of every charged partition in every scope, in one
  upsert that finds partitions and scope rows created by the blocks before
  by their keys, and writes every other scope's new T, T_J, T_P and largest
  s(p) (computed by ``accounting.loss``), and the new loss of the dataset's
  population, if it has one. Every charge appends its ledger
  entry and moves the chain's head to it, counts itself for /metrics and,
  with an idempotency key, remembers its response; the first grant signed
  with a receipt key publishes that key.

Nothing here reads the database, so the plan is built before anything is
written, and a refusal or a failed mechanism leaves the transaction as it
found it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import (
    BindParameter,
    ColumnClause,
    Select,
    and_,
    bindparam,
    case,
    delete,
    insert,
    literal_column,
    or_,
    select,
    update,
)

from accountant.accounting.charge_inputs import ChargeRequest, DatasetState
from accountant.accounting.decide import Decision
from accountant.accounting.loss import Part, ScopeKey, ScopeState, holds, max_after, total_after
from accountant.accounting.windows import PERIODS
from accountant.exact import COMPONENTS, Amount
from accountant.key_hashing import KeyHasher
from accountant.models import ChargeCount, Hold, Partition, Population, Tally, TallySpend
from accountant.models.tally import PART_PREFIXES
from accountant.services import charge_responses, idempotency, ledger, receipts
from accountant.statements import Block, Statement, Write, WritePlan, statement, upsert


class Planned:
    """A charge's writes, its ledger entry (the dataset's chain's new head and seal, once the
    writes are applied), and the facts of its answer.

    The facts (a grant's signed receipt among them) depend on nothing the writes change, so
    they are built when first asked for: inside the transaction when the charge's
    idempotency key remembers them, else after the commit, outside the dataset's lock,
    where building them holds up no other charge."""

    def __init__(
        self, writes: WritePlan, entry: ledger.Entry, answer: Callable[[], dict[str, Any]]
    ) -> None:
        self.writes, self.entry, self._answer = writes, entry, answer

    @functools.cached_property
    def facts(self) -> dict[str, Any]:
        return self._answer()


@dataclass(frozen=True)
class Signing:
    """How a grant's receipt is signed and its chain head sealed: the receipt key, whether
    it must be published with the grant, and the key-hash secret."""

    signer: Ed25519PrivateKey
    publish: bool
    hasher: KeyHasher


def plan(
    decision: Decision,
    request: ChargeRequest,
    *,
    charge_id: str,
    output_sha256: str | None,
    signing: Signing,
) -> Planned:
    """The writes that record ``decision`` on ``request`` as charge ``charge_id`` (a grant's
    output has SHA-256 ``output_sha256``), and its response.

    Args:
        decision: the charge as decided under its dataset's lock.
        request: the charge as asked for.
        charge_id: the new charge's id.
        output_sha256: a grant's output's digest (None for a denial).
        signing: the receipt key and the key-hash secret.
    """
    now, hold = decision.now_us, request.hold
    entry = _entry(decision, request, charge_id, signing.hasher)
    main = [*entry.writes]
    if hold is None:  # /metrics counts charges
        main.append(_count(decision, request))
    opening: list[Block] = []
    if decision.granted:
        if decision.drawn_from is not None:
            main.append(_draw(decision))  # its hold charged every scope already
        else:
            opening, scopes = _scope_writes(decision)
            main += scopes
            main += population_loss(decision.dataset, decision.population_after)
        if signing.publish:
            main.append(receipts.published(signing.signer, now))
        if hold is not None:
            main.append(_hold_row(decision, request))
    answer = functools.partial(_facts, decision, request, charge_id, output_sha256, entry, signing)
    if request.key is not None:  # its facts are remembered with it, in its transaction
        facts = answer()
        consumer = request.principal.consumer_id
        main.append(idempotency.remembered(consumer, request.key, request.fingerprint, facts, now))
        answer = functools.partial(dict, facts)
    return Planned(WritePlan((*opening, Block(tuple(main)))), entry, answer)


def _facts(
    decision: Decision,
    request: ChargeRequest,
    charge_id: str,
    output_sha256: str | None,
    entry: ledger.Entry,
    signing: Signing,
) -> dict[str, Any]:
    """What the answer to ``request`` states (``charge_responses``), but its output."""
    now, hold = decision.now_us, request.hold
    if decision.granted:
        if hold is not None:
            return charge_responses.held(decision, request, now, entry.head, signing.signer)
        assert output_sha256 is not None
        return charge_responses.granted(
            decision, request, charge_id, now, output_sha256, entry.head, signing.signer
        )
    facts = charge_responses.denied(decision, charge_id, now)
    if hold is not None:
        del facts["charge_id"]
        facts["hold_id"] = hold.hold_id
        facts["reason"] = facts["reason"].replace("this charge", "this hold", 1)
    return facts


def _entry(
    decision: Decision, request: ChargeRequest, charge_id: str, hasher: KeyHasher
) -> ledger.Entry:
    """The charge's ledger entry; a grant records what produced its output. Every charge
    records the digest of the terms it was checked against, so that limits edited in the
    database show even before their first limit change."""
    granted, hold = decision.granted, request.hold
    detail = {} if granted else _denial_detail(decision)
    detail["terms_sha256"] = decision.dataset.terms_sha256
    if request.share is not None:
        detail.update(charge_responses.batch_detail(request.share))
    if hold is not None:
        detail["expires_at"] = decision.expires_at
        if hold.purpose is not None:
            detail["purpose"] = hold.purpose
    return ledger.entry(
        decision.dataset,
        ledger.Actor(request.principal.consumer_id, request.principal.name),
        kind="charge" if hold is None else "hold",
        status="granted" if granted else "denied",
        created_at=decision.now_us,
        charge_id=charge_id if hold is None else None,
        hold_id=request.draw if hold is None else hold.hold_id,
        mechanism=None if request.mechanism is None else request.mechanism.name,
        release=request.release,
        partitions=decision.partitions,
        params=ledger.plain_params(_with_unit(request)),
        cost=decision.priced.cost,
        multiplicity=decision.priced.multiplicity,
        detail=detail,
        noise_secret=request.noise_secret if granted and hold is None else None,
        implementation=request.mechanism_to_run.implementation
        if granted and hold is None
        else None,
        loss_after=decision.lifetime_after if granted else decision.lifetime_now,
        hasher=hasher,
    )


def _count(decision: Decision, request: ChargeRequest) -> Write:
    """One more charge of its mechanism and outcome on its dataset, for /metrics."""
    outcome = "granted" if decision.granted else "denied"
    return Write(
        _COUNT_CHARGE,
        {"d": decision.dataset.id, "m": request.mechanism_to_run.name, "o": outcome},
    )


def population_loss(dataset: DatasetState, after: Amount | None) -> list[Write]:
    """The write that sets the loss of ``dataset``'s population to ``after`` (none when it
    has no population, or its loss stays as it was). The population's row is locked, so its
    new figure is computed here."""
    population = dataset.population
    if population is None or after is None or after == population.loss:
        return []
    params = {"id": population.id, "e": after.epsilon, "d": after.delta, "r": after.rho}
    return [Write(_SET_POPULATION_LOSS, params)]


_SET_POPULATION_LOSS = statement(
    update(Population)
    .where(Population.id == bindparam("id"))
    .values(loss_epsilon=bindparam("e"), loss_delta=bindparam("d"), loss_rho=bindparam("r"))
)


def _hold_row(decision: Decision, request: ChargeRequest) -> Write:
    """A granted hold's row: what it charged (its amount, multiplicity m times) and to which
    scopes, so that a settle can give back what its job did not use."""
    hold = request.hold
    assert hold is not None and decision.expires_at is not None
    cost = decision.priced.cost
    return Write(
        _INSERT_HOLD,
        {
            "id": hold.hold_id,
            "dataset_id": decision.dataset.id,
            "consumer_id": request.principal.consumer_id,
            "release": request.release,
            "partitions": json.dumps(decision.partitions),
            "mechanism": None if request.mechanism is None else request.mechanism.name,
            # exact, as a settle merges its parameters into them and prices them again
            "params": json.dumps(idempotency.encode_params(_with_unit(request))),
            "amount_epsilon": cost.epsilon,
            "amount_delta": cost.delta,
            "amount_rho": cost.rho,
            "multiplicity": decision.priced.multiplicity,
            "drawn_epsilon": 0,
            "drawn_delta": 0,
            "drawn_rho": 0,
            "scopes": json.dumps([list(scope.key) for scope in decision.scopes]),
            "state": "open",
            "purpose": hold.purpose,
            "created_at": decision.now_us,
            "expires_at": decision.expires_at,
            "settled_at": None,
            "settled_by": None,
            "used_epsilon": None,
            "used_delta": None,
            "used_rho": None,
        },
    )


def _draw(decision: Decision) -> Write:
    """A draw's cost taken from its hold's remainder (the dataset's lock serialises every
    write to a hold, so the new figure is computed here)."""
    hold = decision.drawn_from
    assert hold is not None
    drawn = hold.drawn.plus(decision.priced.cost)
    return Write(
        _UPDATE_DRAWN, {"id": hold.id, "e": drawn.epsilon, "d": drawn.delta, "r": drawn.rho}
    )


_UPDATE_DRAWN = statement(
    update(Hold)
    .where(Hold.id == bindparam("id"))
    .values(drawn_epsilon=bindparam("e"), drawn_delta=bindparam("d"), drawn_rho=bindparam("r"))
)

_INSERT_HOLD = statement(
    insert(Hold).values({c.name: bindparam(c.name) for c in Hold.__table__.columns})
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


def _with_unit(request: ChargeRequest) -> dict[str, Any]:
    """The request's parameters as sent, ``sensitivity_unit`` included."""
    params = dict(request.params)
    if request.sensitivity_unit is not None:
        params["sensitivity_unit"] = request.sensitivity_unit
    return params


def _denial_detail(decision: Decision) -> dict[str, Any]:
    denial = decision.denial
    assert denial is not None
    detail: dict[str, Any] = {"scope": denial.scope}
    if denial.partition is not None:
        detail["partition"] = denial.partition
    if denial.window is not None:
        detail["window_start"] = denial.window.start
        detail["period"] = denial.window.name
    if denial.population is not None:
        detail["population"] = denial.population
    return detail


def _scope_writes(decision: Decision) -> tuple[list[Block], list[Write]]:
    """A grant's writes to its partitions and scopes: (the blocks that create the rows it
    charges for the first time, its writes in the charge's last block)."""
    dataset = decision.dataset
    opening: list[Write] = []
    missing = [key for key in decision.partitions if key not in decision.partition_ids]
    if missing:
        params: dict[str, Any] = {"d": dataset.id, "t": decision.now_us}
        params.update((f"k{i}", key) for i, key in enumerate(missing))
        opening.append(Write(_insert_partitions(len(missing)), params))
    new = [scope for scope in decision.scopes if scope.id is None]
    old = [scope for scope in decision.scopes if scope.id is not None]
    blocks: list[Block] = []
    if new:
        rows: dict[str, Any] = {"d": dataset.id}
        for i, scope in enumerate(new):
            kind, consumer, period, start = scope.key
            rows.update({f"kind{i}": kind, f"c{i}": consumer, f"p{i}": period, f"s{i}": start})
            rows.update(_figures(decision, scope.state, i))
        tallies = Write(_insert_tallies(len(new)), rows)
        if any(scope.key[0] == "window" for scope in new):
            # a new window began: its rows are written after the ended ones are dropped
            cutoff = {
                "d": dataset.id,
                "cutoff": decision.now_us // 1_000_000 - max(PERIODS.values()),
            }
            blocks += [
                Block((Write(_PRUNE_SPENDS, cutoff), *opening)),
                Block((Write(_PRUNE_TALLIES, cutoff),)),
                Block((tallies,)),
            ]
        else:
            blocks.append(Block((*opening, tallies)))
    elif opening:
        blocks.append(Block(tuple(opening)))
    last = [_spends(decision, [] if new else [s.id for s in old if s.id is not None])]
    if old:
        figures: dict[str, Any] = {}
        for i, scope in enumerate(old):
            figures[f"id{i}"] = scope.id
            figures.update(_figures(decision, scope.state, i))
        last.append(Write(_update_tallies(len(old)), figures))
    return blocks, last


def figures_after(decision: Decision, state: ScopeState) -> dict[str, Amount]:
    """A scope's figures after the grant, by their parameters' prefixes: T, T_J and T_P of
    the parts the dataset keeps (the others stay as they are) and the largest s(p) ("m")."""
    cost, m = decision.priced.cost, decision.priced.multiplicity
    release, kept = decision.checker.release, decision.checker.rule.parts
    values = {
        prefix: total_after(state, cost, m, part, release)
        if part in kept
        else state.part_total(part)
        for prefix, part in _TOTALS.items()
    }
    values["m"] = max_after(state, cost)
    return values


def spend_increments(decision: Decision) -> dict[Part, Amount]:
    """What the grant adds to s(p) (and to s_J(p) or s_P(p), by its release kind) of each
    charged partition in every scope, for each part the dataset keeps."""
    release, kept = decision.checker.release, decision.checker.rule.parts
    return {part: decision.priced.cost if holds(part, release) else Amount() for part in kept}


def _figures(decision: Decision, state: ScopeState, i: int) -> dict[str, int]:
    """A scope's figures after the grant (``figures_after``), as the i-th row's
    parameters."""
    values = figures_after(decision, state)
    params = {}
    for prefix, amount in values.items():
        params.update(
            {
                f"{prefix}e{i}": amount.epsilon,
                f"{prefix}d{i}": amount.delta,
                f"{prefix}r{i}": amount.rho,
            }
        )
    return params


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

#: Each scope row's totals (T, T_J, T_P) and maxima, by their parameters' prefixes.
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
    """Scope rows updated in one statement (:id{i} and its new figures): one CASE per
    column."""
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


@functools.lru_cache(maxsize=16)
def _insert_tallies(count: int) -> Statement:
    """``count`` new scope rows with their figures after the charge."""
    rows: list[dict[Any, Any]] = [
        {
            Tally.dataset_id: bindparam("d"),
            Tally.kind: bindparam(f"kind{i}"),
            Tally.consumer_id: bindparam(f"c{i}"),
            Tally.period_seconds: bindparam(f"p{i}"),
            Tally.window_start: bindparam(f"s{i}"),
            **{column: bindparam(f"{name}{i}") for name, column in _TALLY_COLUMNS.items()},
        }
        for i in range(count)
    ]
    return statement(insert(Tally).values(rows))


#: A new window began: the tallies of windows that ended more than the longest window
#: length ago are dropped. No charge or report reads them again (a charge reads the windows
#: around its own clock, so a host whose clock lags by less than that still finds the
#: window it charges), and the ledger keeps every charge.
_ENDED = select(Tally.id).where(
    Tally.dataset_id == bindparam("d"),
    Tally.kind == literal_column("'window'"),
    Tally.window_start + Tally.period_seconds < bindparam("cutoff"),
)
_PRUNE_SPENDS = statement(delete(TallySpend).where(TallySpend.tally_id.in_(_ENDED)))
_PRUNE_TALLIES = statement(delete(Tally).where(Tally.id.in_(_ENDED)))


def _spends(decision: Decision, tally_ids: list[int]) -> Write:
    """Add the cost to s(p) and, of the parts the dataset keeps, to s_J(p) or s_P(p) by the
    release kind, of every charged partition (all of them for ``"*"``) in every scope: by
    the scopes' ids (``tally_ids``), or by their keys when some are created in this
    charge."""
    dataset = decision.dataset
    kept = decision.checker.rule.parts
    params: dict[str, Any] = {"dataset": dataset.id}
    for part, added in spend_increments(decision).items():  # bound by each column's name
        params.update({f"{PART_PREFIXES[part]}{name}": added[name] for name in COMPONENTS})
    if not decision.all_partitions:
        params["keys"] = decision.partitions
    keys: list[ScopeKey] = []
    if tally_ids:
        params["tallies"] = tally_ids
    else:
        keys = [scope.key for scope in decision.scopes]
        for i, (kind, consumer, period, start) in enumerate(keys):
            params.update({f"nk{i}": kind, f"nc{i}": consumer, f"np{i}": period, f"ns{i}": start})
    return Write(_upsert_spends(not decision.all_partitions, kept, len(keys)), params)


@functools.lru_cache(maxsize=16)
def _upsert_spends(some: bool, kept: tuple[Part, ...], by_key: int) -> Statement:
    """The cost added to the ``kept`` parts' spends (:epsilon, :joint_epsilon, ...) of every
    scope and partition (:keys if ``some``): the scopes by id (:tallies), or, with
    ``by_key``, by the keys of that many (SQLite needs the WHERE clause of the SELECT to
    parse ``ON CONFLICT``). A dataset without the top-k rule keeps s(p) alone, so its
    charges never touch the other parts' columns or indexes."""
    spends = [f"{PART_PREFIXES[part]}{name}" for part in kept for name in COMPONENTS]
    scopes = (
        and_(
            Tally.dataset_id == bindparam("dataset"),
            or_(
                *(
                    and_(
                        Tally.kind == bindparam(f"nk{i}"),
                        Tally.consumer_id == bindparam(f"nc{i}"),
                        Tally.period_seconds == bindparam(f"np{i}"),
                        Tally.window_start == bindparam(f"ns{i}"),
                    )
                    for i in range(by_key)
                )
            ),
        )
        if by_key
        else Tally.id.in_(bindparam("tallies", expanding=True))
    )
    charged: Select[Any] = select(  # type: ignore[assignment]  # typed by its columns
        Tally.id, Partition.id, *(bindparam(column) for column in spends)
    ).where(scopes, Partition.dataset_id == bindparam("dataset"))
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

    return upsert(
        build,
        unaffected={
            "tallies": "it reads the scope rows' ids and keys, which the update of their "
            "figures in the same block leaves as they are"
        },
    )
