"""Pricing a release and checking it against every scope: pure functions shared by
preview and charge. A denial is a value here; the HTTP edge turns it into 409/429."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from accountant.accounting.loss import LossRule
from accountant.accounting.modes import Mode, StatedCost, UnsupportedCost, renyi_of_pure
from accountant.exact import Amount, sqrt_up
from accountant.mechanism import Cost, Mechanism, PrivacyContext


class PricingError(ValueError):
    """The request cannot be priced on this dataset; the message says why and what to do."""

    def __init__(self, message: str, field: str = "params") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Priced:
    """A priced release: per-release cost c, multiplicity m, and the parameters to run with."""

    cost: Amount
    multiplicity: int
    run_params: Mapping[str, Any]


def record_factor(*, rule: LossRule, max_records: int | None, release: str, n: int) -> int:
    """How many times one person's records can count, for a record-level statement.

    DESIGN.md, Sensitivity: r for a parallel release, r * min(k, |P|) for a
    joint one (with unbounded k, a person still appears in at most |P| of
    the charged partitions).

    Args:
        rule: the dataset's loss rule (its unit and k).
        max_records: r, the dataset's max_records_per_user (None: not stated).
        release: ``joint`` or ``parallel``.
        n: |P|, the number of charged partitions.
    """
    if rule.privacy_unit != "user":
        raise PricingError(
            "sensitivity_unit 'record' applies only to datasets whose privacy "
            "unit is user; state the sensitivity at the dataset's unit",
            "params.sensitivity_unit",
        )
    if max_records is None:
        raise PricingError(
            "sensitivity_unit 'record' needs the dataset's max_records_per_user; "
            "set it or state a user-level sensitivity",
            "params.sensitivity_unit",
        )
    if release == "parallel":
        return max_records
    k = rule.max_partitions_per_user
    return max_records * (n if k is None else min(k, n))


def price(
    *,
    mechanism: Mechanism,
    params: Mapping[str, Any],
    sensitivity_unit: str | None,
    mode: Mode,
    rule: LossRule,
    max_records: int | None,
    release: str,
    n: int,
) -> Priced:
    """Call the mechanism's cost declaration and turn it into an exact amount.

    Args:
        mechanism: the mechanism that runs the release.
        params: its parameters, as sent.
        sensitivity_unit: ``record`` for a record-level sensitivity, scaled by
            ``record_factor`` (None: the dataset's unit).
        mode: the dataset's mode.
        rule: the dataset's loss rule.
        max_records: r, the dataset's max_records_per_user (None: not stated).
        release: ``joint`` or ``parallel``.
        n: |P|, the number of charged partitions.

    Raises:
        PricingError: the release cannot be priced on this dataset.
    """
    if mode.name not in mechanism.accounting:
        raise PricingError(
            f"mechanism {mechanism.name!r} supports accounting "
            f"{list(mechanism.accounting)}, not {mode.name!r}",
            "mechanism",
        )
    if sensitivity_unit is not None and not mechanism.runs:
        raise PricingError(
            f"mechanism {mechanism.name!r} is accounting-only: its job adds the noise for the "
            "sensitivity it states, so state it at the dataset's unit (the accountant scales a "
            "record-level sensitivity only for the mechanisms it runs)",
            "params.sensitivity_unit",
        )
    factor, run_params = _scaled(
        mechanism=mechanism,
        params=params,
        sensitivity_unit=sensitivity_unit,
        rule=rule,
        max_records=max_records,
        release=release,
        n=n,
    )
    try:
        declared = mechanism.cost(
            run_params, PrivacyContext(rule.privacy_unit, mode.name, mode.order)
        )
    except (ValueError, ArithmeticError, KeyError, TypeError) as error:
        raise PricingError(
            f"mechanism {mechanism.name!r} refused these parameters: {error}"
        ) from None
    stated = _stated(declared, mechanism.name)
    if factor > 1 and not mechanism.has_sensitivity:
        stated = (
            _compose(stated, factor, mode.order)
            if mechanism.independent_values
            else _group(stated, factor, mechanism.name)
        )
    try:
        cost = mode.amount_of(stated)
    except UnsupportedCost as error:
        raise PricingError(str(error), "mechanism") from None
    if cost == Amount():
        raise PricingError(
            f"mechanism {mechanism.name!r} declared a zero cost; every release must cost something"
        )
    return Priced(cost, rule.multiplicity(release, n), run_params)


def _scaled(
    *,
    mechanism: Mechanism,
    params: Mapping[str, Any],
    sensitivity_unit: str | None,
    rule: LossRule,
    max_records: int | None,
    release: str,
    n: int,
) -> tuple[int, dict[str, Any]]:
    """(the record factor, the parameters the mechanism runs with): a record-level
    sensitivity scaled by the factor (``record_factor``)."""
    factor = (
        1
        if sensitivity_unit is None
        else record_factor(rule=rule, max_records=max_records, release=release, n=n)
    )
    run_params = dict(params)
    if factor > 1 and mechanism.has_sensitivity:
        run_params["sensitivity"] = Decimal(params["sensitivity"]) * factor
    return factor, run_params


def run_params(
    *,
    mechanism: Mechanism,
    params: Mapping[str, Any],
    sensitivity_unit: str | None,
    rule: LossRule,
    max_records: int | None,
    release: str,
    n: int,
) -> dict[str, Any]:
    """The parameters ``mechanism`` runs with for a release on ``n`` partitions (a
    record-level sensitivity scaled), without pricing it: a batch's group is priced by
    composing its items (``plan_pricing``). Arguments as for ``price``.

    Raises:
        PricingError: a record-level sensitivity the dataset cannot scale, or a mechanism
            that scales its cost instead (its group share could not say so).
    """
    factor, scaled = _scaled(
        mechanism=mechanism,
        params=params,
        sensitivity_unit=sensitivity_unit,
        rule=rule,
        max_records=max_records,
        release=release,
        n=n,
    )
    if factor > 1 and not mechanism.has_sensitivity:
        raise PricingError(
            f"mechanism {mechanism.name!r} has no sensitivity to scale for a record-level "
            "statement inside a composed group; state its cost at the dataset's unit",
            "params.sensitivity_unit",
        )
    return scaled


def planned(
    *, cost: Amount, rule: LossRule, release: str, n: int, params: Mapping[str, Any]
) -> Priced:
    """A release whose per-release cost a plan fixed (its share of a batch group's composed
    cost), run with ``params`` (``run_params``)."""
    return Priced(cost, rule.multiplicity(release, n), params)


#: The components of an amount stated in each mode's measure (a hold's ``amount``), and
#: which of them must be there.
MEASURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "pure": (("epsilon", "delta"), ("epsilon",)),  # delta 0 only
    "approx": (("epsilon", "delta"), ("epsilon",)),
    "zcdp": (("rho",), ("rho",)),
    "rdp": (("rdp",), ("rdp",)),
    "gdp": (("mu",), ("mu",)),
}


def stated(
    *,
    amount: Mapping[str, Any],
    mode: Mode,
    rule: LossRule,
    release: str,
    n: int,
    field: str = "amount",
    zero_ok: bool = False,
) -> Priced:
    """A per-release cost stated in the dataset's measure (a hold's ``amount``), as an
    exact amount, every component rounded up like a declared cost.

    Args:
        amount: the stated components (``epsilon`` and ``delta`` on pure and approx,
            ``rho`` on zcdp, ``rdp`` at the dataset's order on rdp, ``mu`` on gdp).
        mode: the dataset's mode.
        rule: the dataset's loss rule.
        release: ``joint`` or ``parallel``.
        n: |P|, the number of charged partitions.
        field: the request field that states it (``amount``, or a settle's ``used``).
        zero_ok: whether nothing at all may be stated (a settle's ``used``).

    Raises:
        PricingError: a component the mode does not measure, or a missing or zero one.
    """
    allowed, required = MEASURES[mode.name]
    for name in amount:
        if name not in allowed:
            raise PricingError(
                f"a {mode.name} dataset measures amounts in {', '.join(allowed)}; "
                f"{name} is not one of them",
                f"{field}.{name}",
            )
    for name in required:
        if name not in amount:
            raise PricingError(f"state {name}, the {mode.name} dataset's measure", field)
    values = {name: Fraction(value) for name, value in amount.items()}
    if mode.name == "pure" and values.get("delta", 0) != 0:
        raise PricingError("a pure dataset's amounts have delta 0", f"{field}.delta")
    cost = mode.amount_of(
        StatedCost(
            epsilon=values.get("epsilon", Fraction(0)),
            delta=values.get("delta", Fraction(0)),
            rho=values.get("rho"),
            rdp=values.get("rdp"),
            mu=values.get("mu"),
        )
    )
    if cost == Amount() and not zero_ok:
        raise PricingError("a hold must reserve something: state a positive amount", field)
    return Priced(cost, rule.multiplicity(release, n), {})


def _stated(declared: object, name: str) -> StatedCost:
    if not isinstance(declared, Cost):
        raise PricingError(f"mechanism {name!r} did not declare a Cost")
    try:
        values = [
            None if v is None else Fraction(v)
            for v in (declared.epsilon, declared.delta, declared.rho, declared.rdp, declared.mu)
        ]
    except (ValueError, TypeError, OverflowError):
        raise PricingError(
            f"mechanism {name!r} declared a cost that is not a finite number"
        ) from None
    epsilon, delta, rho, rdp, mu = values
    if (
        epsilon is None
        or delta is None
        or epsilon < 0
        or delta < 0
        or delta >= 1
        or any(v is not None and v < 0 for v in (rho, rdp, mu))
    ):
        raise PricingError(f"mechanism {name!r} declared an invalid cost {declared}")
    return StatedCost(epsilon=epsilon, delta=delta, rho=rho, rdp=rdp, mu=mu)


def _group(stated: StatedCost, factor: int, name: str) -> StatedCost:
    """Group privacy for a mechanism with no sensitivity: epsilon * f, rho * f^2 and mu * f
    (Dwork and Roth 2014, Theorem 2.2; Bun and Steinke 2016, Proposition 1.9; Dong, Roth
    and Su 2022, Theorem 2.14). A declared Renyi divergence is dropped: an rdp dataset then
    charges the scaled rho or the scaled epsilon's bound."""
    if stated.delta > 0:
        raise PricingError(
            f"mechanism {name!r} has delta > 0 and no sensitivity parameter, "
            "so it cannot be scaled to record-level contributions"
        )
    rho = None if stated.rho is None else stated.rho * factor * factor
    mu = None if stated.mu is None else stated.mu * factor
    return StatedCost(epsilon=stated.epsilon * factor, delta=Fraction(0), rho=rho, mu=mu)


def _compose(stated: StatedCost, factor: int, order: Decimal | None) -> StatedCost:
    """A person's f values randomised independently, each at the stated cost: f-fold basic
    composition, epsilon * f and delta * f (Dwork and Roth 2014, Theorem 3.16) and rho * f
    (Bun and Steinke 2016, Lemma 2.3); an epsilon-DP value without rho is epsilon^2/2-zCDP,
    so its f values cost f epsilon^2 / 2. Renyi divergences at one order add (Mironov 2017,
    Proposition 1), so f values cost f times the value's (or, without one, f times the
    epsilon-DP bound of one value); mu^2 adds, so mu * sqrt(f), rounded up."""
    rho = stated.epsilon**2 / 2 if stated.rho is None and stated.delta == 0 else stated.rho
    rdp = stated.rdp
    if rdp is None and stated.rho is None and stated.delta == 0 and order is not None:
        rdp = Fraction(renyi_of_pure(stated.epsilon, order))
    mu = None if stated.mu is None else sqrt_up(stated.mu**2 * factor)
    return StatedCost(
        epsilon=stated.epsilon * factor,
        delta=stated.delta * factor,
        rho=None if rho is None else rho * factor,
        rdp=None if rdp is None else rdp * factor,
        mu=mu,
    )
