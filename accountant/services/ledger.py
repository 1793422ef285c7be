"""Appending to and reading the ledger; each dataset's entries form one hash chain.

Entries are appended only while the dataset row is locked (every writer
takes that lock first), so ``seq`` and ``prev_hash`` come from the dataset
row itself: no scan of the ledger, no fork of the chain. The statement that
moves the row's head to a new entry also writes the head's seal
(``seals.next_head_seal``), which ``services.verification`` checks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Select, and_, bindparam, func, insert, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from accountant import seals
from accountant.accounting.charge_inputs import DatasetState
from accountant.driver import Driver
from accountant.exact import Amount
from accountant.key_hashing import KeyHasher
from accountant.models import AdminChain, Consumer, Dataset, LedgerEntry, Population
from accountant.statements import Write, statement

GENESIS = "0" * 64


@dataclass(frozen=True)
class Actor:
    """Who made an entry: a consumer's id and name."""

    id: int
    name: str


def canonical(entry: LedgerEntry, dataset_name: str, consumer_name: str | None) -> bytes:
    """The bytes an entry's hash covers: sorted-key JSON of integers and strings only."""
    return _canonical(
        {name: getattr(entry, name) for name in _COLUMNS}, dataset_name, consumer_name
    )


def _canonical(values: dict[str, Any], dataset_name: str, consumer_name: str | None) -> bytes:
    content = {
        "seq": values["seq"],
        "kind": values["kind"],
        "charge_id": values["charge_id"],
        "dataset": dataset_name,
        "consumer": consumer_name,
        "status": values["status"],
        "mechanism": values["mechanism"],
        "release": values["release"],
        "partitions": values["partitions"],
        "params": values["params"],
        "cost": [values["cost_epsilon"], values["cost_delta"], values["cost_rho"]],
        "multiplicity": values["multiplicity"],
        "detail": values["detail"],
        "created_at": values["created_at"],
    }
    # Replay provenance, recorded with granted charges since revision 0004, and the hold an
    # entry made, drew on or settled, since revision 0018; hashed when present, so entries
    # written before them keep their hashes.
    for name in ("noise_secret", "implementation", "hold_id"):
        if values.get(name) is not None:
            content[name] = values[name]
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def plain_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters as an entry stores and hashes them: a decimal as its exact text, which
    JSON has no other form for."""
    return {k: str(v) if isinstance(v, Decimal) else v for k, v in params.items()}


def adds_to_totals(kind: str, status: str, hold_id: str | None) -> bool:
    """Whether an entry's cost x multiplicity went into its scopes' running totals: a
    granted hold (charged in full when granted), or a granted charge that drew on no hold
    (a draw was charged by its hold already)."""
    if status != "granted":
        return False
    return kind == "hold" or (kind == "charge" and hold_id is None)


def gives_back(kind: str, status: str) -> bool:
    """Whether an entry took its cost x multiplicity off its scopes' running totals: a
    settle, which returns what its hold's job did not use to the scopes the hold charged."""
    return kind == "settle" and status == "granted"


#: ``adds_to_totals`` or ``gives_back`` as a condition on ledger rows, for the reads that
#: replay the totals.
CHANGES_TOTALS = and_(
    LedgerEntry.status == "granted",
    or_(
        LedgerEntry.kind.in_(("hold", "settle")),
        and_(LedgerEntry.kind == "charge", LedgerEntry.hold_id.is_(None)),
    ),
)


def chain_hash(prev_hash: str, content: bytes) -> str:
    return hashlib.sha256(prev_hash.encode() + content).hexdigest()


#: Whose chain an entry joins: a dataset's, a population's (its limit changes), or the
#: admins' (approved new admins).
ChainOwner = Dataset | DatasetState | Population | AdminChain

