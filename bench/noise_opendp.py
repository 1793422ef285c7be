"""Samples per second of the built-in noise mechanisms against OpenDP's exact samplers
(``make_laplace`` / ``make_gaussian`` on a vector of zeros), in one run.

    pip install -e '.[bench]'
    python bench/noise_opendp.py [--draws 100000] [--repeat 3]

Both sides are exact and return Python lists. OpenDP's float mechanisms are timed at their
default granularity and at the grid the built-ins use (2^-39 at scale 2, 2^-38 at sigma 4),
which OpenDP takes only for vectors of a known size.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from accountant.plugins import MechanismRegistry, make_plugin_manager
from accountant.randomness import RandomSource


def best_rate(action: Callable[[], object], draws: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return draws / best


def opendp_cases(n: int) -> dict[str, list[tuple[str, Any, list[Any]]]]:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    floats = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n)
    ints = dp.vector_domain(dp.atom_domain(T=int), size=n)
    l1f, l1i = dp.l1_distance(T=float), dp.l1_distance(T=int)
    l2f, l2i = dp.l2_distance(T=float), dp.l2_distance(T=int)
    zeros, int_zeros = [0.0] * n, [0] * n
    return {
        "laplace": [
            ("default k", dp.m.make_laplace(floats, l1f, scale=2.0), zeros),
            ("k = -39", dp.m.make_laplace(floats, l1f, scale=2.0, k=-39), zeros),
        ],
        "discrete_laplace": [("", dp.m.make_laplace(ints, l1i, scale=2.0), int_zeros)],
        "gaussian": [
            ("default k", dp.m.make_gaussian(floats, l2f, scale=4.0), zeros),
            ("k = -38", dp.m.make_gaussian(floats, l2f, scale=4.0, k=-38), zeros),
        ],
        "discrete_gaussian": [("", dp.m.make_gaussian(ints, l2i, scale=4.0), int_zeros)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--draws", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, repeat = args.draws, args.repeat
    registry = MechanismRegistry(*make_plugin_manager())
    source = RandomSource()
    ours = {
        # scale 2 (sensitivity 1, epsilon 1/2) and sigma 4, as in bench/noise.py
        "laplace": {"epsilon": Decimal("0.5"), "sensitivity": Decimal(1)},
        "discrete_laplace": {"epsilon": Decimal("0.5"), "sensitivity": Decimal(1)},
        "gaussian": {"sigma": Decimal(4), "sensitivity": Decimal(1)},
        "discrete_gaussian": {"sigma": Decimal(4), "sensitivity": Decimal(1)},
    }
    theirs = opendp_cases(n)
    print(f"{'sampler':20} {'samples/s':>12} {'OpenDP':>12} {'ratio':>7}  OpenDP measurement")
    for name, params in ours.items():
        mechanism = registry.get(name)
        assert mechanism is not None
        rate = best_rate(lambda m=mechanism, p=params: m.run(p, {"size": n}, source), n, repeat)
        for label, measurement, data in theirs[name]:
            other = best_rate(lambda f=measurement, d=data: f(d), n, repeat)
            print(f"{name:20} {rate:12,.0f} {other:12,.0f} {rate / other:7.1f}  {label}")


if __name__ == "__main__":
    main()
