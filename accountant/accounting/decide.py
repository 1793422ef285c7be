"""A charge decided: every rule of DESIGN.md applied to what its transaction read.

``decide(reads, request)`` is the whole decision, and pure: no I/O, no
clock, no database. From the plain values read under the dataset's lock
(``ChargeReads``: the dataset row with the caller's role and grant, the
charged partitions that exist, each scope's row and, for the top-k rule,
its largest s(p)) it

1. checks that the caller may charge the dataset (``may_charge``, the one
   spelling of that rule; a preview asks ``may_read``);
2. resolves the charged partitions (``"*"``: every partition that exists);
3. prices the release (``pricing.price``) and asks the mechanism whether it
   can run (``prepare``);
4. builds each scope's state as the loss rules read it (``_states``): a
   scope never charged is ``loss.fresh``; for the top-k rule, the k largest
   s(p) inside the charged set are padded with zeros to min(k, |P|), since a
   partition never charged in a scope has s(p) = 0 there;
5. checks every scope in the order of ``checks.SCOPE_ORDER`` (the lifetime,
   the dataset's population, the per-partition limit, the consumer's quota,
   each window), takes the
   first that denies (of several windows, one it could never fit, else the
   one that resets last), and whether the charge could ever fit it
   (``checks.never_fits``).

What to write follows from the ``Decision`` alone (``services.charge_plan``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from accountant.accounting import checks as rules
from accountant.accounting import holds, pricing
from accountant.accounting.charge_inputs import ChargeReads, ChargeRequest, Column, DatasetState
from accountant.accounting.holds import HoldState
from accountant.accounting.loss import (
    PARTS,
    LossRule,
    ScopeKey,
    ScopeState,
    Top,
    charged,
    fresh,
)
from accountant.accounting.modes import Mode
from accountant.accounting.windows import Window, isoformat
from accountant.errors import Forbidden, field_error
from accountant.exact import Amount, ComponentName
from accountant.mechanism import Mechanism, UnusableParameters


def may_charge(role: str | None, granted: bool) -> bool:
    """Whether a consumer of ``role`` may charge a dataset (``granted``: it holds a grant on
    it): an admin any, a service the ones granted to it, an auditor none."""
    return role == "admin" or (role == "service" and granted)


def may_read(role: str | None, granted: bool) -> bool:
    """Whether a consumer of ``role`` may read a dataset and preview its charges: an admin or
    an auditor any, a service the ones granted to it."""
    return role in ("admin", "auditor") or granted


@dataclass(frozen=True)
class Scope:
    """One scope a charge touches: its key, its row's id (None: charged for the first
    time) and its state before the charge."""

    key: ScopeKey
    id: int | None
    state: ScopeState


@dataclass(frozen=True, kw_only=True)
class ScopeChecker:
    """Every scope a charge touches, as read under the lock, ready to check a cost."""

    dataset: DatasetState
    rule: LossRule
    names: tuple[ComponentName, ...]
    consumer_id: int
    states: Mapping[ScopeKey, ScopeState]
    windows: tuple[Window, ...]
    keys: list[str]
    release: str
    spends: Mapping[str, Amount]  # the charged partitions' s(p), with a partition limit

    def checks(self, cost: Amount, m: int) -> list[rules.ScopeCheck]:
        """Each scope's loss before and after a charge of per-release ``cost`` and
        multiplicity ``m`` (n identical charges are one of cost x n)."""
        dataset, names = self.dataset, self.names
        check = partial(
            rules.scope_check, rule=self.rule, cost=cost, m=m, release=self.release, names=names
        )
        lifetime = self.states[("lifetime", 0, 0, 0)]
        checks = [check(scope="dataset", limit=dataset.limit, state=lifetime)]
        population = dataset.population
        if population is not None:
            checks.append(
                rules.population_check(
                    name=population.name,
                    limit=population.limit,
                    loss=population.loss,
                    lifetime=checks[0],
                )
            )
        if dataset.partition_limit is not None:
            checks.append(
                rules.partition_check(
                    limit=dataset.partition_limit,
                    lifetime=lifetime,
                    cost=cost,
                    names=names,
                    keys=self.keys,
                    spends=self.spends,
                )
            )
        if dataset.quota is not None and dataset.granted:
            state = self.states[("consumer", self.consumer_id, 0, 0)]
            checks.append(check(scope="consumer", limit=dataset.quota, state=state))
        for budget, window in zip(dataset.windows, self.windows, strict=True):
            state = self.states[("window", 0, window.period, window.start)]
            checks.append(check(scope="window", limit=budget.limit, state=state, window=window))
        return checks


@dataclass(frozen=True, kw_only=True)
class Decision:
    """Everything decided about a charge before anything is written."""

    dataset: DatasetState
    mode: Mode
    partitions: list[str]
    priced: pricing.Priced
    denial: rules.Denial | None
    lifetime_after: Amount
    lifetime_now: Amount
    scopes: tuple[Scope, ...]
    partition_ids: Mapping[str, int]
    all_partitions: bool
    never_fits: bool
    checks: tuple[rules.ScopeCheck, ...]
    checker: ScopeChecker
    now_us: int
    #: A hold's expiry (microseconds); None for a charge.
    expires_at: int | None = None
    #: The hold a charge draws on (None: it charges the scopes).
    drawn_from: HoldState | None = None

    @property
    def granted(self) -> bool:
        return self.denial is None

    @property
    def remaining(self) -> Amount:
        loss = self.lifetime_after if self.granted else self.lifetime_now
        return rules.remaining(self.dataset.limit, loss, self.mode.components)

    def refusal(self, cost: Amount, m: int) -> rules.Denial | None:
        """The denial of a charge of per-release ``cost`` and multiplicity ``m`` on the same
        reads (n identical charges are one of cost x n): the first scope it would break, or,
        drawing on a hold, the hold's remainder. None: it would be granted."""
        if self.drawn_from is not None:
            return holds.draw_denial(self.drawn_from, cost, self.now_us, self.mode.components)
        scopes = self.checker
        hopeless = _hopeless(scopes.rule, scopes.names, scopes.release, len(scopes.keys), cost, m)
        return rules.first_denial(scopes.checks(cost, m), cost, scopes.names, hopeless)

    @property
    def population_after(self) -> Amount | None:
        """The loss of the dataset's population after a grant (None: it has none)."""
        return next((c.after for c in self.checks if c.scope == "population"), None)

    @property
    def charged(self) -> Amount:
        """What the running totals grow by: cost x multiplicity, nothing for a draw (its
        hold charged it)."""
        if self.drawn_from is not None:
            return Amount()
        return charged(self.priced.cost, self.priced.multiplicity)


