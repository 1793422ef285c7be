"""Calibrating a release plan: the least noise for each item of a weighted list such that
the whole list, charged as one batch, fits (a share of) what every scope has left.

Each item leaves out its noise parameter (``epsilon``, ``sigma`` or ``rho``)
and states a weight. One scale s per dataset sets every parameter of its
items (``parameter``):

- where costs add (every mode, and ``approx`` without the batch's ``delta``),
  each item's cost in the dataset's measure (epsilon; rho on zcdp, the Renyi
  divergence on rdp, mu^2 on gdp) is its weight times s: its share of the
  measure is proportional to its weight. The parameter is found by bisection
  on its own pricing and rounded to 9 significant digits toward more noise;
- on ``approx`` with a ``delta``, where a batch prices its groups by
  composing privacy-loss distributions and no item has a cost of its own,
  each item's noise relative to its sensitivity is inversely proportional
  to its weight: epsilon = weight x s for a Laplace-like item,
  sigma = sensitivity / (weight x s) for a Gaussian.

s is the largest value at which the batch of the dataset's items is granted
within ``share`` of what each scope has left: found by doubling and
bisection over ``batches.dry_run``, which decides the batch exactly as a
batch is decided, datasets locked in name order, every write undone. So
charging the answer as one batch, at once, is granted. Datasets that share
no scope are independent, so each has its own s; the datasets of one
population share its scope, so their items share one s, each item's share
of the population's measure (which all its datasets measure alike)
proportional to its weight. As within one dataset, the weights fix the
proportions and the binding scope the scale: the population's, or any
member's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlalchemy import bindparam, func, select

from accountant.accounting import pricing
from accountant.accounting.charge_inputs import Caller, ChargeRequest, DatasetState, PlanShare
from accountant.accounting.decide import price_alone
from accountant.driver import Driver
from accountant.errors import InvalidRequest, field_error
from accountant.exact import Amount, ComponentName
from accountant.models import Dataset, Partition
from accountant.services import batches, plans
from accountant.services.charges import ChargeContext
from accountant.statements import statement


@dataclass(frozen=True, kw_only=True)
class WeightedItem:
    """One item of a plan to calibrate.

    Args:
        request: the charge, its noise parameter left out.
        weight: its share of its dataset's measure, relative to the others'.
        name: the noise parameter to solve for (``plans.NOISE_PARAMETERS``).
    """

    request: ChargeRequest
    weight: Fraction
    name: str


@dataclass(frozen=True)
class Calibrated:
    values: list[Decimal]  # each item's noise parameter, in order
    charged: dict[str, Amount]  # what the batch would charge each dataset
    states: dict[str, DatasetState]


def calibrate(
    driver: Driver,
    items: list[WeightedItem],
    *,
    share: Fraction,
    delta: Decimal | None,
    caller: Caller,
    context: ChargeContext,
) -> Calibrated:
    """Each item's least-noise parameter; see the module's notes. A 400 naming the first
    item of a dataset on which nothing fits. Writes nothing, and holds its datasets' locks
    only for one dry run at a time: a dry run's groups are priced before it locks."""
    names = sorted({item.request.dataset for item in items})
    driver.begin_write()
    try:
        states = batches.lock(driver, names, caller, [item.request for item in items])
        sizes = {i: _partition_count(driver, item.request) for i, item in enumerate(items)}
    finally:
        driver.rollback()
    values: dict[int, Decimal] = {}
    charged: dict[str, Amount] = {}
    for together in _sharing_scopes(states):
        mine = {i: item for i, item in enumerate(items) if item.request.dataset in together}
        plan = _Plan(
            driver=driver,
            items=mine,
            states={name: states[name] for name in together},
            sizes={i: sizes[i] for i in mine},
            share=share,
            delta=delta,
            caller=caller,
            now_us=context.clock.now_us(),
            context=context,
        )
        scale = _largest(plan.fits_at)
        if scale is None:
            raise field_error(
                f"items[{min(mine)}]",
                f"nothing fits: even the most noise the mechanisms allow does not fit "
                f"{share} of what {plan.left_of} left",
            )
        for _ in range(20):  # checked at the parameters themselves
            fits, cost = plan.fits(scale)
            if fits:
                break
            scale *= 1 - 1e-9
        else:
            raise field_error(
                f"items[{min(mine)}]",
                f"no parameters near the scale found fit what {plan.left_of} left; the "
                "mechanisms' costs are not monotone in their noise parameters",
            )
        values.update(plan.at(scale))
        charged.update({name: cost[name] for name in together})
    return Calibrated([values[i] for i in range(len(items))], charged, states)


