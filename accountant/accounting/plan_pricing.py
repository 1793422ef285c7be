"""The cost of a batch's group on an approx dataset: its items' privacy-loss distributions
composed (pessimistic), read at the batch's delta, epsilon rounded up.

A batch's parameters are all fixed before any output exists, so its items form a
non-adaptive plan, and the joint releases of one group may be composed as one mechanism
instead of adding their epsilons and deltas. Each item contributes a dominating pair (Zhu,
Dathathri and Gopi 2022, "Optimal Accounting of Differential Privacy via Characteristic
Function": a pair whose hockey-stick divergences bound the mechanism's at every epsilon, for
every pair of neighbours; the products of dominating pairs dominate the composition): its
mechanism's ``privacy_loss`` where it states one, else the generic pair of its (epsilon,
delta) cost, which dominates every (epsilon, delta)-DP mechanism (Kairouz, Oh and
Viswanath 2015, "The Composition Theorem for Differential Privacy"). Their privacy-loss
distributions are composed by dp_accounting (Koskela, Jälkö and Honkela 2020; Meiser and
Mohammadi 2018) with pessimistic discretisation (Doroshenko, Ghazi, Kamath, Kumar and
Manurangsi 2022, "Connect the Dots"), so the epsilon read off is at least the plan's true
one. Across groups and batches the filter adds each group's (epsilon, delta) like any
other charge (Rogers, Roth, Ullman and Vadhan 2016). docs/accounting.md, "Batches: tight
composition of a fixed plan", gives the whole argument and the figures.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from accountant.exact import DELTA, EPSILON, Amount
from accountant.mechanism import MAX_PRIVACY_LOSS_BUCKETS, Mechanism, PrivacyLossTooWide

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

#: The finest discretisation interval, dp_accounting's default. Intervals are this times a
#: power of two, so that a coarser grid contains the finer one: connect the dots on fewer of
#: the same points only interpolates over longer chords, a dominating pair again. At 1e-4,
#: 100 Gaussians of sigma 10 compose to epsilon 4.88656 at delta 1e-6 against 4.886554117
#: exactly (the margin of the grid sampler included).
FINEST_INTERVAL = 1e-4
#: Sizing runs at this coarse interval first (a few dozen buckets for a typical item).
PROBE_INTERVAL = 2.0**-4
#: At most this many buckets in all the distinct kinds' distributions together, and in the
#: composed distribution: bounds the time and memory of pricing (about a second and 50 MB
#: at worst); a wider group is priced on a coarser interval.
KIND_BUCKETS, COMPOSED_BUCKETS = 2**16, 2**21
#: A group whose items' distributions at the probe interval add up to more buckets than
#: this loses far more than any budget (epsilon in the tens of thousands) and is refused.
MAX_PROBE_BUCKETS = 2**20
#: Kept back from the batch's delta for binary64 rounding in dp_accounting's FFT
#: convolutions, which no pessimistic flag covers: this fraction of delta, and this much more
#: per item composed (see ``group_epsilon``).
DELTA_RESERVE, DELTA_RESERVE_PER_ITEM = 2.0**-20, 2.0**-50


@dataclass(frozen=True, kw_only=True)
class PlanItem:
    """One release of a group, as the accountant will run it.

    ``params`` are the parameters it runs with (record-level sensitivity already scaled),
    ``coordinates`` the number d of values it noises, and ``single`` its cost as a single
    charge on the approx dataset (units of ``accountant.exact``), or None where it has none
    (a gaussian stated by sigma). The mechanism's ``privacy_loss`` prices it when the
    mechanism states one and has a sensitivity (a mechanism without one is scaled by the core
    for user datasets, which its ``privacy_loss`` would not know); otherwise ``single`` does.
    """

    mechanism: Mechanism
    params: Mapping[str, Any]
    coordinates: int
    single: Amount | None


def group_cost(items: Sequence[PlanItem], delta: Fraction) -> Amount:
    """The group's cost: (``group_epsilon``, delta rounded up to DELTA units). The group is
    (epsilon, delta)-DP, hence also (epsilon, delta')-DP for the delta' >= delta charged."""
    return Amount(epsilon=group_epsilon(items, delta), delta=DELTA.cost_units(delta))


def group_epsilon(items: Sequence[PlanItem], delta: Fraction) -> int:
    """The group's epsilon in units of accountant.exact.EPSILON (10^-9), rounded up, at `delta`.

    Identical items (same mechanism, parameters and d; or the same single cost where that
    prices them) are one kind, composed with itself by ``self_compose``; the kinds are then
    composed in a fixed order. Every kind is first built at ``PROBE_INTERVAL`` to size the
    work, then at the least ``FINEST_INTERVAL`` times 2^k that keeps the kinds within
    ``KIND_BUCKETS`` and the composition within ``COMPOSED_BUCKETS``.

    The epsilon is dp_accounting's ``get_epsilon_for_delta`` at the double just below delta
    less a reserve, made exact and rounded up. The reserve is for binary64 rounding in the
    convolutions, which is not pessimistic and grows with the number n of items (a
    ``self_compose`` raises Fourier coefficients to the n-th power): the composition of
    grid Laplaces falls below that of the continuous Laplaces it dominates by up to
    1.2 * 10^-15 in delta for 20 items and 10^-13 for 1000 (0.2% of epsilon at delta
    10^-12, where delta is steep), and 100 Gaussians by 2 * 10^-15. So delta less 2^-20 of
    it and n 2^-50 (about n 8.9 * 10^-16, ten times what was measured) is used: about
    10^-7 more epsilon at delta 10^-6. It is an allowance for float error measured, not a
    proof of its size.

    Raises ValueError for an empty group, a delta outside (0, 1), an item with neither a
    ``privacy_loss`` nor a single cost, a group too wide to compose, or a delta too small
    for any finite epsilon (below the reserve, or the mass dp_accounting truncates, about
    10^-15 per composition).
    """
    if not items:
        raise ValueError("a group has at least one item")
    delta = Fraction(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1); got {float(delta):g}")
    counts = Counter(_kind(item) for item in items)
    interval = _interval(counts)
    composed = _composed(counts, interval)
    target = _double_at_most(delta)
    target -= target * DELTA_RESERVE + len(items) * DELTA_RESERVE_PER_ITEM
    epsilon = float(composed.get_epsilon_for_delta(target)) if target > 0 else math.inf
    if not math.isfinite(epsilon):
        raise ValueError(
            f"no finite epsilon for the group at delta {float(delta):g}: it is below what tight "
            f"composition sets aside for {len(items)} items (about {len(items)}e-15); name a "
            "larger delta"
        )
    return EPSILON.cost_units(Fraction(epsilon))


def split(total: Amount, n: int) -> list[Amount]:
    """`total` divided among n items, each component rounded up, so the parts add to at
    least total: n equal parts of ceil(component / n)."""
    if n < 1:
        raise ValueError(f"a group has at least one item; got {n}")
    part = Amount(-(-total.epsilon // n), -(-total.delta // n), -(-total.rho // n))
    return [part] * n


@dataclass(frozen=True)
class _Kind:
    """Items that compose alike: equal when their keys are; ``build`` makes the distribution
    at an interval, ``order`` fixes the order of composition (float sums depend on it)."""

    key: Hashable
    order: str
    build: Callable[[float], PrivacyLossDistribution] = field(compare=False)
    name: str = field(compare=False)


def _kind(item: PlanItem) -> _Kind:
    mechanism = item.mechanism
    loss = mechanism.privacy_loss
    if loss is not None and mechanism.has_sensitivity:
        params, d = dict(item.params), item.coordinates
        frozen = _frozen(params)
        return _Kind(
            ("loss", loss, frozen, d),
            f"1 {mechanism.name} {d} {frozen!r}",
            lambda interval: loss(params, d, interval),
            mechanism.name,
        )
    single = item.single
    if single is None:
        raise ValueError(
            f"{mechanism.name} states no privacy-loss distribution, and no single cost was "
            "given for it: it cannot be priced in a group"
        )
    return _Kind(
        ("pair", single.epsilon, single.delta),
        f"2 {single.epsilon} {single.delta}",
        lambda interval: generic_pair(
            Fraction(single.epsilon, EPSILON.scale), Fraction(single.delta, DELTA.scale), interval
        ),
        mechanism.name,
    )


def _frozen(value: Any) -> Hashable:
    """A hashable copy of JSON-like parameters (dicts and lists become sorted tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    hash(value)  # anything else must be hashable already (Decimal, int, str, bool, None)
    result: Hashable = value
    return result


def generic_pair(epsilon: Fraction, delta: Fraction, interval: float) -> PrivacyLossDistribution:
    """dp_accounting's pessimistic distribution of the pair that dominates every
    (epsilon, delta)-DP mechanism: loss +infinity with probability delta, +epsilon with
    probability (1 - delta) e^epsilon / (1 + e^epsilon), -epsilon with the rest (Kairouz, Oh
    and Viswanath 2015), with epsilon and delta rounded up to doubles (the pair of a larger
    epsilon or delta dominates the smaller's)."""
    bound = _double_at_least(epsilon)
    if 2 * bound / interval > MAX_PRIVACY_LOSS_BUCKETS:
        raise PrivacyLossTooWide(
            f"an ({epsilon}, delta) cost is too wide to compose at interval {interval:g}"
        )
    from dp_accounting.pld import common, privacy_loss_distribution

    return privacy_loss_distribution.from_privacy_parameters(
        common.DifferentialPrivacyParameters(bound, _double_at_least(delta)), interval
    )


@lru_cache(maxsize=128)
def _built(kind: _Kind, interval: float) -> PrivacyLossDistribution:
    """One kind's distribution at an interval (each at most a few MB; cached because a
    service prices the same kinds again and again)."""
    try:
        return kind.build(interval)
    except PrivacyLossTooWide as error:
        raise ValueError(
            f"cannot compose the group tightly: {kind.name}: {error}; price these items "
            "singly (a batch without delta)"
        ) from error


def _buckets(distribution: PrivacyLossDistribution) -> int:
    """How many buckets a distribution holds, in its larger direction (dp_accounting keeps
    its two probability mass functions private and offers no size)."""
    return max(int(distribution._pmf_remove.size), int(distribution._pmf_add.size))


def _interval(counts: Counter[_Kind]) -> float:
    """The least FINEST_INTERVAL * 2^k at which the distinct kinds together, and their
    composition, stay within KIND_BUCKETS and COMPOSED_BUCKETS buckets, sized at the probe.
    The probes are built one by one and given up on once they pass MAX_PROBE_BUCKETS, which
    bounds the work a group of many wide kinds can cause before it is refused."""
    probes, total = {}, 0
    for kind, count in counts.items():
        probes[kind] = _built(kind, PROBE_INTERVAL)
        total += count * _buckets(probes[kind])
        if total > MAX_PROBE_BUCKETS:
            raise ValueError(
                "cannot compose the group tightly: its privacy losses are too wide (epsilon "
                "in the tens of thousands); price these items singly (a batch without delta)"
            )
    kinds_width = sum(_buckets(probe) for probe in probes.values()) * PROBE_INTERVAL
    composed_width = _buckets(_composed(counts, PROBE_INTERVAL)) * PROBE_INTERVAL
    interval = FINEST_INTERVAL
    while kinds_width / interval > KIND_BUCKETS or composed_width / interval > COMPOSED_BUCKETS:
        interval *= 2
    return interval


def _composed(counts: Counter[_Kind], interval: float) -> PrivacyLossDistribution:
    """Every kind composed with itself ``count`` times, then the kinds with each other."""
    composed = None
    for kind in sorted(counts, key=lambda kind: kind.order):
        part = _built(kind, interval)
        if counts[kind] > 1:
            part = part.self_compose(counts[kind])
        composed = part if composed is None else composed.compose(part)
    assert composed is not None  # counts is never empty
    return composed


def _double_at_least(value: Fraction) -> float:
    """The least double at least ``value``."""
    result = float(value)
    return math.nextafter(result, math.inf) if Fraction(result) < value else result


def _double_at_most(value: Fraction) -> float:
    """The greatest double at most ``value``."""
    result = float(value)
    return math.nextafter(result, -math.inf) if Fraction(result) > value else result
