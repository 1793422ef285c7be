"""Property test: random charge sequences against a plain reference of DESIGN.md's rules.

The reference below is written from the rules directly, with exact fractions
and the whole charge history (no incremental tricks): the service must grant
exactly what it grants, and report exactly its loss.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Api

PARTITIONS = ["a", "b", "c", "d"]
_names = itertools.count()


def reference_loss(
    charges: list[tuple[Fraction, list[str], str]], unit: str, k: int | None
) -> Fraction:
    spend = {p: Fraction(0) for p in PARTITIONS}
    total = Fraction(0)
    for cost, partitions, release in charges:
        for partition in partitions:
            spend[partition] += cost
        if release == "joint":
            total += cost
        else:
            total += cost * (len(partitions) if k is None else min(k, len(partitions)))
    if unit in ("record", "partition"):
        return max(spend.values())
    if k is None:
        return total
    return min(total, sum(sorted(spend.values(), reverse=True)[:k], Fraction(0)))


charge = st.tuples(
    st.sampled_from([Fraction(1, 20), Fraction(1, 10), Fraction(1, 4), Fraction(3, 10)]),
    st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=4, unique=True),
    st.sampled_from(["joint", "parallel"]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    unit=st.sampled_from(["record", "partition", "user"]),
    k=st.one_of(st.none(), st.integers(1, 3)),
    partition_limit=st.sampled_from([None, Fraction(1, 2)]),
    sequence=st.lists(charge, min_size=1, max_size=12),
)
def test_grants_and_loss_match_the_reference(
    api: Api,
    unit: str,
    k: int | None,
    partition_limit: Fraction | None,
    sequence: list[tuple[Fraction, list[str], str]],
) -> None:
    name = f"prop{next(_names)}"
    fields: dict[str, object] = {"privacy_unit": unit, "budget": {"epsilon": 1}}
    if unit == "user":
        fields["max_partitions_per_user"] = k
    if partition_limit is not None:
        fields["partition_budget"] = {"epsilon": float(partition_limit)}
    api.make_dataset(name, **fields)
    k = k if unit == "user" else None
    granted: list[tuple[Fraction, list[str], str]] = []
    for cost, partitions, release in sequence:
        after = [*granted, (cost, partitions, release)]
        spends = {p: sum((c for c, ps, _ in after if p in ps), Fraction(0)) for p in partitions}
        fits = reference_loss(after, unit, k) <= 1 and (
            partition_limit is None or max(spends.values()) <= partition_limit
        )
        response = api.charge(
            dataset=name,
            partitions=partitions,
            release=release,
            epsilon=float(cost),
            input={"values": [1.0] * len(partitions)},
        )
        assert response.status_code == (201 if fits else 409), (after, response.get_json())
        if fits:
            granted = after
    expected = reference_loss(granted, unit, k)
    assert Fraction(str(api.budget(name)["loss"]["epsilon"])) == expected
