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
- Unit ``user`` with at most k partitions per person:
  L = min(T, sum of the k largest s(p)); with unbounded k, L = T, because
  then T <= sum over all p of s(p). Each bound alone is sound; the min keeps
  the tighter one.

Spends only grow (nothing is refunded), so after a charge on the partition
set P the k largest spends are found among the old k largest outside P and
the old k largest inside P plus c: that is all the accountant reads, a
bounded number of rows whatever the history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def multiplicity(self, release: str, partition_count: int) -> int:
        """m of DESIGN.md: 1 for a joint release, min(k, |P|) for a parallel one."""
        if release == "joint":
            return 1
        k = self.max_partitions_per_user
        if self.privacy_unit == "user" and k is not None:
            return min(k, partition_count)
        return partition_count


@dataclass(frozen=True)
class ScopeState:
    """One scope as read inside the charge transaction, before the charge.

    ``max_touched`` is the largest old s(p) over the charged partitions (zero
    for a partition never charged). For the top-k rule, ``top_outside`` holds
    the k largest old s(p) outside P and ``top_inside`` the k largest old s(p)
    inside P, padded with zeros to min(k, |P|); both per component.
    """

    total: Amount = Amount()
    max_all: Amount = Amount()
    max_touched: Amount = Amount()
    top_outside: dict[ComponentName, list[int]] = field(default_factory=dict)
    top_inside: dict[ComponentName, list[int]] = field(default_factory=dict)
    top_all: dict[ComponentName, list[int]] = field(default_factory=dict)


def loss_now(rule: LossRule, state: ScopeState, names: tuple[ComponentName, ...]) -> Amount:
    """The loss of a scope as it stands (``top_all`` holds the k largest s(p))."""
    values = {}
    for name in names:
        if rule.privacy_unit != "user":
            values[name] = state.max_all[name]
        elif rule.uses_top_k:
            values[name] = min(state.total[name], sum(state.top_all.get(name, [])))
        else:
            values[name] = state.total[name]
    return Amount(**values)


def loss_after(
    rule: LossRule, state: ScopeState, cost: Amount, m: int, names: tuple[ComponentName, ...]
) -> Amount:
    """The loss of a scope if a charge of per-release ``cost`` and multiplicity ``m`` is added."""
    values = {}
    for name in names:
        c = cost[name]
        total = min(state.total[name] + c * m, SATURATION)
        if rule.privacy_unit != "user":
            values[name] = max(state.max_all[name], state.max_touched[name] + c)
        elif rule.uses_top_k:
            assert rule.max_partitions_per_user is not None
            candidates = state.top_outside.get(name, []) + [
                v + c for v in state.top_inside.get(name, [])
            ]
            top = sorted(candidates, reverse=True)[: rule.max_partitions_per_user]
            values[name] = min(total, sum(top))
        else:
            values[name] = total
    return Amount(**values)


def charged(cost: Amount, m: int) -> Amount:
    """What a charge adds to a scope's running total T: its per-release cost times m."""
    return cost.scaled(m)


def total_after(state: ScopeState, cost: Amount, m: int) -> Amount:
    """T after a charge of per-release ``cost`` and multiplicity ``m``."""
    return state.total.plus(charged(cost, m))


def max_after(state: ScopeState, cost: Amount) -> Amount:
    """The largest s(p) after the charge, over all partitions of the scope."""
    return Amount(
        max(state.max_all.epsilon, state.max_touched.epsilon + cost.epsilon),
        max(state.max_all.delta, state.max_touched.delta + cost.delta),
        max(state.max_all.rho, state.max_touched.rho + cost.rho),
    )


@dataclass
class ScopeBooks:
    """A scope's complete books, T and every s(p), rebuilt charge by charge from the ledger
    (``ledger rebuild-totals``, a window budget added mid-window). The charge path keeps the
    same numbers incrementally from a bounded read (``total_after``, ``max_after``)."""

    total: Amount = Amount()
    spends: dict[str, Amount] = field(default_factory=dict)

    def add(self, cost: Amount, m: int, partitions: list[str]) -> None:
        """Record one granted charge of per-release ``cost`` and multiplicity ``m``."""
        self.total = self.total.plus(charged(cost, m))
        for key in partitions:
            self.spends[key] = self.spends.get(key, Amount()).plus(cost)

    @property
    def max_spend(self) -> Amount:
        """The largest s(p) per component (each may come from another partition)."""
        return Amount(
            *(max((a[name] for a in self.spends.values()), default=0) for name in COMPONENTS)
        )

    def state(self, k: int | None) -> ScopeState:
        """The scope as ``loss_now`` reads it, with the k largest s(p) when k is given."""
        top: dict[ComponentName, list[int]] = {}
        if k is not None:
            for name in COMPONENTS:
                top[name] = sorted((a[name] for a in self.spends.values()), reverse=True)[:k]
        return ScopeState(total=self.total, max_all=self.max_spend, top_all=top)


@dataclass
class RunningLoss:
    """A scope's loss as ``loss_now`` states it, kept charge by charge from the ledger
    (``ledger verify`` recomputes each entry's ``loss_after`` with it): the same number as
    ``loss_now(rule, books.state(k), names)``, without sorting every s(p) after each charge.

    Spends only grow, so the k largest s(p) of a component (k = 1 for the largest, units
    ``record`` and ``partition``) change only where a charge raised one: a partition already
    among them stays, and another enters in place of the smallest one if it now exceeds it.
    Taken one charged partition at a time, each step is one such rise."""

    rule: LossRule
    names: tuple[ComponentName, ...]
    books: ScopeBooks = field(default_factory=ScopeBooks)
    top: dict[ComponentName, dict[str, int]] = field(default_factory=dict)

    def add(self, cost: Amount, m: int, partitions: list[str]) -> None:
        """Record one granted charge of per-release ``cost`` and multiplicity ``m``."""
        self.books.add(cost, m, partitions)
        k = 1 if self.rule.privacy_unit != "user" else self.rule.max_partitions_per_user
        if k is None:  # user, unbounded: L = T, no s(p) needed
            return
        for name in self.names:
            top = self.top.setdefault(name, {})
            for key in partitions:
                value = self.books.spends[key][name]
                if key in top or len(top) < k:
                    top[key] = value
                    continue
                smallest = min(top, key=top.__getitem__)
                if value > top[smallest]:
                    del top[smallest]
                    top[key] = value

    @property
    def loss(self) -> Amount:
        """The scope's loss now, by the rule of ``loss_now``."""
        values = {}
        for name in self.names:
            top = self.top.get(name, {}).values()
            if self.rule.privacy_unit != "user":
                values[name] = max(top, default=0)
            elif self.rule.uses_top_k:
                values[name] = min(self.books.total[name], sum(top))
            else:
                values[name] = self.books.total[name]
        return Amount(**values)
