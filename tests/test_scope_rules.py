"""The scope rules of ``accounting.loss`` on their own: what the charge path computes from
its bounded read equals what the complete books say after every charge."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accountant.accounting.loss import (
    LossRule,
    ScopeBooks,
    ScopeState,
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
    """What the charge transaction reads of a scope before a charge on ``keys``: T, the
    largest s(p), the largest among ``keys`` and, for top-k, the k largest inside and
    outside ``keys`` (inside padded with zeros to min(k, |P|))."""
    inside = {
        n: sorted((books.spends[p][n] for p in keys if p in books.spends), reverse=True)
        for n in NAMES
    }
    outside = {
        n: sorted((a[n] for p, a in books.spends.items() if p not in keys), reverse=True)
        for n in NAMES
    }
    touched = Amount(
        *(max((books.spends[p][n] for p in keys if p in books.spends), default=0) for n in NAMES)
    )
    if k is None:
        return ScopeState(books.total, books.max_spend, touched)
    return ScopeState(
        books.total,
        books.max_spend,
        touched,
        {n: v[:k] for n, v in outside.items()},
        {n: (v[:k] + [0] * k)[: min(k, len(keys))] for n, v in inside.items()},
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
        after = (
            total_after(state, cost, m),
            max_after(state, cost),
            loss_after(rule, state, cost, m, NAMES),
        )
        books.add(cost, m, keys)
        assert after[0] == books.total
        assert after[1] == books.max_spend
        assert after[2] == loss_now(rule, books.state(rule.max_partitions_per_user), NAMES)


def test_books_add_cost_times_multiplicity_to_the_total_and_cost_to_each_partition() -> None:
    books = ScopeBooks()
    books.add(Amount(epsilon=3), 2, ["a", "b"])
    books.add(Amount(epsilon=5), 1, ["b"])
    assert books.total == Amount(epsilon=11)
    assert books.spends == {"a": Amount(epsilon=3), "b": Amount(epsilon=8)}
    assert books.max_spend == Amount(epsilon=8)