#: Each kind of chain owner, and the ledger column that names an entry's owner of that kind.
OWNERS: tuple[tuple[type[Dataset | Population | AdminChain], str], ...] = (
    (Dataset, "dataset_id"),
    (Population, "population_id"),
    (AdminChain, "admin_chain_id"),
)


def owner_column(owner: ChainOwner) -> str:
    """The ledger column that names ``owner`` as an entry's chain owner."""
    if isinstance(owner, Population):
        return "population_id"
    return "admin_chain_id" if isinstance(owner, AdminChain) else "dataset_id"


def append(
    driver: Driver,
    dataset: ChainOwner,
    consumer: Actor | None,
    *,
    hasher: KeyHasher | None,
    **fields: Any,
) -> ChainHead:
    """Add one entry at the end of ``dataset``'s chain (the dataset row must be locked);
    the chain's new head, which is the entry's own seq and hash. ``fields``: the entry's,
    as ``entry`` takes them."""
    added = entry(dataset, consumer, hasher=hasher, **fields)
    for write in added.writes:
        driver.run(write.statement, write.params)
    if isinstance(dataset, Dataset | Population | AdminChain):  # keep a loaded row in step
        set_committed_value(dataset, "ledger_seq", added.head.seq)
        set_committed_value(dataset, "ledger_head", added.head.hash)
        set_committed_value(dataset, "head_seal", added.seal)
    return added.head


def entry(
    dataset: ChainOwner,
    consumer: Actor | None,
    *,
    kind: str,
    status: str,
    created_at: int,
    charge_id: str | None = None,
    mechanism: str | None = None,
    release: str | None = None,
    partitions: list[str] | None = None,
    params: dict[str, Any] | None = None,
    cost: Amount = Amount(),
    multiplicity: int = 1,
    detail: dict[str, Any] | None = None,
    noise_secret: str | None = None,
    implementation: str | None = None,
    loss_after: Amount | None = None,
    hold_id: str | None = None,
    hasher: KeyHasher | None,
) -> Entry:
    """The writes that add one entry at the end of ``dataset``'s chain, as it stands in
    ``dataset`` (whose row must be locked until they are committed), and the chain's new
    head: the entry's own seq and hash. A population's chain, and the admins', is hashed as
    a dataset's, its name in the entry's ``dataset`` field: populations and datasets share
    one namespace, and the admins' chain has a name neither can have (``ADMINS``).

    The statement that moves the dataset's head also writes its seal
    (``seals.next_head_seal``: with ``hasher``, the new head's seal if the old one holds).
    Two driver statements, which do not depend on each other's writes, and no ORM object:
    this runs on every charge."""
    column = owner_column(dataset)
    values: dict[str, Any] = {
        "seq": dataset.ledger_seq + 1,
        "kind": kind,
        "charge_id": charge_id,
        **{name: dataset.id if name == column else None for _, name in OWNERS},
        "consumer_id": consumer.id if consumer else None,
        "status": status,
        "mechanism": mechanism,
        "release": release,
        "partitions": partitions or [],
        "params": params or {},
        "cost_epsilon": cost.epsilon,
        "cost_delta": cost.delta,
        "cost_rho": cost.rho,
        "multiplicity": multiplicity,
        "detail": detail or {},
        "created_at": created_at,
        "noise_secret": noise_secret,
        "implementation": implementation,
        "loss_after_epsilon": None if loss_after is None else loss_after.epsilon,
        "loss_after_delta": None if loss_after is None else loss_after.delta,
        "loss_after_rho": None if loss_after is None else loss_after.rho,
        "hold_id": hold_id,
        "prev_hash": dataset.ledger_head or GENESIS,
    }
    values["hash"] = chain_hash(
        values["prev_hash"], _canonical(values, dataset.name, consumer.name if consumer else None)
    )
    for name in ("partitions", "params", "detail"):
        values[name] = json.dumps(values[name])
    seal = seals.next_head_seal(
        hasher,
        dataset.name,
        (dataset.ledger_seq, values["prev_hash"], dataset.head_seal),
        (values["seq"], values["hash"]),
    )
    advance = {"seq": values["seq"], "head": values["hash"], "seal": seal, "id": dataset.id}
    return Entry(
        (Write(_INSERT, values), Write(_ADVANCE[column], advance)),
        ChainHead(values["seq"], values["hash"]),
        seal,
    )


