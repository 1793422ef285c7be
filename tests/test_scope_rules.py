"""The scope rules of ``accounting.loss`` on their own: what the charge path computes from
its bounded read equals what the complete books say after every charge, and the user loss
is never below the exact worst person (brute force over small workloads)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from accountant.accounting.loss import (
    PARTS,
    LossRule,
    ScopeBooks,
    ScopeState,
    Top,
    loss_after,
    loss_now,
    max_after,
    total_after,
)
from accountant.exact import Amount, ComponentName

NAMES: tuple[ComponentName, ...] = ("epsilon", "delta", "rho")
KEYS = [f"p{i}" for i in range(6)]

charges = st.lists(
    st.tuples(
        st.lists(st.sampled_from(KEYS), min_size=1, max_size=6, unique=True),
        st.builds(Amount, st.integers(0, 10**6), st.integers(0, 10**3), st.integers(0, 10**6)),
        st.sampled_from(["joint", "parallel"]),
    ),
    max_size=25,
)


def bounded_read(books: ScopeBooks, keys: list[str], k: int | None) -> ScopeState:
    """What the charge transaction reads of a scope before a charge on ``keys``: T, T_J, T_P,
    the largest s(p), the largest among ``keys`` and, for top-k, each part's k largest
    inside and outside ``keys`` (inside padded with zeros to min(k, |P|))."""
    touched = Amount(
        *(max((books.spends[p][n] for p in keys if p in books.spends), default=0) for n in NAMES)
    )
    top = {}
    if k is not None:
        for part, part_books in books.parts.items():
            for n in NAMES:
                spends = part_books.spends
                inside = sorted((spends[p][n] for p in keys if p in spends), reverse=True)
                outside = sorted((a[n] for p, a in spends.items() if p not in keys), reverse=True)
                padded = (inside[:k] + [0] * k)[: min(k, len(keys))]
                top[part, n] = Top(tuple(outside[:k]), tuple(padded))
    return ScopeState(
        books.total,
        books.max_spend,
        touched,
        books.parts["joint"].total,
        books.parts["parallel"].total,
        top,
    )


@settings(max_examples=300, deadline=None)
@given(
    history=charges,
    unit=st.sampled_from(["record", "partition", "user"]),
    k=st.one_of(st.none(), st.integers(1, 4)),
)
def test_the_charge_paths_figures_equal_the_books(
    history: list[tuple[list[str], Amount, str]], unit: str, k: int | None
) -> None:
    rule = LossRule(unit, k if unit == "user" else None)
    books = ScopeBooks()
    for keys, cost, release in history:
        m = rule.multiplicity(release, len(keys))
        state = bounded_read(books, keys, rule.max_partitions_per_user)
        totals = {part: total_after(state, cost, m, part, release) for part in PARTS}
        highest = max_after(state, cost)
        after = loss_after(rule, state, cost, m, release, NAMES)
        books.add(cost, m, keys, release)
        assert totals == {part: part_books.total for part, part_books in books.parts.items()}
        assert highest == books.max_spend
        assert after == loss_now(rule, books.state(rule.max_partitions_per_user), NAMES)


def worst_person(history: list[tuple[list[str], Amount, str]], k: int) -> Amount:
    """The exact loss of the worst-placed person, by brute force over every set S of at most
    k partitions (DESIGN.md's sensitivity rule): a joint release costs such a person c once
    if it touches S, a parallel one c for each partition of S it covers."""
    partitions = sorted({p for keys, _, _ in history for p in keys})
    worst = Amount()
    for placed in itertools.combinations(partitions, min(k, len(partitions))):
        loss = Amount()
        for keys, cost, release in history:
            covered = len(set(keys) & set(placed))
            loss = loss.plus(cost.scaled(min(covered, 1) if release == "joint" else covered))
        worst = Amount(*(max(worst[n], loss[n]) for n in NAMES))
    return worst


@settings(max_examples=500, deadline=None)
@given(history=charges, k=st.integers(1, 4))
def test_the_user_loss_is_never_below_the_worst_person(
    history: list[tuple[list[str], Amount, str]], k: int
) -> None:
    """Every term of the top-k rule is sound: after each charge the loss is at least the
    exact worst person's, and never above the single term min(T, top-k s(p))."""
    rule = LossRule("user", k)
    books = ScopeBooks()
    for done, (keys, cost, release) in enumerate(history, start=1):
        books.add(cost, rule.multiplicity(release, len(keys)), keys, release)
        loss = loss_now(rule, books.state(k), NAMES)
        exact = worst_person(history[:done], k)
        every = books.parts["every"]
        for n in NAMES:
            assert exact[n] <= loss[n] <= min(every.total[n], sum(every.top(n, k).outside))


def test_books_add_cost_times_multiplicity_to_the_total_and_cost_to_each_partition() -> None:
    books = ScopeBooks()
    books.add(Amount(epsilon=3), 2, ["a", "b"], "parallel")
    books.add(Amount(epsilon=5), 1, ["b"], "joint")
    assert books.total == Amount(epsilon=11)
    assert books.spends == {"a": Amount(epsilon=3), "b": Amount(epsilon=8)}
    assert books.max_spend == Amount(epsilon=8)
    assert books.parts["joint"].total == Amount(epsilon=5)
    assert books.parts["parallel"].total == Amount(epsilon=6)
    assert books.parts["joint"].spends == {"b": Amount(epsilon=5)}
    assert books.parts["parallel"].spends == {"a": Amount(epsilon=3), "b": Amount(epsilon=3)}
