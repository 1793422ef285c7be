"""The privacy loss of a scope, before and after a charge (DESIGN.md, normative).

For one scope (the dataset's lifetime, one window, one consumer) and one
component (epsilon, delta or rho), write s(p) for the spend of partition p
(the sum of the per-release cost c over the charges that touched p) and T for
the running total, the sum over charges of c * m with m = 1 for a joint
release and m = min(k, |P|) for a parallel one.

- Units ``record`` and ``partition``: L = max_p s(p). A row, or a partition,
  sits in one partition, so releases on disjoint partitions compose in
  parallel (McSherry 2009, Theorem 4) and releases on the same partition
  compose sequentially (Dwork and Roth 2014, Theorem 3.16).
- Unit ``user`` with at most k partitions per person: L is the smallest of
  min(T, sum of the k largest s(p)) and
  min(T_J, sum of the k largest s_J(p)) + min(T_P, sum of the k largest s_P(p)),
  where T_J and s_J count the joint releases only and T_P and s_P the parallel
  ones (docs/accounting.md proves each term sound); with unbounded k, L = T,
  because then T <= sum over all p of s(p).

Spends only grow (nothing is refunded), so after a charge on the partition
set P the k largest spends of each part are found among its old k largest
outside P and its old k largest inside P plus c: that is all the accountant
reads, a bounded number of rows whatever the history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from accountant.exact import COMPONENTS, SATURATION, Amount, ComponentName

#: A scope row: (kind, consumer_id, period_seconds, window_start), as the tallies table keys it.
ScopeKey = tuple[str, int, int, int]


@dataclass(frozen=True)
class LossRule:
    """How a dataset's scopes compose: its privacy unit and its k (``None``: unbounded)."""

    privacy_unit: str
    max_partitions_per_user: int | None

    @property
    def uses_top_k(self) -> bool:
        return self.privacy_unit == "user" and self.max_partitions_per_user is not None

    @property
    def parts(self) -> tuple[Part, ...]:
        """The parts whose T and s(p) a scope keeps: all three for the top-k rule, which
        reads them, and only ``"every"`` otherwise (the others stay 0, unread)."""
        return PARTS if self.uses_top_k else ("every",)

    def multiplicity(self, release: str, partition_count: int) -> int:
        """m of DESIGN.md: 1 for a joint release, min(k, |P|) for a parallel one."""
        if release == "joint":
            return 1
        k = self.max_partitions_per_user
        if self.privacy_unit == "user" and k is not None:
            return min(k, partition_count)
        return partition_count


#: The parts of a scope's charges that the top-k rule bounds: every charge, the joint
#: releases, the parallel releases.
Part = Literal["every", "joint", "parallel"]
PARTS: tuple[Part, ...] = ("every", "joint", "parallel")


def holds(part: Part, release: str | None) -> bool:
    """Whether a charge of this release kind belongs to ``part``: every charge is in
    ``"every"``, a joint release in ``"joint"`` and any other in ``"parallel"`` (the bound
    is sound for any division of the charges into the two: docs/accounting.md)."""
    return part in ("every", "joint" if release == "joint" else "parallel")


@dataclass(frozen=True)
class Top:
    """The k largest old s(p) of one part of a scope's charges, in one component: outside the
    charged set P, and inside it (padded with zeros to min(k, |P|), as each partition never
    charged in this part has s(p) = 0)."""

    outside: tuple[int, ...] = ()
    inside: tuple[int, ...] = ()

    def sum_after(self, c: int, k: int) -> int:
        """The sum of the k largest s(p) once ``c`` is added to each s(p) inside P."""
        return sum(sorted([*self.outside, *(v + c for v in self.inside)], reverse=True)[:k])


@dataclass(frozen=True, kw_only=True)
class ScopeState:
    """One scope as read inside the charge transaction, before the charge.

    Args:
        total: T, every charge's c * m.
        max_all: the largest s(p) over every partition, per component.
        max_touched: the largest old s(p) over the charged partitions (zero for a
            partition never charged).
        joint_total: T_J, the joint charges' c * m (the top-k rule).
        parallel_total: T_P, the parallel charges' c * m (the top-k rule).
        top: a ``Top`` per part and component (the top-k rule; a missing one: no
            partition spent anything in it).
    """

    total: Amount = Amount()
    max_all: Amount = Amount()
    max_touched: Amount = Amount()
    joint_total: Amount = Amount()
    parallel_total: Amount = Amount()
    top: Mapping[tuple[Part, ComponentName], Top] = field(default_factory=dict)

    def part_total(self, part: Part) -> Amount:
        """T of one part: every charge's c * m, or the joint or the parallel ones'."""
        return {"every": self.total, "joint": self.joint_total, "parallel": self.parallel_total}[
            part
        ]


