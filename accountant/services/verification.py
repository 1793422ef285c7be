"""Verifying the ledger: every chain recomputed, its head checked against the head the
service sealed, every ``loss_after`` recomputed, and with the key-hash secret every seal.

A chain's hashes are keyed by nothing, so whoever can write the database can append a
well-formed entry and move the dataset's recorded head to it. The head's seal
(``seals.of_head``, written by the statement that moves the head) is what they cannot
make: ``verify`` finds the last head the service sealed and names the first entry after
it. ``loss_after`` is not hashed; it follows from the chain (the lifetime loss after each
entry, by the dataset's loss rule), so ``verify`` recomputes it and names the first entry
that differs (docs/ledger.md).

Each population's chain, which records its limit changes, is walked like a dataset's
(hashes, links, ids, its recorded head and the head's seal), with no loss to replay; its
limit must be the ``new`` limit of its last limit change. So is the admins' chain, which
records approved new admins.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from accountant import seals
from accountant.accounting.loss import LossRule, RunningLoss
from accountant.exact import COMPONENTS, Amount, ComponentName
from accountant.key_hashing import KeyHasher
from accountant.models import (
    AdminChain,
    ChangeRequest,
    Consumer,
    Dataset,
    Hold,
    KeyHashSecret,
    LedgerEntry,
    Population,
)
from accountant.models.admin_chain import ADMINS
from accountant.services import datasets, terms
from accountant.services.ledger import (
    GENESIS,
    OWNERS,
    adds_to_totals,
    canonical,
    chain_hash,
    gives_back,
    owner_column,
)


@dataclass(frozen=True, kw_only=True)
class Verification:
    """The result of recomputing every chain: ok, entries checked, heads, or the first break.

    Args:
        ok: whether ``verify`` found no problem.
        entries: the entries checked.
        heads: each chain's head hash, by its owner's name (a dataset's or a population's).
        first_bad: the first entry that does not verify, if one does not.
        dataset: the dataset or population of the first break (None: none in particular).
        reason: what is wrong there.
        seals_checked: whether every seal, the chain heads' included, was recomputed
            (``accountant.seals``).
    """

    ok: bool
    entries: int
    heads: dict[str, str]
    first_bad: LedgerEntry | None = None
    dataset: str | None = None
    reason: str | None = None
    seals_checked: bool = False


@dataclass(frozen=True)
class Problem:
    """What is wrong, in which dataset or population (None: none in particular), at which
    entry."""

    dataset: str | None
    reason: str
    entry: LedgerEntry | None = None


def verify(session: Session, progress: Any = None, hasher: KeyHasher | None = None) -> Verification:
    """Recompute each dataset's chain, then each population's, from its first entry, and
    report the first problem.

    An edited entry no longer matches its hash; a deleted or reordered one
    breaks the seq count or the prev_hash link; entries whose ids were swapped
    (which reorders every listing, ordered by id) break the rule that ids grow
    with seq; a deleted last entry leaves the dataset's recorded head pointing
    past the chain's end, and an entry appended without moving it lies past that
    head; a limit, bound or window edited in the database no longer matches the
    terms digest the service recorded; a population's limit edited in the database is not
    the one its last limit change set.

    With ``hasher`` (the key-hash secret), every seal is recomputed then: terms edited
    together with their digest (before a dataset's first entry, say) and consumers' roles,
    grants, quotas and keys edited in the database show there, and so does a missing seal,
    a database never sealed or one whose record of its seals was cleared, or a secret that
    is not the database's (``accountant.seals.problem``). Then each chain's head must be
    the one the service sealed (``head_problem``): entries appended together with a moved
    head, and a chain cut back together with its head, show there. A chain cut back to a
    head sealed earlier, with that earlier seal put back, is caught only against an
    earlier copy (``ledger.anchors_missing``) or a receipt.

    Last, each entry's ``loss_after`` must be the lifetime loss its chain gives after it
    (``RunningLoss``): reported after the seals, which say better what was written behind
    the service's back when both are off.
    """
    consumers = dict(session.execute(select(Consumer.id, Consumer.name)).all())
    checked = 0
    heads: dict[str, str] = {}
    wrong_loss: Problem | None = None
    approvals: set[str] = set()  # the hashes of the admins' chain's entries
    for owner in _owners(session):
        walk = _Walk(owner, _running_loss(owner) if isinstance(owner, Dataset) else None)
        chain = getattr(LedgerEntry, owner_column(owner))
        for entry in session.execute(
            select(LedgerEntry).where(chain == owner.id).order_by(LedgerEntry.seq)
        ).scalars():
            problem = walk.step(entry, consumers.get(entry.consumer_id or 0))
            if problem:
                return Verification(
                    ok=False,
                    entries=checked,
                    heads=heads,
                    first_bad=entry,
                    dataset=owner.name,
                    reason=problem,
                )
            checked += 1
            if progress is not None and checked % 10_000 == 0:
                progress(checked)
        found = walk.end_problem() or _owner_problem(session, owner, walk)
        if found:
            return Verification(
                ok=False,
                entries=checked,
                heads=heads,
                first_bad=found.entry,
                dataset=owner.name,
                reason=found.reason,
            )
        wrong_loss = wrong_loss or walk.wrong_loss
        approvals |= walk.approvals
        if owner.ledger_seq:
            heads[owner.name] = walk.head
    found = _unledgered_admin(session, approvals)
    if found:
        return Verification(
            ok=False, entries=checked, heads=heads, dataset=found.dataset, reason=found.reason
        )
    if hasher is not None:
        sealed = seals.problem(session, hasher)
        found = Problem(*sealed) if sealed else head_problem(session, hasher)
        wrong_loss = found or wrong_loss
    if wrong_loss is not None:
        return Verification(
            ok=False,
            entries=checked,
            heads=heads,
            first_bad=wrong_loss.entry,
            dataset=wrong_loss.dataset,
            reason=wrong_loss.reason,
            seals_checked=hasher is not None,
        )
    return Verification(ok=True, entries=checked, heads=heads, seals_checked=hasher is not None)


def _unledgered_admin(session: Session, ledgered: set[str]) -> Problem | None:
    """The first approved request for a new admin or admin key whose entry (its
    ``ledger_hash``) the admins' chain does not hold (``ledgered``: the hashes it does), if
    one is not: every such approval is ledgered in its own transaction, so the chain, or
    entries of it, were deleted. The requests are rows the service keeps, not a chain: this
    catches a deletion of the chain alone, not one of the requests with it."""
    for request_id, kind, target, approver, entry in session.execute(
        select(
            ChangeRequest.id,
            ChangeRequest.kind,
            ChangeRequest.target,
            ChangeRequest.decided_by_name,
            ChangeRequest.ledger_hash,
        )
        .where(ChangeRequest.state == "approved", ChangeRequest.ledger_hash.is_not(None))
        .order_by(ChangeRequest.decided_at, ChangeRequest.id)
    ).all():
        if entry not in ledgered:
            return Problem(
                ADMINS,
                f"request {request_id} ({kind.replace('_', ' ')} {target!r}, approved by "
                f"{approver}) has no entry in the admins' chain, which ledgers every approved "
                "new admin (the chain, or entries of it, deleted?)",
            )
    return None


def _holds_problem(
    session: Session, dataset: Dataset, entries: dict[str, LedgerEntry]
) -> Problem | None:
    """Why a hold of ``dataset`` is not the one its ledger entry charged, if one is not:
    its amount, multiplicity, partitions and release are what its draws are checked
    against, so one edited in the database (a larger amount) would let draws take more
    than was charged. A hold without its entry was made in the database."""
    for hold in session.execute(
        select(Hold).where(Hold.dataset_id == dataset.id).order_by(Hold.created_at)
    ).scalars():
        entry = entries.get(hold.id)
        if entry is None:
            return Problem(
                dataset.name,
                f"hold {hold.id} has no ledger entry: made in the database, not by the "
                "service, which ledgers every hold it grants (forged?)",
            )
        amount = Amount(hold.amount_epsilon, hold.amount_delta, hold.amount_rho)
        recorded = (entry.cost, entry.multiplicity, list(entry.partitions), entry.release)
        if (amount, hold.multiplicity, list(hold.partitions), hold.release) != recorded:
            return Problem(
                dataset.name,
                f"hold {hold.id}'s amount, multiplicity, partitions or release is not what "
                "its ledger entry charged (edited in the database?)",
                entry,
            )
    return None


def _owners(session: Session) -> Iterator[Dataset | Population | AdminChain]:
    """Every chain's owner: each dataset, then each population, then the admins' chain."""
    yield from session.execute(select(Dataset).order_by(Dataset.id)).scalars()
    yield from session.execute(select(Population).order_by(Population.id)).scalars()
    yield from session.execute(select(AdminChain).order_by(AdminChain.id)).scalars()


def _owner_problem(
    session: Session, owner: Dataset | Population | AdminChain, walk: _Walk
) -> Problem | None:
    """What is wrong with ``owner`` besides its chain: a dataset's limits or holds, or a
    population's limit, not the ones its chain set (the admins' chain has neither)."""
    if isinstance(owner, Population):
        return _limit_problem(owner, walk.limit_set)
    if isinstance(owner, Dataset):
        return _terms_problem(owner, walk.recorded_terms) or _holds_problem(
            session, owner, walk.held
        )
    return None


class _Walk:
    """One chain as ``verify`` reads it, entry by entry, in seq order: a dataset's, a
    population's or the admins' (``loss`` None: nothing to replay)."""

    def __init__(
        self, dataset: Dataset | Population | AdminChain, loss: RunningLoss | None
    ) -> None:
        self.dataset = dataset
        self.what = {Dataset: "dataset", Population: "population"}.get(type(dataset), "chain")
        self.loss = loss
        self.head, self.seq, self.previous_id = GENESIS, 0, 0
        # unless an entry records them (a population has no terms digest)
        self.recorded_terms = dataset.terms_sha256 if isinstance(dataset, Dataset) else ""
        self.limit_set: LedgerEntry | None = None  # a population's last limit change
        self.past_head: LedgerEntry | None = None  # the entry after the recorded head
        self.last: LedgerEntry | None = None  # the last entry taken in
        self.held: dict[str, LedgerEntry] = {}  # each hold's entry, by hold id
        self.approvals: set[str] = set()  # the hashes of its admin_change entries
        self.wrong_loss: Problem | None = None
        self.loss_recorded = False  # whether an earlier entry recorded its loss_after

    def step(self, entry: LedgerEntry, consumer: str | None) -> str | None:
        """Why ``entry`` does not follow the chain so far, or None (then it is taken in)."""
        if entry.seq != self.seq + 1:
            return f"expected seq {self.seq + 1}, found {entry.seq} (entry missing?)"
        if entry.id <= self.previous_id:  # listings are in id order: it must be seq order
            return (
                f"entry id {entry.id} is not after the previous entry's id "
                f"{self.previous_id} (ids swapped or rewritten)"
            )
        if entry.prev_hash != self.head:
            return "prev_hash does not match the previous entry's hash"
        if chain_hash(entry.prev_hash, canonical(entry, self.dataset.name, consumer)) != entry.hash:
            return "the entry's content does not match its hash (edited)"
        self.head, self.seq, self.previous_id = entry.hash, entry.seq, entry.id
        self.last = entry
        if entry.kind == "hold" and entry.hold_id is not None:
            self.held[entry.hold_id] = entry
        if entry.kind == "admin_change":
            self.approvals.add(entry.hash)
        if (entry.detail or {}).get("terms_sha256"):  # a limit change, or a charge
            self.recorded_terms = entry.detail["terms_sha256"]
        if entry.kind == "limit_change" and (entry.detail or {}).get("scope") == "population":
            self.limit_set = entry
        if entry.seq == self.dataset.ledger_seq + 1:
            self.past_head = entry
        if self.loss is not None and self.wrong_loss is None:
            self._check_loss(entry)
        return None

    def end_problem(self) -> Problem | None:
        """Why the chain does not end where its owner records its head, if it does not."""
        dataset = self.dataset
        if dataset.ledger_seq == self.seq and (dataset.ledger_head or GENESIS) == self.head:
            return None
        past = self.past_head
        if past is not None and past.prev_hash == (dataset.ledger_head or GENESIS):
            return Problem(
                dataset.name,
                f"the chain goes on past the head the {self.what} records (seq "
                f"{dataset.ledger_seq}): entries from seq {past.seq} to {self.seq} were "
                "appended in the database, not by the service, which moves the head with "
                "every entry (forged?)",
                past,
            )
        if dataset.ledger_seq == self.seq and self.last is not None:
            return Problem(
                dataset.name,
                f"the last entry (seq {self.seq}) does not hash to the head the {self.what} "
                "records: it, or entries before it, were rewritten in the database with "
                "their hashes recomputed (forged?)",
                self.last,
            )
        return Problem(
            dataset.name,
            f"the chain ends at seq {self.seq} but the {self.what} records "
            f"{dataset.ledger_seq} entries (entries deleted?)",
        )

    def _check_loss(self, entry: LedgerEntry) -> None:
        assert self.loss is not None
        if adds_to_totals(entry.kind, entry.status, entry.hold_id):
            self.loss.add(entry.cost, entry.multiplicity, entry.partitions, entry.release)
        elif gives_back(entry.kind, entry.status):
            self.loss.remove(entry.cost, entry.multiplicity, entry.partitions, entry.release)
        recorded = entry.loss_after
        if recorded is None:  # entries from before migration 0007 have none
            if self.loss_recorded:
                self.wrong_loss = Problem(
                    self.dataset.name,
                    "its loss_after is missing, though earlier entries of the chain record "
                    "theirs (removed in the database?)",
                    entry,
                )
            return
        self.loss_recorded = True
        expected = self.loss.loss
        if recorded != expected:
            names = self.loss.names
            self.wrong_loss = Problem(
                self.dataset.name,
                f"its loss_after ({_units(recorded, names)}) is not the dataset's lifetime loss "
                f"after it that the chain gives ({_units(expected, names)}): loss_after edited "
                "in the database, or the running totals edited before this entry ('accountant "
                "ledger rebuild-totals --check' compares them with the ledger)",
                entry,
            )


def _running_loss(dataset: Dataset) -> RunningLoss | None:
    """The dataset's lifetime loss, to be replayed from its chain; None if its accounting
    terms name no mode (edited: ``_terms_problem`` reports them)."""
    try:
        names = dataset.mode.components
    except (KeyError, ArithmeticError):
        return None
    return RunningLoss(LossRule(dataset.privacy_unit, dataset.max_partitions_per_user), names)


def _units(amount: Amount, names: tuple[ComponentName, ...]) -> str:
    """An amount as exact decimals, by component: 'epsilon 0.5'."""
    shown = [n for n in COMPONENTS if n in names or amount[n]]
    return ", ".join(f"{name} {COMPONENTS[name].to_decimal(amount[name])}" for name in shown)


def _terms_problem(dataset: Dataset, recorded: str) -> Problem | None:
    """Why ``dataset``'s limits are not the ones the service last set, if they are not."""
    if dataset.terms_sha256 != recorded:
        return Problem(
            dataset.name,
            "the dataset's limits are not the ones its last ledger entry recorded "
            "(edited in the database?)",
        )
    if terms.digest(dataset) != dataset.terms_sha256:
        return Problem(
            dataset.name,
            "the dataset's limits, bounds or windows do not match the digest the service "
            "recorded when it last set them (edited in the database?)",
        )
    return None


