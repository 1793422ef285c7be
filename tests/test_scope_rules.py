"""The scope rules of ``accounting.loss`` on their own: what the charge path computes from
its bounded read equals what the complete books say after every charge, and the user loss
is never below the exact worst person (brute force over small workloads)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accountant.accounting.charge_inputs import (
    ChargeReads,
    ChargeRequest,
    Column,
    DatasetState,
    ScopeRow,
    WindowLimit,
)
from accountant.accounting.decide import decide
from accountant.accounting.loss import (
    PARTS,
    LossRule,
    ScopeBooks,
    ScopeKey,
    ScopeState,
    Top,
    loss_after,
    loss_now,
    max_after,
    total_after,
)
from accountant.errors import Forbidden, InvalidRequest
from accountant.exact import Amount, ComponentName, Limit
from accountant.mechanism import Cost, Mechanism
from tests.test_properties import PARTITIONS, reference_loss

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
        total=books.total,
        max_all=books.max_spend,
        max_touched=touched,
        joint_total=books.parts["joint"].total,
        parallel_total=books.parts["parallel"].total,
        top=top,
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


# ``decide``, the whole decision, against a reference written from DESIGN.md's rules over
# the complete history (tests/test_properties.py's ``reference_loss``): the reads below are
# what the charge's statements return of that history, old partitions and new alike.

UNITS = Fraction(1, 10**9)  # one epsilon unit
NOW_US = 1_772_447_400 * 1_000_000
HOUR = 3600
ORDER = ("dataset", "partition", "consumer", "window")

#: (cost in units, partitions, release, in the current window, charged by the caller)
Past = tuple[int, list[str], str, bool, bool]


def _mechanism() -> Mechanism:
    return Mechanism(
        name="units",
        description="costs its parameter, in epsilon units",
        params_schema={},
        input_schema={},
        accounting=("pure",),
        cost=lambda params, context: Cost(epsilon=params["units"] * UNITS),
        run=lambda params, data, source: {},
    )


@dataclass(frozen=True)
class _Caller:
    consumer_id: int = 7
    name: str = "svc"
    key_id: str = "k"


def _row(
    history: list[Past], keys: list[str], existing: dict[str, int], k: int | None, split: bool
) -> ScopeRow:
    """A scope row as the charge's statements read it after ``history`` (one scope's
    charges), before a charge on ``keys``; ``split``: the read tells the charged
    partitions that exist apart from the others."""
    parts: dict[str, dict[str, int]] = {"every": {}, "joint": {}, "parallel": {}}
    totals = dict.fromkeys(parts, 0)
    for cost, partitions, release, _, _ in history:
        m = _m(release, partitions, k)
        for part in ("every", release):
            totals[part] += cost * m
            for p in partitions:
                parts[part][p] = parts[part].get(p, 0) + cost
    every = parts["every"]
    touched = [p for p in keys if p in existing]
    inside: dict[Column, tuple[int, ...]] = {}
    outside: dict[Column, tuple[int, ...]] = {}
    if k is not None:
        for part, spends in parts.items():
            column: Column = (part, "epsilon")  # type: ignore[assignment]  # a part's name
            # a spend row holds every part of a partition charged in this scope
            inside[column] = tuple(spends.get(p, 0) for p in touched if p in every) if split else ()
            others = [v for p, v in spends.items() if v > 0 and not (split and p in touched)]
            outside[column] = tuple(sorted(others, reverse=True)[:k])
    return ScopeRow(
        id=1,
        total=Amount(totals["every"]),
        max_spend=Amount(max(every.values(), default=0)),
        max_touched=Amount(max((every.get(p, 0) for p in touched), default=0)),
        joint_total=Amount(totals["joint"]),
        parallel_total=Amount(totals["parallel"]),
        inside=inside,
        outside=outside,
    )


def _m(release: str, partitions: list[str], k: int | None) -> int:
    return 1 if release == "joint" else min(k or len(partitions), len(partitions))


def _reference(
    history: list[Past], charge: tuple[int, list[str], str], unit: str, k: int | None
) -> Fraction:
    """The loss of one scope whose charges are ``history`` and then ``charge``."""
    charges = [(Fraction(c), ps, r) for c, ps, r, _, _ in history]
    cost, partitions, release = charge
    return reference_loss([*charges, (Fraction(cost), partitions, release)], unit, k)


@settings(max_examples=1500, deadline=None)
@given(
    unit=st.sampled_from(["record", "partition", "user"]),
    k=st.one_of(st.none(), st.integers(1, 3)),
    declared=st.lists(st.sampled_from(PARTITIONS), unique=True),
    history=st.lists(
        st.tuples(
            st.integers(1, 6),
            st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=4, unique=True),
            st.sampled_from(["joint", "parallel"]),
            st.booleans(),
            st.booleans(),
        ),
        max_size=8,
    ),
    charge=st.tuples(
        st.integers(1, 6),
        st.one_of(
            st.just("*"), st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=4, unique=True)
        ),
        st.sampled_from(["joint", "parallel"]),
    ),
    limits=st.tuples(
        st.integers(0, 30),
        st.one_of(st.none(), st.integers(0, 20)),
        st.one_of(st.none(), st.integers(0, 20)),
        st.one_of(st.none(), st.integers(0, 20)),
    ),
    caller=st.sampled_from(
        [("admin", False), ("service", True), ("service", False), ("auditor", True)]
    ),
)
def test_decide_matches_the_reference(
    unit: str,
    k: int | None,
    declared: list[str],
    history: list[Past],
    charge: tuple[int, list[str] | str, str],
    limits: tuple[int, int | None, int | None, int | None],
    caller: tuple[str, bool],
) -> None:
    """Grants, denials (in contract order), the loss before and after, ``never_fits`` and
    the grant check, on partitions declared or charged before and on new ones."""
    k = k if unit == "user" else None
    lifetime, per_partition, quota, window = limits
    role, granted = caller
    existing = {
        p: i for i, p in enumerate(dict.fromkeys([*declared, *(p for h in history for p in h[1])]))
    }
    cost, asked, release = charge
    keys = list(existing) if isinstance(asked, str) else asked
    split = asked != "*" and any(p in existing for p in keys)
    scopes: dict[ScopeKey, ScopeRow] = {}
    window_start = NOW_US // 1_000_000 // HOUR * HOUR
    sub_histories: dict[str, tuple[ScopeKey, list[Past]]] = {
        "dataset": (("lifetime", 0, 0, 0), history),
        "consumer": (("consumer", 7, 0, 0), [h for h in history if h[4]]),
        "window": (("window", 0, HOUR, window_start), [h for h in history if h[3]]),
    }
    for key, past in sub_histories.values():
        if past:  # a scope's row exists once a charge touched it
            scopes[key] = _row(past, keys, existing, k, split)
    lifetime_spends = {
        p: Amount(sum(c for c, ps, *_ in history if p in ps))
        for p in keys
        if any(p in h[1] for h in history)
    }
    dataset = DatasetState(
        id=1,
        name="clicks",
        privacy_unit=unit,
        accounting="pure",
        rdp_order=None,
        composition_delta=None,
        max_partitions_per_user=k,
        max_records_per_user=None,
        limit=Limit(epsilon=lifetime),
        partition_limit=None if per_partition is None else Limit(epsilon=per_partition),
        windows=() if window is None else (WindowLimit(HOUR, Limit(epsilon=window)),),
        ledger_seq=0,
        ledger_head="",
        head_seal=None,
        terms_sha256="",
        quota=None if quota is None or not granted else Limit(epsilon=quota),
        granted=granted,
        key_valid=True,
        role=role,
    )
    reads = ChargeReads(
        dataset=dataset,
        now_us=NOW_US,
        partitions={p: existing[p] for p in keys if p in existing},
        scopes=scopes,
        spends=lifetime_spends if per_partition is not None else {},
    )
    request = ChargeRequest(
        dataset="clicks",
        partitions=asked,
        release=release,
        mechanism=_mechanism(),
        params={"units": cost},
        sensitivity_unit=None,
        principal=_Caller(),
    )
    if not (role == "admin" or (role == "service" and granted)):
        with pytest.raises(Forbidden):
            decide(reads, request)
        return
    if not keys:
        with pytest.raises(InvalidRequest, match="resolved to no partition"):
            decide(reads, request)
        return
    decision = decide(reads, request)

    new: tuple[int, list[str], str] = (cost, keys, release)
    expected: dict[str, tuple[Fraction, Fraction, int]] = {}  # scope: (before, after, limit)
    for scope, (_, past) in sub_histories.items():
        limit = {"dataset": lifetime, "consumer": quota if granted else None, "window": window}[
            scope
        ]
        if limit is not None:
            before = (
                reference_loss([(Fraction(c), ps, r) for c, ps, r, _, _ in past], unit, k)
                if past
                else Fraction(0)
            )
            expected[scope] = (before, _reference(past, new, unit, k), limit)
    if per_partition is not None:
        spent = {p: lifetime_spends.get(p, Amount()).epsilon for p in keys}
        worst = max(keys, key=lambda p: spent[p])
        over = [p for p in keys if spent[p] + cost > per_partition]
        named = over[0] if over else worst
        expected["partition"] = (
            Fraction(spent[named]),
            Fraction(spent[named] + cost),
            per_partition,
        )
    denying = next((s for s in ORDER if s in expected and expected[s][1] > expected[s][2]), None)

    assert decision.partitions == keys
    assert decision.granted == (denying is None)
    assert Fraction(decision.lifetime_now.epsilon) == expected["dataset"][0]
    assert Fraction(decision.lifetime_after.epsilon) == expected["dataset"][1]
    by_scope = {check.scope: check for check in decision.checks}
    assert set(by_scope) == set(expected)
    for scope, (before, after, _) in expected.items():
        assert (
            Fraction(by_scope[scope].spent.epsilon),
            Fraction(by_scope[scope].after.epsilon),
        ) == (before, after), scope
    if denying is not None:
        assert decision.denial is not None and decision.denial.scope == denying
        if denying != "partition":
            alone = reference_loss([(Fraction(cost), keys, release)], unit, k)
            assert decision.never_fits == (alone > expected[denying][2])