def _hopeless(
    rule: LossRule,
    names: tuple[ComponentName, ...],
    release: str,
    partition_count: int,
    cost: Amount,
    m: int,
) -> Callable[[rules.Denial], bool]:
    """Whether a charge of ``cost`` and ``m`` could never fit a scope that denies it: its
    loss on a fresh scope already exceeds the limit (``checks.never_fits``)."""
    return lambda denial: rules.never_fits(
        denial=denial,
        rule=rule,
        cost=cost,
        m=m,
        release=release,
        names=names,
        partition_count=partition_count,
    )


def decide(reads: ChargeReads, request: ChargeRequest, *, preview: bool = False) -> Decision:
    """Decide ``request`` on what its transaction read: a grant or a denial, with every
    figure the writes and the response need. Raises the refusals: 403 for a caller that may
    not charge the dataset (``preview``: may not read it), 400 for partitions, parameters
    or an input the charge cannot be priced or run with."""
    dataset = reads.dataset
    _check_grant(dataset, request, preview)
    mode, rule = dataset.mode, dataset.rule
    if request.draw is None:
        ids, keys, all_partitions = _resolve(reads.partitions, dataset, request.partitions)
    else:
        keys = holds.drawn_partitions(
            reads.hold,
            hold_id=request.draw,
            dataset_id=dataset.id,
            requested=request.partitions,
            release=request.release,
            consumer_id=request.principal.consumer_id,
            role=dataset.role,
        )
        ids, all_partitions = dict(reads.partitions), False
    priced = _price(request, dataset, len(keys))
    windows = windows_at(dataset, reads.now_us)
    if request.hold is None:
        prepare(request.mechanism_to_run, priced.run_params, request.data)
        expires_at = None
    else:
        expires_at = hold_expiry(dataset, windows, reads.now_us, request.hold.expires_in_s)
    consumer_id = request.principal.consumer_id
    scopes = _states(reads, rule, mode.components, consumer_id, windows, len(keys), all_partitions)
    checker = ScopeChecker(
        dataset=dataset,
        rule=rule,
        names=mode.components,
        consumer_id=consumer_id,
        states={scope.key: scope.state for scope in scopes},
        windows=windows,
        keys=keys,
        release=request.release,
        spends=reads.spends,
    )
    cost, m = priced.cost, priced.multiplicity
    hopeless = _hopeless(rule, mode.components, request.release, len(keys), cost, m)
    drawn_from = reads.hold if request.draw is not None else None
    if drawn_from is not None:
        # the hold charged every scope already: the draw changes none, and fits its remainder
        checks = checker.checks(Amount(), 0)
        denial = holds.draw_denial(drawn_from, cost, reads.now_us, mode.components)
    else:
        checks = checker.checks(cost, m)
        denial = rules.first_denial(checks, cost, mode.components, hopeless)
    # a draw's denial names its hold, never a window: waiting for a reset does not apply
    never = denial is not None and hopeless(denial)
    return Decision(
        dataset=dataset,
        mode=mode,
        partitions=keys,
        priced=priced,
        denial=denial,
        lifetime_after=checks[0].after,
        lifetime_now=checks[0].spent,
        scopes=scopes,
        partition_ids=ids,
        all_partitions=all_partitions,
        never_fits=never,
        checks=tuple(checks),
        checker=checker,
        now_us=reads.now_us,
        expires_at=expires_at,
        drawn_from=drawn_from,
    )


