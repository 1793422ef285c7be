"""Samples per second of each built-in mechanism for 10^6 draws, against numpy's own
``Generator.laplace`` / ``normal`` (PCG64, not secure, not exact) measured in the same run.

    python bench/noise.py [--draws 1000000] [--repeat 3] [--source os|keyed]
                          [--compare-with DIR]

``--compare-with DIR`` names a folder holding other versions of ``plugins/_exact.py`` and
``plugins/_samplers.py`` (say, copies from before a change): every mechanism is then timed
with both, alternately, in this one run, and the table shows both rates and their ratio.
``--source keyed`` draws from the keyed SHAKE-256 stream that charges use, instead of the
operating system's generator.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from accountant.plugins import MechanismRegistry, make_plugin_manager
from accountant.randomness import KeyedRandomSource, RandomSource


def best_rate(action: Callable[[], object], draws: int, repeat: int) -> float:
    best = min(_timed(action) for _ in range(repeat))
    return draws / best


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def other_samplers(folder: Path) -> dict[str, ModuleType]:
    """``_exact`` and ``_samplers`` as found in ``folder``, the second bound to the first."""
    exact = _load(folder / "_exact.py", "bench_other_exact")
    samplers = _load(folder / "_samplers.py", "bench_other_samplers")
    samplers._exact = exact  # type: ignore[attr-defined]
    return {"_exact": exact, "_samplers": samplers}


@contextlib.contextmanager
def swapped(modules: dict[str, ModuleType] | None) -> Iterator[None]:
    """The built-in plugins call ``modules`` instead of their own ``_exact``/``_samplers``."""
    if modules is None:
        yield
        return
    saved: list[tuple[ModuleType, str, Any]] = []
    for plugin in list(sys.modules.values()):
        package, _, module = (plugin.__name__ if plugin else "").partition(".")
        if package != "accountant_plugins" or module.startswith("_"):
            continue
        for name, other in modules.items():
            if name in vars(plugin) and isinstance(vars(plugin)[name], ModuleType):
                saved.append((plugin, name, vars(plugin)[name]))
                setattr(plugin, name, other)
    try:
        yield
    finally:
        for plugin, name, own in saved:
            setattr(plugin, name, own)


def rates(
    action: Callable[[], object], draws: int, repeat: int, other: dict[str, ModuleType] | None
) -> tuple[float, float | None]:
    """(rate with this tree's samplers, rate with the other ones or None), timed alternately
    so that a busy machine slows both alike."""
    mine, theirs = [], []
    for _ in range(repeat):
        mine.append(_timed(action))
        if other is not None:
            with swapped(other):
                theirs.append(_timed(action))
    return draws / min(mine), (draws / min(theirs) if theirs else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--draws", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--source", choices=("os", "keyed"), default="os")
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    n, repeat = args.draws, args.repeat
    registry = MechanismRegistry(*make_plugin_manager())
    source = RandomSource() if args.source == "os" else KeyedRandomSource(b"bench" * 8, "bench")
    other = other_samplers(args.compare_with) if args.compare_with else None
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
    compared = f" {'other':>12} {'speed-up':>8}" if other else ""
    print(f"{'sampler':22} {'samples/s':>12}{compared} {'ceiling':>14} {'ratio':>7}")
    for label, rate in ceiling.items():
        print(f"{label:22} {rate:12,.0f}{' ' * len(compared)} {'':>14} {'1.000':>7}")
    for name, (params, data, against) in cases.items():
        mechanism = registry.get(name)
        assert mechanism is not None
        rate, before = rates(
            lambda m=mechanism, p=params, d=data: m.run(p, d, source), n, repeat, other
        )
        old = f" {before:12,.0f} {rate / before:8.2f}" if before else ""
        print(f"{name:22} {rate:12,.0f}{old} {against:>14} {rate / ceiling[against]:7.3f}")
    exponential = registry.get("exponential")
    assert exponential is not None
    utilities = {"utilities": list(range(10))}
    params = {"epsilon": one, "sensitivity": one}
    calls = 2000
    try:
        rate, before = rates(
            lambda: [exponential.run(params, utilities, source) for _ in range(calls)],
            calls,
            repeat,
            other,
        )
    except AttributeError:  # a mechanism newer than the other samplers
        rate, before = rates(
            lambda: [exponential.run(params, utilities, source) for _ in range(calls)],
            calls,
            repeat,
            None,
        )
    gumbel = best_rate(
        lambda: [
            int(np.argmax(np.arange(10) / 2 + generator.gumbel(size=10))) for _ in range(calls)
        ],
        calls,
        repeat,
    )
    old = f" {before:12,.0f} {rate / before:8.2f}" if before else " " * len(compared)
    print(
        f"{'exponential (10)':22} {rate:12,.0f}{old} {'numpy gumbel':>14} {rate / gumbel:7.3f}"
        "   (selections/s against numpy Gumbel-max)"
    )


if __name__ == "__main__":
    main()