def fresh(rule: LossRule, partition_count: int) -> ScopeState:
    """A scope no charge has touched yet, as a charge on ``partition_count`` partitions reads
    it: every figure zero and, for the top-k rule, each part's ``Top.inside`` padded with
    zeros to min(k, |P|). The charge path reads a new scope so, and ``checks.never_fits``
    asks whether a charge fits in one."""
    k = rule.max_partitions_per_user
    if not rule.uses_top_k or k is None:
        return ScopeState()
    zeros = Top(inside=(0,) * min(k, partition_count))
    return ScopeState(top={(part, name): zeros for part in PARTS for name in COMPONENTS})


def loss_now(rule: LossRule, state: ScopeState, names: tuple[ComponentName, ...]) -> Amount:
    """The loss of a scope as it stands (its ``Top`` lists hold each part's k largest s(p))."""
    return loss_after(rule, state, Amount(), 0, "joint", names)


def loss_after(
    rule: LossRule,
    state: ScopeState,
    cost: Amount,
    m: int,
    release: str,
    names: tuple[ComponentName, ...],
) -> Amount:
    """The loss of a scope if a charge of per-release ``cost``, multiplicity ``m`` and kind
    ``release`` is added."""
    values = {}
    for name in names:
        c = cost[name]
        total = min(state.total[name] + c * m, SATURATION)
        if rule.privacy_unit != "user":
            values[name] = max(state.max_all[name], state.max_touched[name] + c)
        elif rule.uses_top_k:
            assert rule.max_partitions_per_user is not None
            bounds = {
                part: _bound(state, part, name, c, m, release, rule.max_partitions_per_user)
                for part in PARTS
            }
            values[name] = min(bounds["every"], bounds["joint"] + bounds["parallel"])
        else:
            values[name] = total
    return Amount(**values)


def _bound(
    state: ScopeState, part: Part, name: ComponentName, c: int, m: int, release: str, k: int
) -> int:
    """min(T, sum of the k largest s(p)) of ``part`` after a charge of per-release cost ``c``,
    multiplicity ``m`` and kind ``release`` (which adds nothing to a part it is not in)."""
    added = c if holds(part, release) else 0
    total = min(state.part_total(part)[name] + added * m, SATURATION)
    return min(total, state.top.get((part, name), Top()).sum_after(added, k))


def charged(cost: Amount, m: int) -> Amount:
    """What a charge adds to a scope's running total T: its per-release cost times m."""
    return cost.scaled(m)


def total_after(state: ScopeState, cost: Amount, m: int, part: Part, release: str) -> Amount:
    """T of ``part`` after a charge of per-release ``cost``, multiplicity ``m`` and kind
    ``release``."""
    old = state.part_total(part)
    return old.plus(charged(cost, m)) if holds(part, release) else old


def max_after(state: ScopeState, cost: Amount) -> Amount:
    """The largest s(p) after the charge, over all partitions of the scope."""
    return Amount(
        max(state.max_all.epsilon, state.max_touched.epsilon + cost.epsilon),
        max(state.max_all.delta, state.max_touched.delta + cost.delta),
        max(state.max_all.rho, state.max_touched.rho + cost.rho),
    )


@dataclass
class Books:
    """T and every s(p) of one part of a scope's charges."""

    total: Amount = Amount()
    spends: dict[str, Amount] = field(default_factory=dict)

    def top(self, name: ComponentName, k: int) -> Top:
        """The k largest s(p) in component ``name``, none of them charged (all outside P)."""
        return Top(tuple(sorted((a[name] for a in self.spends.values()), reverse=True)[:k]))