class ChainHead(NamedTuple):
    """The end of a dataset's chain: its last entry's seq and hash."""

    seq: int
    hash: str


class Entry(NamedTuple):
    """A new entry's writes (the entry, and the dataset's head moved to it), the chain's new
    head and its seal."""

    writes: tuple[Write, Write]
    head: ChainHead
    seal: str | None


#: Every column an entry is written with (its id is the database's).
_COLUMNS = tuple(c.name for c in LedgerEntry.__table__.columns if c.name != "id")
_INSERT = statement(insert(LedgerEntry).values({name: bindparam(name) for name in _COLUMNS}))
#: The chain's head moved to a new entry, by the ledger column that names its owner.
_ADVANCE = {
    column: statement(
        update(owner)
        .where(owner.id == bindparam("id"))
        .values(
            ledger_seq=bindparam("seq"), ledger_head=bindparam("head"), head_seal=bindparam("seal")
        )
    )
    for owner, column in OWNERS
}


@dataclass(frozen=True, kw_only=True)
class LedgerFilter:
    """Which ledger entries a listing or an export reads.

    Args:
        dataset_id: only this dataset's entries.
        population_id: only this population's entries (its own chain: its limit changes).
        admin_chain_id: only the admins' chain's entries (approved new admins).
        consumer_id: only this consumer's entries.
        status: only entries of this status.
        since: only entries created at or after this time (microseconds).
        until: only entries created before this time (microseconds).
        after_id: only entries after this id (a cursor).
        limit: at most this many entries.
        through_id: no entry after this id (an export's fixed end).
        before_id: only entries before this id.
        newest_first: newest first, rather than oldest first.
    """

    dataset_id: int | None = None
    population_id: int | None = None
    admin_chain_id: int | None = None
    consumer_id: int | None = None
    status: str | None = None
    since: int | None = None
    until: int | None = None
    after_id: int = 0
    limit: int = 100
    through_id: int | None = None
    before_id: int | None = None
    newest_first: bool = False


#: An entry's chain's name: its dataset's, its population's, or the admins' chain's.
OWNER_NAME = func.coalesce(Dataset.name, Population.name, AdminChain.name)


def query(filters: LedgerFilter) -> Select[LedgerEntry, str, str]:
    """Entries matching ``filters``, oldest first (or newest first), with their chain's name
    (a dataset's, or a population's) and their consumer's."""
    return matching(filters).limit(filters.limit)


def count(filters: LedgerFilter) -> Select[int]:
    """How many entries match ``filters`` (its position and limit aside)."""
    return select(func.count()).select_from(
        matching(replace(filters, after_id=0, before_id=None)).order_by(None).subquery()
    )


