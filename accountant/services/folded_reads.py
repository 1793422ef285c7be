"""A batch item's reads, known without reading: an earlier item's reads of the same dataset,
moved on by what the items since wrote.

A batch decides its items one after the other in one transaction, each on the totals the
items before it left (``services.batches``). Each item's reads would wait for the writes of
the one before: on PostgreSQL, a round trip per item. But every figure a grant writes is
computed in Python before it is written, so what the next item would read follows from
what was read before and what was written since:

- the dataset row: the chain's head and seal are the last entry's (``ledger.Entry``), and
  its population's loss is what the last item left it (``Decision.population_after``);
- each scope row: its T, T_J, T_P and largest s(p) are what the plan wrote
  (``charge_plan.figures_after``);
- the largest old s(p) among a set of charged partitions (``max_touched``), and each one's
  s(p) in the lifetime scope under a per-partition limit: an item that charged exactly
  that set added the same increment to each (``charge_plan.spend_increments``), so the
  largest grew by it; an item that charged a disjoint set left them as they were.

Whatever this cannot know exactly is read from the database again: a dataset with the
top-k rule (its reads are the k largest s(p), not folded here), every read of a dataset
after an item that created partitions or scope rows (only the database knows their ids),
a set of partitions that overlaps a written one without being it, ``"*"``, and any other
dataset of a population that an item charged (the population's loss is shared). With
``ACCOUNTANT_CHECK_FOLDED_READS=1`` (the test suite sets it), each folded read is also read
from the database and must equal it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from accountant.accounting.charge_inputs import ChargeReads, ChargeRequest, ScopeRow
from accountant.accounting.decide import Decision
from accountant.accounting.loss import ScopeKey
from accountant.exact import Amount
from accountant.services import ledger
from accountant.services.charge_plan import figures_after, spend_increments


def checking() -> bool:
    """Whether to read every folded read from the database too, and fail where they differ
    (the test suite's servers do: ``ACCOUNTANT_CHECK_FOLDED_READS=1``)."""
    return os.environ.get("ACCOUNTANT_CHECK_FOLDED_READS") == "1"


#: A dataset's name and a charged set of partitions.
Known = tuple[str, frozenset[str]]


@dataclass
class Folds:
    """The reads known for each dataset and set of partitions, as the items so far left
    them."""

    known: dict[Known, ChargeReads] = field(default_factory=dict)

    def reads(self, request: ChargeRequest) -> ChargeReads | None:
        """What ``request`` would read now, if it is known (None: read it)."""
        if request.partitions == "*":
            return None
        return self.known.get((request.dataset, frozenset(request.partitions)))

    def written(
        self, request: ChargeRequest, reads: ChargeReads, decision: Decision, entry: ledger.Entry
    ) -> None:
        """Move every known read on past ``decision``'s writes (``request`` decided on
        ``reads``, written as a grant, its ledger entry ``entry``)."""
        charged = None if request.partitions == "*" else frozenset(decision.partitions)
        known = dict(self.known)
        if charged is not None:
            known[request.dataset, charged] = reads
        population = decision.dataset.population
        self.known = {}
        for (name, keys), read in known.items():
            if name == request.dataset:
                after = advance(read, keys, decision, entry, charged)
            elif population is not None and _member(read, population.id):
                after = None
            else:
                after = read
            if after is not None:
                self.known[name, keys] = after


def check(folded: ChargeReads, read: ChargeReads) -> None:
    """Fail unless a folded read equals the database's (``checking``)."""
    if folded != read:
        raise AssertionError(f"a folded read differs from the database's:\n{folded}\n{read}")


def advance(
    read: ChargeReads,
    keys: frozenset[str],
    decision: Decision,
    entry: ledger.Entry,
    charged: frozenset[str] | None,
) -> ChargeReads | None:
    """``read`` (of partitions ``keys`` on ``decision``'s dataset) after ``decision``'s writes
    as a grant on the partitions ``charged`` (None: ``"*"``); None where it cannot be known
    without reading (see the module's notes)."""
    if charged is None or decision.dataset.rule.uses_top_k:
        return None
    if any(key not in decision.partition_ids for key in decision.partitions):
        return None  # partitions created: their ids are the database's
    if any(scope.id is None for scope in decision.scopes):
        return None  # scope rows created (and ended windows dropped)
    if keys == charged:
        grown = spend_increments(decision)["every"]
    elif keys.isdisjoint(charged):
        grown = None
    else:
        return None
    states = {scope.key: scope.state for scope in decision.scopes}
    if set(read.scopes) - set(states):
        return None
    scopes: dict[ScopeKey, ScopeRow] = {}
    for key, row in read.scopes.items():
        figures = figures_after(decision, states[key])
        scopes[key] = replace(
            row,
            total=figures["t"],
            joint_total=figures["tj"],
            parallel_total=figures["tp"],
            max_spend=figures["m"],
            max_touched=row.max_touched if grown is None else row.max_touched.plus(grown),
        )
    spends = dict(read.spends)
    if grown is not None and read.dataset.partition_limit is not None:
        for partition in keys:
            spends[partition] = spends.get(partition, Amount()).plus(grown)
    dataset = read.dataset
    population = dataset.population
    if population is not None and decision.population_after is not None:
        population = replace(population, loss=decision.population_after)
    dataset = replace(
        dataset,
        ledger_seq=entry.head.seq,
        ledger_head=entry.head.hash,
        head_seal=entry.seal,
        population=population,
    )
    return replace(read, dataset=dataset, scopes=scopes, spends=spends)


def _member(read: ChargeReads, population_id: int) -> bool:
    population = read.dataset.population
    return population is not None and population.id == population_id