def _sharing_scopes(states: Mapping[str, DatasetState]) -> list[list[str]]:
    """The plan's datasets in sets that share a scope (a population's members), each set
    and the sets in name order."""
    sets: dict[object, list[str]] = {}
    for name in sorted(states):
        population = states[name].population
        sets.setdefault(name if population is None else population.id, []).append(name)
    return sorted(sets.values())


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """The items of datasets that share a scope (one dataset, or a population's members),
    and the batch they make at a scale."""

    driver: Driver
    items: dict[int, WeightedItem]
    states: Mapping[str, DatasetState]
    sizes: dict[int, int]
    share: Fraction
    delta: Decimal | None
    caller: Caller
    now_us: int
    context: ChargeContext

    @property
    def left_of(self) -> str:
        """The datasets, and their population if any, as a refusal names them, with their
        verb: what has too little left may be the population."""
        names = [repr(name) for name in self.states]
        named = f"dataset {names[0]}" if len(names) == 1 else f"datasets {', '.join(names)}"
        population = next(iter(self.states.values())).population
        if population is None:  # a dataset outside any population shares no scope: alone
            return f"{named} has"
        return f"{named} and population {population.name!r} have"

    def _state(self, i: int) -> DatasetState:
        return self.states[self.items[i].request.dataset]

    def _grouped(self, i: int) -> bool:
        """Whether item ``i``'s dataset prices the batch's groups by composing them."""
        state = self._state(i)
        return self.delta is not None and state.accounting == "approx" and not state.mode.advanced

    def at(self, scale: float) -> dict[int, Decimal]:
        """Each item's parameter at ``scale``."""
        return {
            i: parameter(item, scale, self._state(i), self.sizes[i], self._grouped(i))
            for i, item in self.items.items()
        }

    def fits_at(self, scale: float) -> bool:
        """Whether the batch at ``scale`` fits. Where costs add, each item stands in by its
        cost at ``scale`` (its weight times ``scale`` in the measure, at least what its
        parameter rounded toward more noise costs), so that no parameter is solved for
        until the scale is known."""
        if any(self._grouped(i) for i in self.items):
            return self.fits(scale)[0]
        items = tuple(
            replace(
                item.request,
                params={**item.request.params, item.name: Decimal(1)},
                share=PlanShare(batch_id="plan", cost=self._cost_at(i, scale)),
            )
            for i, item in self.items.items()
        )
        return self._dry_run(items)[0]

    def _cost_at(self, i: int, scale: float) -> Amount:
        """Item ``i``'s cost at ``scale``: its measure its weight times ``scale`` (rounded
        down: its parameter's cost is at most that), its other components as priced."""
        item, state = self.items[i], self._state(i)
        measure: ComponentName = "epsilon" if state.accounting in ("pure", "approx") else "rho"
        units = 10**9 if measure == "epsilon" else 10**12
        params = {**item.request.params, item.name: Decimal(1)}
        try:
            base = price_alone(item.request, state, self.sizes[i], params).cost
        except pricing.PricingError as error:  # a 400 naming the item, never a 500
            mechanism = item.request.mechanism_to_run
            takes_delta = "delta" in mechanism.params_schema.get("properties", {})
            hint = (
                "; or give the plan a delta, at which its approx groups are composed"
                if state.accounting == "approx"
                and self.delta is None
                and takes_delta
                and "delta" not in params
                else ""
            )
            raise field_error(f"items[{i}].{error.field}", f"{error}{hint}") from None
        target = max(1, math.floor(item.weight * Fraction(scale) * units))
        return replace(base, **{measure: target})

    def fits(self, scale: float) -> tuple[bool, dict[str, Amount]]:
        """Whether the batch at ``scale`` is granted within the share, and its charges: a
        dry run in a transaction of its own, its groups priced before it locks."""
        try:
            chosen = self.at(scale)
        except InvalidRequest:
            return False, {}
        return self._dry_run(tuple(_with(self.items[i], value) for i, value in chosen.items()))

    def _dry_run(self, items: tuple[ChargeRequest, ...]) -> tuple[bool, dict[str, Amount]]:
        batch = batches.BatchRequest(
            batch_id="plan", items=items, delta=self.delta, principal=self.caller
        )
        driver = self.driver
        batches.warm(driver, batch, self.now_us)
        driver.begin_write()
        try:
            batches.lock(driver, list(self.states), self.caller)
            return batches.dry_run(driver, batch, self.share, self.now_us, self.context)
        finally:
            driver.rollback()