def matching(filters: LedgerFilter) -> Select[LedgerEntry, str, str]:
    """Every entry matching ``filters``, in its order, with its chain's name: the name its
    hash covers as ``dataset``, a dataset's or a population's (one namespace). Both
    kinds of chain are read unless ``filters`` names one."""
    if filters.dataset_id is None:
        statement = (
            select(LedgerEntry, OWNER_NAME, Consumer.name)
            .outerjoin(Dataset, Dataset.id == LedgerEntry.dataset_id)
            .outerjoin(Population, Population.id == LedgerEntry.population_id)
            .outerjoin(AdminChain, AdminChain.id == LedgerEntry.admin_chain_id)
        )
    else:  # one dataset's chain
        statement = select(LedgerEntry, Dataset.name, Consumer.name).join(
            Dataset, Dataset.id == LedgerEntry.dataset_id
        )
    statement = (
        statement.outerjoin(Consumer, Consumer.id == LedgerEntry.consumer_id)
        .where(LedgerEntry.id > filters.after_id)
        .order_by(LedgerEntry.id.desc() if filters.newest_first else LedgerEntry.id)
    )
    if filters.dataset_id is not None:
        statement = statement.where(LedgerEntry.dataset_id == filters.dataset_id)
    if filters.population_id is not None:
        statement = statement.where(LedgerEntry.population_id == filters.population_id)
    if filters.admin_chain_id is not None:
        statement = statement.where(LedgerEntry.admin_chain_id == filters.admin_chain_id)
    if filters.consumer_id is not None:
        statement = statement.where(LedgerEntry.consumer_id == filters.consumer_id)
    if filters.status is not None:
        statement = statement.where(LedgerEntry.status == filters.status)
    if filters.since is not None:
        statement = statement.where(LedgerEntry.created_at >= filters.since)
    if filters.until is not None:
        statement = statement.where(LedgerEntry.created_at < filters.until)
    if filters.through_id is not None:
        statement = statement.where(LedgerEntry.id <= filters.through_id)
    if filters.before_id is not None:
        statement = statement.where(LedgerEntry.id < filters.before_id)
    return statement


def anchors_missing(session: Session, anchors: dict[str, tuple[int, str]]) -> list[str]:
    """What an earlier copy of the ledger shows that the chains no longer hold.

    ``anchors`` maps each chain, by its owner's name (a dataset's or a population's: one
    namespace), to the last (seq, hash) an earlier export showed. The chain links every
    entry to the ones before it, so when the current chain (verified first) holds that hash
    at that seq, it holds the whole earlier copy unchanged; when it does not, entries were
    truncated, rewritten or the chain deleted since the copy.
    """
    problems = []
    for name, (seq, expected) in sorted(anchors.items()):
        chain = chain_of(session, name)
        if chain is None:
            problems.append(
                f"dataset or population {name!r} is gone; an earlier copy has {seq} entries"
            )
            continue
        found = session.execute(
            select(LedgerEntry.hash).where(chain.entries, LedgerEntry.seq == seq)
        ).scalar()
        if found is None:
            problems.append(
                f"{chain.what} {name!r} has no entry {seq}, which an earlier copy has "
                "(entries deleted and the chain's head rewound?)"
            )
        elif found != expected:
            problems.append(
                f"{chain.what} {name!r} entry {seq} is not the one an earlier copy has "
                "(the chain was rewritten)"
            )
    return problems


class Chain(NamedTuple):
    """A chain of the ledger, known by its owner's name: a dataset's or a population's."""

    what: str  # "dataset", "population" or "chain"
    dataset_id: int | None
    population_id: int | None
    admin_chain_id: int | None = None

    @property
    def entries(self) -> ColumnElement[bool]:
        """The condition on ledger rows that selects this chain's entries."""
        if self.population_id is not None:
            return LedgerEntry.population_id == self.population_id
        if self.admin_chain_id is not None:
            return LedgerEntry.admin_chain_id == self.admin_chain_id
        return LedgerEntry.dataset_id == self.dataset_id


def chain_of(session: Session, name: str) -> Chain | None:
    """The chain of the dataset or population named ``name`` (they share one namespace of
    names), or None if neither has that name."""
    dataset_id = session.execute(select(Dataset.id).where(Dataset.name == name)).scalar()
    if dataset_id is not None:
        return Chain("dataset", dataset_id, None)
    population_id = session.execute(select(Population.id).where(Population.name == name)).scalar()
    if population_id is not None:
        return Chain("population", None, population_id)
    admin_chain_id = session.execute(select(AdminChain.id).where(AdminChain.name == name)).scalar()
    if admin_chain_id is not None:
        return Chain("chain", None, None, admin_chain_id)
    return None
