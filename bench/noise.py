"""Samples per second of each built-in mechanism for 10^6 draws, against numpy's own
``Generator.laplace`` / ``normal`` (PCG64, not secure, not exact) measured in the same run.

    python bench/noise.py [--draws 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from decimal import Decimal

import numpy as np

from accountant.plugins import MechanismRegistry, make_plugin_manager
from accountant.randomness import RandomSource


def best_rate(action: Callable[[], object], draws: int, repeat: int) -> float:
    best = min(_timed(action) for _ in range(repeat))
    return draws / best


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, repeat = args.draws, args.repeat
    registry = MechanismRegistry(*make_plugin_manager())
    source = RandomSource()
    generator = np.random.default_rng()
    ceiling = {
        "numpy laplace": best_rate(lambda: generator.laplace(0, 2, n), n, repeat),
        "numpy normal": best_rate(lambda: generator.normal(0, 4, n), n, repeat),
    }
    one = Decimal(1)
    cases = {
        "laplace": ({"epsilon": Decimal("0.5"), "sensitivity": one}, {"size": n}, "numpy laplace"),
        "discrete_laplace": (
            {"epsilon": Decimal("0.5"), "sensitivity": one},
            {"size": n},
            "numpy laplace",
        ),
        "gaussian": ({"sigma": Decimal(4), "sensitivity": one}, {"size": n}, "numpy normal"),
        "discrete_gaussian": (
            {"sigma": Decimal(4), "sensitivity": one},
            {"size": n},
            "numpy normal",
        ),
        "randomized_response": ({"epsilon": one}, {"values": [True] * n}, "numpy laplace"),
    }
    print(f"{'sampler':22} {'samples/s':>12} {'ceiling':>14} {'ratio':>7}")
    for label, rate in ceiling.items():
        print(f"{label:22} {rate:12,.0f} {'':>14} {'1.000':>7}")
    for name, (params, data, against) in cases.items():
        mechanism = registry.get(name)
        assert mechanism is not None
        rate = best_rate(lambda m=mechanism, p=params, d=data: m.run(p, d, source), n, repeat)
        print(f"{name:22} {rate:12,.0f} {against:>14} {rate / ceiling[against]:7.3f}")
    exponential = registry.get("exponential")
    assert exponential is not None
    utilities = {"utilities": list(range(10))}
    params = {"epsilon": one, "sensitivity": one}
    calls = 2000
    rate = best_rate(
        lambda: [exponential.run(params, utilities, source) for _ in range(calls)], calls, repeat
    )
    gumbel = best_rate(
        lambda: [
            int(np.argmax(np.arange(10) / 2 + generator.gumbel(size=10))) for _ in range(calls)
        ],
        calls,
        repeat,
    )
    print(
        f"{'exponential (10)':22} {rate:12,.0f} {'numpy gumbel':>14} {rate / gumbel:7.3f}"
        "   (selections/s against numpy Gumbel-max)"
    )


if __name__ == "__main__":
    main()
