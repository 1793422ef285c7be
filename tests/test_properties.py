"""Property test: random charge sequences against a plain reference of DESIGN.md's rules.

The reference below is written from the rules directly, with exact fractions
and the whole charge history (no incremental tricks): the service must grant
exactly what it grants, answer a denial 409 or 429 as the reference says
(429 only for a window that a charge alone would fit), and report exactly
its loss, which is never below the exact worst person's for a bounded k.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import Api

PARTITIONS = ["a", "b", "c", "d"]
_names = itertools.count()


def reference_loss(
    charges: list[tuple[Fraction, list[str], str]], unit: str, k: int | None
) -> Fraction:
    if unit in ("record", "partition"):
        return max(_spends(charges).values())
    if k is None:
        return _total(charges, None)
    joint = [c for c in charges if c[2] == "joint"]
    parallel = [c for c in charges if c[2] == "parallel"]
    return min(_top_k(charges, k), _top_k(joint, k) + _top_k(parallel, k))


def _spends(charges: list[tuple[Fraction, list[str], str]]) -> dict[str, Fraction]:
    """s(p): the sum of the costs of the charges that touched p."""
    spend = {p: Fraction(0) for p in PARTITIONS}
    for cost, partitions, _ in charges:
        for partition in partitions:
            spend[partition] += cost
    return spend


def _total(charges: list[tuple[Fraction, list[str], str]], k: int | None) -> Fraction:
    """T: the sum of c * m, m = 1 joint, min(k, |P|) parallel (|P| with unbounded k)."""
    return sum(
        (
            cost * (1 if release == "joint" else min(k or len(partitions), len(partitions)))
            for cost, partitions, release in charges
        ),
        Fraction(0),
    )


def _top_k(charges: list[tuple[Fraction, list[str], str]], k: int) -> Fraction:
    """min(T, sum of the k largest s(p)) over ``charges``."""
    spend = sorted(_spends(charges).values(), reverse=True)
    return min(_total(charges, k), sum(spend[:k], Fraction(0)))


def worst_person(charges: list[tuple[Fraction, list[str], str]], k: int) -> Fraction:
    """The exact loss of the worst-placed person in at most k partitions: a joint release
    costs c once if it touches them, a parallel one c per partition of theirs it covers."""
    worst = Fraction(0)
    for placed in itertools.combinations(PARTITIONS, min(k, len(PARTITIONS))):
        loss = Fraction(0)
        for cost, partitions, release in charges:
            covered = len(set(partitions) & set(placed))
            loss += cost * (min(covered, 1) if release == "joint" else covered)
        worst = max(worst, loss)
    return worst


charge = st.tuples(
    st.sampled_from([Fraction(1, 20), Fraction(1, 10), Fraction(1, 4), Fraction(3, 10)]),
    st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=4, unique=True),
    st.sampled_from(["joint", "parallel"]),
)


@pytest.mark.frozen_clock  # every charge of every example falls in one 30-day window
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    unit=st.sampled_from(["record", "partition", "user"]),
    k=st.one_of(st.none(), st.integers(1, 3)),
    partition_limit=st.sampled_from([None, Fraction(1, 2)]),
    window_limit=st.sampled_from([None, Fraction(1, 5), Fraction(2, 5)]),
    sequence=st.lists(charge, min_size=1, max_size=12),
)
# Top-k on fresh windows: a joint and a parallel charge that exceed the window alone (409),
# one that fills it exactly and one that a later window would admit (429).
@example(
    unit="user",
    k=2,
    partition_limit=None,
    window_limit=Fraction(1, 5),
    sequence=[
        (Fraction(1, 4), ["a", "b"], "joint"),
        (Fraction(1, 10), ["a", "b", "c"], "parallel"),
        (Fraction(3, 10), ["c"], "parallel"),
        (Fraction(1, 20), ["a"], "joint"),
    ],
)
# The joint and parallel parts apart: 0.2 + min(0.6, 0.3 + 0.2) = 0.7 < min(T, top-2 s) = 0.8.
@example(
    unit="user",
    k=2,
    partition_limit=None,
    window_limit=None,
    sequence=[
        (Fraction(1, 5), ["a", "b", "c"], "joint"),
        (Fraction(1, 5), ["a", "c"], "parallel"),
        (Fraction(1, 10), ["b", "c"], "parallel"),
    ],
)
def test_grants_and_loss_match_the_reference(
    api: Api,
    unit: str,
    k: int | None,
    partition_limit: Fraction | None,
    window_limit: Fraction | None,
    sequence: list[tuple[Fraction, list[str], str]],
) -> None:
    name = f"prop{next(_names)}"
    fields: dict[str, object] = {"privacy_unit": unit, "budget": {"epsilon": 1}}
    if unit == "user":
        fields["max_partitions_per_user"] = k
    if partition_limit is not None:
        fields["partition_budget"] = {"epsilon": float(partition_limit)}
    if window_limit is not None:
        fields["windows"] = [{"period": "30d", "epsilon": float(window_limit)}]
    api.make_dataset(name, **fields)
    k = k if unit == "user" else None
    granted: list[tuple[Fraction, list[str], str]] = []
    for cost, partitions, release in sequence:
        after = [*granted, (cost, partitions, release)]
        spends = {p: sum((c for c, ps, _ in after if p in ps), Fraction(0)) for p in partitions}
        lasting = reference_loss(after, unit, k) <= 1 and (
            partition_limit is None or max(spends.values()) <= partition_limit
        )
        in_window = window_limit is None or reference_loss(after, unit, k) <= window_limit
        alone = reference_loss([(cost, partitions, release)], unit, k)
        if lasting and in_window:
            expected_status = 201
        elif lasting and window_limit is not None and alone <= window_limit:
            expected_status = 429  # the window alone denies, and a later window would fit it
        else:
            expected_status = 409
        response = api.charge(
            dataset=name,
            partitions=partitions,
            release=release,
            epsilon=float(cost),
            input={"values": [1.0] * len(partitions)},
        )
        assert response.status_code == expected_status, (after, response.get_json())
        if expected_status == 201:
            granted = after
    expected = reference_loss(granted, unit, k)
    assert Fraction(str(api.budget(name)["loss"]["epsilon"])) == expected
    if k is not None:
        assert expected >= worst_person(granted, k)