def parameter(
    item: WeightedItem, scale: float, dataset: DatasetState, n: int, grouped: bool
) -> Decimal:
    """``item``'s noise parameter at ``scale``, to 9 significant digits toward more noise
    (see the module's notes); a 400 if it is out of range."""
    name, weight = item.name, float(item.weight)
    increasing = plans.NOISE_PARAMETERS[name]
    if grouped:  # noise relative to sensitivity inversely proportional to the weight
        if name == "sigma":
            value = Decimal(repr(float(item.request.params["sensitivity"]) / (weight * scale)))
        else:
            value = Decimal(repr(weight * scale))
        return _checked(plans.round_digits(value, down=increasing), name)
    target = Fraction(weight * scale)
    measure: ComponentName = "epsilon" if dataset.accounting in ("pure", "approx") else "rho"

    def within(value: Decimal) -> bool:
        try:
            priced = price_alone(item.request, dataset, n, {**item.request.params, name: value})
        except pricing.PricingError:
            return False
        return priced.cost[measure] <= units

    units = target * (10**9 if measure == "epsilon" else 10**12)
    if not within(plans.LOW if increasing else plans.HIGH):
        raise field_error("params", "no value of the noise parameter fits its share")
    try:
        return _checked(plans.least_noise(within, increasing), name)
    except plans.NothingFits as error:
        raise field_error("params", str(error)) from None


def _largest(fits: Callable[[float], bool]) -> float | None:
    """The largest scale s > 0 with ``fits(s)``, to a relative 10^-10: doubling (or halving)
    to a bracket, then bisection on the logarithm. None if nothing from 10^-30 fits."""
    low = 1.0
    if fits(low):
        high = 2.0
        while fits(high):
            low, high = high, high * 2
            if high > 1e30:
                return low
    else:
        high = low
        while not fits(low):
            high, low = low, low / 2
            if low < 1e-30:
                return None
    while high - low > low * 1e-10:
        middle = math.sqrt(low * high)
        if fits(middle):
            low = middle
        else:
            high = middle
    # an edge that is itself a 9-digit number (0.1 exactly) is reached, not approached
    snapped = float(plans.round_digits(Decimal(repr(low)), down=False))
    return snapped if snapped <= high and fits(snapped) else low


def _partition_count(driver: Driver, request: ChargeRequest) -> int:
    """|P| of ``request``: its keys, or the partitions ``"*"`` resolves to now."""
    if request.partitions != "*":
        return len(request.partitions)
    return max(1, int(driver.row(_PARTITION_COUNT, {"name": request.dataset}).count))


_PARTITION_COUNT = statement(
    select(func.count(Partition.id).label("count")).where(
        Partition.dataset_id
        == select(Dataset.id).where(Dataset.name == bindparam("name")).scalar_subquery()
    )
)


def _checked(value: Decimal, name: str) -> Decimal:
    if not plans.LOW <= value <= plans.HIGH:
        raise field_error(f"params.{name}", f"{name} {value} is out of range")
    return value


def _with(item: WeightedItem, value: Decimal) -> ChargeRequest:
    params: Mapping[str, Any] = {**item.request.params, item.name: value}
    return replace(item.request, params=params)