@dataclass
class ScopeBooks:
    """A scope's complete books, T and every s(p) of each part, rebuilt charge by charge from
    the ledger (``ledger rebuild-totals``, a window budget added mid-window). The charge path
    keeps the same numbers incrementally from a bounded read (``total_after``,
    ``max_after``)."""

    parts: dict[Part, Books] = field(default_factory=lambda: {part: Books() for part in PARTS})

    @property
    def total(self) -> Amount:
        return self.parts["every"].total

    @property
    def spends(self) -> dict[str, Amount]:
        """s(p) over every charge."""
        return self.parts["every"].spends

    def add(self, cost: Amount, m: int, partitions: list[str], release: str | None) -> None:
        """Record one granted charge of per-release ``cost``, multiplicity ``m`` and kind
        ``release``."""
        for part, books in self.parts.items():
            if holds(part, release):
                books.total = books.total.plus(charged(cost, m))
                for key in partitions:
                    books.spends[key] = books.spends.get(key, Amount()).plus(cost)

    def remove(
        self,
        cost: Amount,
        m: int,
        partitions: list[str],
        release: str | None,
        kept: tuple[Part, ...] = PARTS,
    ) -> None:
        """Take back per-release ``cost`` of a hold of multiplicity ``m`` and kind
        ``release`` that a settle returns: exactly what ``add`` added for that part of it, in
        the ``kept`` parts (books read from a dataset's rows hold only its rule's parts)."""
        for part, books in self.parts.items():
            if part in kept and holds(part, release):
                books.total = books.total.minus(charged(cost, m))
                for key in partitions:
                    books.spends[key] = books.spends[key].minus(cost)

    @property
    def max_spend(self) -> Amount:
        """The largest s(p) per component (each may come from another partition)."""
        return Amount(
            *(max((a[name] for a in self.spends.values()), default=0) for name in COMPONENTS)
        )

    def state(self, k: int | None) -> ScopeState:
        """The scope as ``loss_now`` reads it, with each part's k largest s(p) when k is
        given."""
        top = {}
        if k is not None:
            top = {
                (part, name): books.top(name, k)
                for part, books in self.parts.items()
                for name in COMPONENTS
            }
        return ScopeState(
            total=self.total,
            max_all=self.max_spend,
            joint_total=self.parts["joint"].total,
            parallel_total=self.parts["parallel"].total,
            top=top,
        )


@dataclass
class RunningLoss:
    """A scope's loss as ``loss_now`` states it, kept charge by charge from the ledger
    (``ledger verify`` recomputes each entry's ``loss_after`` with it): the same number as
    ``loss_now(rule, books.state(k), names)``, without sorting every s(p) after each charge.

    Spends only grow, so the k largest s(p) of a part and component (k = 1 for the largest,
    units ``record`` and ``partition``) change only where a charge raised one: a partition
    already among them stays, and another enters in place of the smallest one if it now
    exceeds it. Taken one charged partition at a time, each step is one such rise."""

    rule: LossRule
    names: tuple[ComponentName, ...]
    books: ScopeBooks = field(default_factory=ScopeBooks)
    top: dict[tuple[Part, ComponentName], dict[str, int]] = field(default_factory=dict)

    def add(self, cost: Amount, m: int, partitions: list[str], release: str | None) -> None:
        """Record one granted charge of per-release ``cost``, multiplicity ``m`` and kind
        ``release``."""
        self.books.add(cost, m, partitions, release)
        k = 1 if self.rule.privacy_unit != "user" else self.rule.max_partitions_per_user
        if k is None:  # user, unbounded: L = T, no s(p) needed
            return
        for part in self.rule.parts:
            if not holds(part, release):
                continue
            spends = self.books.parts[part].spends
            for name in self.names:
                top = self.top.setdefault((part, name), {})
                for key in partitions:
                    value = spends[key][name]
                    if key in top or len(top) < k:
                        top[key] = value
                        continue
                    smallest = min(top, key=top.__getitem__)
                    if value > top[smallest]:
                        del top[smallest]
                        top[key] = value

    def remove(self, cost: Amount, m: int, partitions: list[str], release: str | None) -> None:
        """Record a settle that returns per-release ``cost`` of a hold of multiplicity ``m``
        and kind ``release``. Spends fall, so each k largest s(p) is found again from every
        s(p) (settles are rare; charges keep the incremental ``add``)."""
        self.books.remove(cost, m, partitions, release)
        k = 1 if self.rule.privacy_unit != "user" else self.rule.max_partitions_per_user
        if k is None:
            return
        for part in self.rule.parts:
            spends = self.books.parts[part].spends
            for name in self.names:
                largest = sorted(spends, key=lambda key: spends[key][name], reverse=True)[:k]
                self.top[part, name] = {key: spends[key][name] for key in largest}

    @property
    def loss(self) -> Amount:
        """The scope's loss now, by ``loss_now`` itself."""
        largest = {
            name: max(self.top.get(("every", name), {}).values(), default=0) for name in COMPONENTS
        }
        state = ScopeState(
            total=self.books.total,
            max_all=Amount(**largest),
            joint_total=self.books.parts["joint"].total,
            parallel_total=self.books.parts["parallel"].total,
            top={
                key: Top(tuple(sorted(values.values(), reverse=True)))
                for key, values in self.top.items()
            },
        )
        return loss_now(self.rule, state, self.names)
