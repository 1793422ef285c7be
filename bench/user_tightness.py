"""How close the top-k rule's loss comes to the exact worst person on user datasets: the old
bound min(T, top-k s(p)) and the rule's loss with the joint/parallel term, each divided by
the exact worst person's loss (brute force over every set of k partitions), on random
workloads of joint and parallel releases.

    python bench/user_tightness.py [--workloads 200] [--k 3] [--partitions 8] [--charges 20]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
from fractions import Fraction

from accountant.accounting.loss import LossRule, ScopeBooks, loss_now
from accountant.exact import Amount

Charge = tuple[int, list[str], str]


def worst_person(charges: list[Charge], partitions: list[str], k: int) -> int:
    """The exact worst person: a joint release costs c once if it touches their partitions,
    a parallel one c per partition of theirs it covers."""
    worst = 0
    for placed in itertools.combinations(partitions, min(k, len(partitions))):
        loss = 0
        for cost, keys, release in charges:
            covered = len(set(keys) & set(placed))
            loss += cost * (min(covered, 1) if release == "joint" else covered)
        worst = max(worst, loss)
    return worst


def workload(rng: random.Random, partitions: list[str], count: int) -> list[Charge]:
    """``count`` releases, each joint or parallel, on a uniformly sized random set of
    partitions, at a cost of 1 to 10 units."""
    return [
        (
            rng.randint(1, 10),
            rng.sample(partitions, rng.randint(1, len(partitions))),
            rng.choice(["joint", "parallel"]),
        )
        for _ in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--charges", type=int, default=20)
    parser.add_argument("--seed", type=int, default=28)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    partitions = [f"p{i}" for i in range(args.partitions)]
    rule = LossRule("user", args.k)
    ratios: dict[str, list[Fraction]] = {"min(T, top-k s)": [], "with the split term": []}
    for _ in range(args.workloads):
        charges = workload(rng, partitions, args.charges)
        books = ScopeBooks()
        for cost, keys, release in charges:
            books.add(Amount(epsilon=cost), rule.multiplicity(release, len(keys)), keys, release)
        every = books.parts["every"]
        old = min(every.total.epsilon, sum(every.top("epsilon", args.k).outside))
        new = loss_now(rule, books.state(args.k), ("epsilon",)).epsilon
        exact = worst_person(charges, partitions, args.k)
        assert exact <= new <= old
        ratios["min(T, top-k s)"].append(Fraction(old, exact))
        ratios["with the split term"].append(Fraction(new, exact))
    print(
        f"{args.workloads} workloads, k = {args.k}, {args.partitions} partitions, "
        f"{args.charges} releases each; loss / exact worst person:"
    )
    for name, values in ratios.items():
        print(
            f"  {name:22} worst {float(max(values)):.3f}  "
            f"median {float(statistics.median(values)):.3f}"
        )


if __name__ == "__main__":
    main()