def _price(request: ChargeRequest, dataset: DatasetState, n: int) -> pricing.Priced:
    """A charge priced by its mechanism; a hold by its mechanism or its stated amount."""
    try:
        if request.hold is not None and request.hold.amount is not None:
            return pricing.stated(
                amount=request.hold.amount,
                mode=dataset.mode,
                rule=dataset.rule,
                release=request.release,
                n=n,
            )
        assert request.mechanism is not None  # a charge names one, and so does an unstated hold
        share = request.share
        if share is not None and share.cost is not None and share.group is None:
            # a weighted plan's stand-in: its cost at the plan's scale, priced alone otherwise
            return replace(price_alone(request, dataset, n), cost=share.cost)
        if share is not None and share.cost is not None:  # its batch group's share
            if dataset.mode.name not in request.mechanism.accounting:
                raise pricing.PricingError(
                    f"mechanism {request.mechanism.name!r} supports accounting "
                    f"{list(request.mechanism.accounting)}, not {dataset.mode.name!r}",
                    "mechanism",
                )
            return pricing.planned(
                cost=share.cost,
                rule=dataset.rule,
                release=request.release,
                n=n,
                params=item_params(request, dataset, n),
            )
        return price_alone(request, dataset, n)
    except pricing.PricingError as error:
        raise field_error(error.field, str(error)) from None


def price_alone(
    request: ChargeRequest, dataset: DatasetState, n: int, params: Mapping[str, Any] | None = None
) -> pricing.Priced:
    """``request`` priced by its mechanism on ``n`` partitions of ``dataset`` (with
    ``params`` instead of its own, when given), as a charge alone; ``pricing.PricingError``
    if it cannot be."""
    assert request.mechanism is not None
    return pricing.price(
        mechanism=request.mechanism,
        params=request.params if params is None else params,
        sensitivity_unit=request.sensitivity_unit,
        mode=dataset.mode,
        rule=dataset.rule,
        max_records=dataset.max_records_per_user,
        release=request.release,
        n=n,
    )


def item_params(request: ChargeRequest, dataset: DatasetState, n: int) -> dict[str, Any]:
    """The parameters ``request``'s mechanism runs with on ``n`` partitions of ``dataset``
    (``pricing.run_params``), for pricing a batch group; a 400 if it cannot be."""
    assert request.mechanism is not None
    try:
        return pricing.run_params(
            mechanism=request.mechanism,
            params=request.params,
            sensitivity_unit=request.sensitivity_unit,
            rule=dataset.rule,
            max_records=dataset.max_records_per_user,
            release=request.release,
            n=n,
        )
    except pricing.PricingError as error:
        raise field_error(error.field, str(error)) from None


def charged_partitions(reads: ChargeReads, request: ChargeRequest) -> list[str]:
    """The keys ``request`` charges, ``"*"`` resolved on ``reads`` (a 400 if to none)."""
    return _resolve(reads.partitions, reads.dataset, request.partitions)[1]


#: The longest a hold may last: a week.
MAX_HOLD_S = 7 * 24 * 3600


