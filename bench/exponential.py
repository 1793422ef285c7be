"""Selections per second of the exponential mechanism among 10 and 1,000 candidates.

This version, version 2 (copied below, with the samplers it used, as the baseline) and
numpy's Gumbel-max (PCG64 and floats: neither secure nor exact) are timed in the same run.

Each selection is one run() with epsilon 1, sensitivity 1 and the utilities 0, 1, ..., n - 1
as a list of ints (Gumbel-max too starts from the list), from the operating system's source
(``RandomSource``) or from a keyed source made for each selection as for each charge
(``KeyedRandomSource``, SHAKE-256). A round times each contender for --seconds, in an order
that rotates from round to round so that a slow spell of a shared machine falls on all
alike; the best round of --repeat counts.

    python bench/exponential.py [--seconds 1] [--repeat 3] [--candidates 10 1000]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from accountant.randomness import KeyedRandomSource, RandomSource
from accountant_plugins import _exact, exponential

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

# --- version 2, as it was: exponents in Fractions, vectorised rejection ----------------------


def _uniform_below(source: RandomSource, bounds: Ints) -> Ints:
    bounds = np.asarray(bounds, dtype=np.int64)
    mask = bounds - 1
    for shift in (1, 2, 4, 8, 16, 32):
        mask |= mask >> shift
    out = np.empty(bounds.shape, dtype=np.int64)
    pending = np.arange(bounds.size)
    while pending.size:
        words = (source.uint64(pending.size) >> np.uint64(1)).astype(np.int64)
        draws = words & mask[pending]
        accepted = draws < bounds[pending]
        out[pending[accepted]] = draws[accepted]
        pending = pending[~accepted]
    return out


def _bernoulli_exp_at_most_one(source: RandomSource, numerators: Ints, denominator: Ints) -> Bools:
    numerators = np.asarray(numerators, dtype=np.int64)
    denominator = np.broadcast_to(np.asarray(denominator, dtype=np.int64), numerators.shape)
    k = np.ones(numerators.shape, dtype=np.int64)
    pending = np.arange(numerators.size)
    while pending.size:
        success = _uniform_below(source, denominator[pending] * k[pending]) < numerators[pending]
        k[pending[success]] += 1
        pending = pending[success]
    odd: Bools = (k % 2) == 1
    return odd


def _bernoulli_exp(source: RandomSource, numerators: Ints, denominator: Ints) -> Bools:
    numerators = np.asarray(numerators, dtype=np.int64)
    denominator = np.broadcast_to(np.asarray(denominator, dtype=np.int64), numerators.shape)
    whole, fraction = np.divmod(numerators, denominator)
    result = np.ones(numerators.shape, dtype=bool)
    step = 0
    while True:
        alive = np.flatnonzero(result & (whole > step))
        if not alive.size:
            break
        ones = np.ones(alive.size, dtype=np.int64)
        result[alive] = _bernoulli_exp_at_most_one(source, ones, ones)
        step += 1
    alive = np.flatnonzero(result)
    result[alive] = _bernoulli_exp_at_most_one(source, fraction[alive], denominator[alive])
    return result


def _old_exponents(
    epsilon: Fraction, sensitivity: Fraction, utilities: list[Fraction]
) -> tuple[list[int], int]:
    effective = epsilon * (1 - Fraction(1, 2**20))
    k = 0
    while Fraction(1, 2**k) > effective / 2**22:
        k += 1
    denominator = 2**k
    best = max(utilities)
    cap = 2**20 * denominator
    numerators = [
        min(cap, math.ceil(effective * (best - u) / (2 * sensitivity) * denominator))
        for u in utilities
    ]
    return numerators, denominator


def old_run(
    params: Mapping[str, Any], data: Mapping[str, Any], source: RandomSource
) -> dict[str, Any]:
    utilities = [Fraction(u) for u in data["utilities"]]
    numerators, denominator = _old_exponents(
        Fraction(params["epsilon"]), Fraction(params["sensitivity"]), utilities
    )
    n = len(utilities)
    if max(numerators) < 2**62 // 2 and denominator < 2**40:
        exact = np.array(numerators, dtype=np.int64)
        batch = max(256, n)
        while True:
            proposals = _uniform_below(source, np.full(batch, n, dtype=np.int64))
            accepted = _bernoulli_exp(
                source, exact[proposals], np.full(batch, denominator, dtype=np.int64)
            )
            if accepted.any():
                return {"index": int(proposals[np.argmax(accepted)])}
    words = _exact.Words(source)
    while True:
        proposal = words.below(n)
        if words.bernoulli_exp(numerators[proposal], denominator):
            return {"index": proposal}


# --- the measurement ---------------------------------------------------------------------------


def rate(select: Callable[[int], object], seconds: float) -> float:
    """Selections per second over at least ``seconds``."""
    done, started = 0, time.perf_counter()
    while True:
        for _ in range(8):
            select(done)
            done += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return done / elapsed


def contenders(n: int, keyed: bool) -> dict[str, Callable[[int], object]]:
    params = {"epsilon": Decimal(1), "sensitivity": Decimal(1)}
    data = {"utilities": list(range(n))}
    shared = RandomSource()
    secret = bytes(range(32))

    def source(i: int) -> RandomSource:
        return KeyedRandomSource(secret, f"charge-{i}") if keyed else shared

    generator = np.random.default_rng()
    scale = float(params["epsilon"]) / (2 * float(params["sensitivity"]))

    def gumbel(_: int) -> int:
        scores = np.asarray(data["utilities"], dtype=np.float64) * scale
        return int(np.argmax(scores + generator.gumbel(size=n)))

    return {
        "version 2": lambda i: old_run(params, data, source(i)),
        "version 3": lambda i: exponential.run(params, data, source(i)),
        "numpy gumbel": gumbel,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per contender and round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best counts")
    parser.add_argument("--candidates", type=int, nargs="+", default=[10, 1000])
    args = parser.parse_args()
    print(
        f"{'candidates':>10} {'source':>6} {'version 2/s':>12} {'version 3/s':>12} "
        f"{'gumbel/s':>10} {'v3/v2':>7} {'v3/gumbel':>9}"
    )
    for n in args.candidates:
        for keyed in (False, True):
            timed = contenders(n, keyed)
            names = list(timed)
            best = dict.fromkeys(names, 0.0)
            for round_ in range(args.repeat):
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    best[name] = max(best[name], rate(timed[name], args.seconds))
            old, new, gumbel = best["version 2"], best["version 3"], best["numpy gumbel"]
            print(
                f"{n:>10} {'keyed' if keyed else 'os':>6} {old:12,.0f} {new:12,.0f} "
                f"{gumbel:10,.0f} {new / old:7.1f} {new / gumbel:9.3f}"
            )


if __name__ == "__main__":
    main()