def _limit_problem(population: Population, last: LedgerEntry | None) -> Problem | None:
    """Why ``population``'s limit is not the one its last limit change (``last``) set, if it
    is not: both as that entry states it, exact decimal text in the population's mode. Every
    population's chain begins with the limit it was created with."""
    if last is None:
        return Problem(
            population.name,
            "the population's chain records no limit, though the service ledgers the limit a "
            "population is created with as its first entry (entries deleted?)",
        )
    try:
        limit = datasets.as_text(datasets.describe_limit(population.limit, population.mode))
    except (KeyError, ValueError, ArithmeticError):  # its accounting edited to no mode
        limit = None
    if limit != last.detail.get("new"):
        return Problem(
            population.name,
            f"the population's limit ({limit}) is not the one its last limit change set "
            f"({last.detail.get('new')}) (edited in the database?)",
        )
    return None


def head_problem(session: Session, hasher: KeyHasher) -> Problem | None:
    """The first dataset or population whose chain head is not one the service sealed
    (``seals.of_head``, with its owner's name), with the first entry appended after the last
    head it did seal when there is one; None if every head's seal holds. Run after
    ``verify`` has found each chain ending at its recorded head, with the database's secret
    in ``hasher``."""
    begun = session.execute(select(KeyHashSecret.heads_sealed_at)).scalar()
    rows = [
        (getattr(LedgerEntry, column), row)
        for owner, column in OWNERS
        for row in session.execute(
            select(
                owner.id, owner.name, owner.ledger_seq, owner.ledger_head, owner.head_seal
            ).order_by(owner.id)
        ).all()
    ]
    if begun is None:
        carried = sum(1 for _, row in rows if row.head_seal is not None)
        if carried:
            return Problem(None, seals.heads_cleared(carried))
        return Problem(rows[0][1].name, seals.HEADS_NEVER_SEALED) if rows else None
    for column, row in rows:
        if row.head_seal is None:
            return Problem(row.name, seals.HEAD_UNSEALED)
        head = row.ledger_head or GENESIS
        if hmac.compare_digest(
            row.head_seal, seals.of_head(hasher, row.name, row.ledger_seq, head)
        ):
            continue
        unsealed = _first_unsealed(session, hasher, column == row.id, row.name, row.head_seal)
        if unsealed is None:
            return Problem(row.name, seals.head_not_sealed(row.ledger_seq))
        return Problem(row.name, seals.appended_after(unsealed.seq, row.ledger_seq), unsealed)
    return None


def _first_unsealed(
    session: Session, hasher: KeyHasher, chain: ColumnElement[bool], name: str, seal: str
) -> LedgerEntry | None:
    """The entry right after the head that ``seal`` seals (the chain's first entry if it
    seals the empty chain), or None if no head of the chain is the one sealed. ``chain``
    selects the chain's entries, ``name`` is its owner's."""
    if hmac.compare_digest(seal, seals.of_head(hasher, name, 0, GENESIS)):
        return session.execute(select(LedgerEntry).where(chain, LedgerEntry.seq == 1)).scalar()
    sealed_seq = None
    for seq, head in session.execute(
        select(LedgerEntry.seq, LedgerEntry.hash).where(chain).order_by(LedgerEntry.seq)
    ).all():
        if hmac.compare_digest(seal, seals.of_head(hasher, name, seq, head)):
            sealed_seq = seq
            break
    if sealed_seq is None:
        return None
    return session.execute(
        select(LedgerEntry).where(chain, LedgerEntry.seq == sealed_seq + 1)
    ).scalar()