def hold_expiry(
    dataset: DatasetState, windows: tuple[Window, ...], now_us: int, expires_in_s: int
) -> int:
    """When a hold made now for ``expires_in_s`` seconds expires (microseconds): at most a
    week ahead, and never after the end of the current window of the dataset's shortest
    window budget, so that a hold cannot carry one window's allowance into the next
    (DESIGN.md). A 400 naming the latest allowed expiry otherwise."""
    if not 1 <= expires_in_s <= MAX_HOLD_S:
        raise field_error("expires_in", f"must be 1 to {MAX_HOLD_S} seconds (7 days)")
    expires_at = now_us + expires_in_s * 1_000_000
    if windows:
        shortest = min(windows, key=lambda window: window.period)
        end_us = shortest.end * 1_000_000
        if expires_at > end_us:
            raise field_error(
                "expires_in",
                f"a hold may not outlast the current {shortest.name} window of dataset "
                f"{dataset.name!r}, which ends at {isoformat(shortest.end)}: the latest "
                f"allowed expiry is {isoformat(shortest.end)}, expires_in "
                f"{(end_us - now_us) // 1_000_000} or less",
            )
    return expires_at


def _check_grant(dataset: DatasetState, request: ChargeRequest, preview: bool) -> None:
    """The caller's role and grant as read with the dataset, never as remembered."""
    name = request.principal.name
    if preview:
        if not may_read(dataset.role, dataset.granted):
            raise Forbidden(
                f"dataset {dataset.name!r} is not granted to {name!r}; ask an admin for a grant"
            )
    elif not may_charge(dataset.role, dataset.granted):
        raise Forbidden(
            f"{name!r} (role {dataset.role}) may not charge dataset {dataset.name!r}; "
            "ask an admin for a grant"
        )


def prepare(
    mechanism: Mechanism, run_params: Mapping[str, Any], data: Mapping[str, Any] | None
) -> None:
    """The mechanism's own check that it can run these parameters on this input: a 400
    naming the field and the usable range, before anything is charged."""
    if mechanism.prepare is None:
        return
    try:
        mechanism.prepare(run_params, data)
    except UnusableParameters as error:
        raise field_error(error.field, str(error)) from None
    except (ValueError, ArithmeticError) as error:
        raise field_error(
            "params", f"mechanism {mechanism.name!r} cannot run with these parameters: {error}"
        ) from None


def _resolve(
    found: Mapping[str, int], dataset: DatasetState, requested: list[str] | str
) -> tuple[dict[str, int], list[str], bool]:
    """(ids of existing charged partitions by key, the charged keys, whether P is "*")."""
    if requested == "*":
        if not found:
            raise field_error(
                "partitions",
                f"'*' resolved to no partition: dataset "
                f"{dataset.name!r} has none yet; declare them with "
                f"POST /v1/datasets/{dataset.name}/partitions or name them",
            )
        return dict(found), list(found), True
    return dict(found), list(requested), False


def windows_at(dataset: DatasetState, now_us: int) -> tuple[Window, ...]:
    """The windows of ``dataset``'s window budgets that contain the moment ``now_us``."""
    return tuple(Window.containing(w.period_seconds, now_us / 1e6) for w in dataset.windows)


def scope_keys(consumer_id: int, windows: tuple[Window, ...]) -> list[ScopeKey]:
    """The scopes a charge touches: the dataset's lifetime, the caller's quota and each
    current window."""
    keys: list[ScopeKey] = [("lifetime", 0, 0, 0), ("consumer", consumer_id, 0, 0)]
    return keys + [("window", 0, w.period, w.start) for w in windows]


def _states(
    reads: ChargeReads,
    rule: LossRule,
    names: tuple[ComponentName, ...],
    consumer_id: int,
    windows: tuple[Window, ...],
    n: int,
    all_partitions: bool,
) -> tuple[Scope, ...]:
    """Every scope the charge may touch (the lifetime, the caller's quota, each window), as
    the loss rules read it before a charge on ``n`` partitions (``all_partitions``: every
    one, ``"*"``)."""
    k = rule.max_partitions_per_user if rule.uses_top_k else None
    scopes = []
    for key in scope_keys(consumer_id, windows):
        row = reads.scopes.get(key)
        if row is None:
            scopes.append(Scope(key, None, fresh(rule, n)))
            continue
        top: dict[Column, Top] = {}
        if k is not None:
            for part in PARTS:
                for name in names:
                    inside = sorted(row.inside.get((part, name), ()), reverse=True)
                    outside = list(row.outside.get((part, name), ()))
                    if all_partitions:  # every partition is charged: the largest are inside
                        inside, outside = outside, []
                    padded = inside[:k] + [0] * (min(k, n) - len(inside[:k]))
                    top[part, name] = Top(tuple(outside), tuple(padded))
        state = ScopeState(
            total=row.total,
            max_all=row.max_spend,
            max_touched=row.max_spend if all_partitions else row.max_touched,
            joint_total=row.joint_total,
            parallel_total=row.parallel_total,
            top=top,
        )
        scopes.append(Scope(key, row.id, state))
    return tuple(scopes)
