"""Sub-budgets that admit nothing: a positive stated budget whose enforced limit would be 0.

Every limit rounds down to whole units and every positive cost rounds up to at
least one (``accountant.exact``), so a limit of 0 units admits no charge at all.
A stated budget is positive (the schemas ask epsilon > 0), yet it can come to 0:

- ``rdp``: the limit is B(alpha) = epsilon - c(alpha, delta) at the dataset's one
  order, c(alpha, delta) = ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1)
  (Canonne, Kamath and Steinke 2020, Proposition 12); a sub-budget with epsilon
  below c is B < 0, clipped to 0. At (8, 1e-5), order 3.874, c = 3.236, so a
  partition epsilon of 2.4 or a window epsilon of 3.2 would enforce 0.
- ``zcdp`` and ``gdp``: rho* and mu*^2 are positive for every epsilon > 0, but
  below one unit (10^-12) for a small epsilon with a small delta: (10^-6, 10^-18)
  gives rho* < 10^-12 and mu*^2 < 10^-12. A rho stated directly below 10^-12 too.
- ``pure`` and ``approx``: an epsilon below 10^-9, or a delta above 0 but below
  10^-18, rounds to 0 units. With advanced composition, an epsilon whose rho* at the
  dataset's delta' is below 10^-12 (below 7.434e-6 at delta' = 10^-6).

``admitting_limit`` refuses such a budget, naming the least stated value that
admits a charge, instead of storing a zero limit. The services use it for every
sub-budget: partition, windows, consumers' quotas (a dataset's lifetime budget is
its own terms, shown as its limit on every read).
"""

from __future__ import annotations

from decimal import Decimal

from accountant.accounting import advanced
from accountant.accounting.modes import (
    Mode,
    converted_limit,
    least_units,
    limit_of,
)
from accountant.exact import COMPONENTS, DELTA, EPSILON, MAX_EPSILON, RHO, Amount, Limit


class AdmitsNothing(ValueError):
    """A stated budget whose enforced limit would be zero; ``component`` is the stated field
    to raise, and the message gives the least value that admits a charge."""

    def __init__(self, component: str, message: str) -> None:
        super().__init__(message)
        self.component = component


def admitting_limit(mode: Mode, stated: dict[str, Decimal], dataset_delta: Decimal | None) -> Limit:
    """``modes.limit_of``, refusing with ``AdmitsNothing`` a stated positive budget whose
    enforced limit is 0 units in a component the mode enforces."""
    limit = limit_of(mode, stated, dataset_delta)
    if mode.composition_delta is not None:
        # a delta equal to delta' is delta'' = 0: it admits releases without delta
        if stated.get("epsilon") is not None and limit.rho == 0:
            raise AdmitsNothing("epsilon", _advanced_refusal(stated["epsilon"], mode))
        return limit
    if not mode.converts:
        for name in mode.components:
            value = stated.get(name)
            if value is not None and value > 0 and limit[name] == 0:
                least = COMPONENTS[name].to_decimal(1)
                raise AdmitsNothing(
                    name,
                    f"{name} {value:g} is below {least:g}, the least {name} a limit can hold, "
                    f"so it would be enforced as 0 and admit no charge; state at least {least:g}"
                    + (", or 0 to admit only mechanisms without delta" if name == "delta" else ""),
                )
        return limit
    if limit.rho != 0:
        return limit
    if mode.name == "zcdp" and stated.get("rho") is not None:
        raise AdmitsNothing(
            "rho",
            f"rho {stated['rho']:g} is below {RHO.to_decimal(1):g}, the least rho a limit can "
            f"hold, so it would be enforced as 0 and admit no charge; state at least "
            f"{RHO.to_decimal(1):g}",
        )
    delta = stated.get("delta") or dataset_delta
    assert delta is not None  # limit_of converted epsilon at it
    raise AdmitsNothing("epsilon", _refusal(mode, stated["epsilon"], delta))


def _refusal(mode: Mode, epsilon: Decimal, delta: Decimal) -> str:
    at = f"at delta {delta:g}" + (
        f" and this dataset's Renyi order {mode.order:g}" if mode.order else ""
    )
    least = least_epsilon(mode, delta)
    fix = (
        f"state epsilon at least {least:g} (the least that admits a charge {at})"
        if least is not None
        else f"no epsilon up to {MAX_EPSILON:g} admits a charge {at}; state a larger delta"
    )
    if mode.name == "rdp":
        return (
            f"epsilon {epsilon:g} {at} converts to a Renyi divergence limit of 0 (the "
            "conversion of CKS20, Proposition 12, takes more than that at this order), "
            f"so it would admit no charge; {fix}, or use a zcdp dataset, which converts each "
            "budget at its own best order"
        )
    measure = "rho" if mode.name == "zcdp" else "mu^2"
    return (
        f"epsilon {epsilon:g} {at} converts to a {measure} limit below {RHO.to_decimal(1):g}, "
        f"which is enforced as 0 and would admit no charge; {fix}"
        + (", or a larger delta" if least is not None else "")
    )


def _advanced_refusal(epsilon: Decimal, mode: Mode) -> str:
    """Why an epsilon is too small for the advanced filter, and the least that is not."""
    assert mode.composition_delta is not None
    share = DELTA.to_decimal(mode.composition_delta)

    def within(units: int) -> bool:
        return units > 0 and advanced.rho_limit(EPSILON.to_decimal(units), share) > 0

    guess = EPSILON.limit_units(advanced.epsilon_of(1, mode.composition_delta))
    least = EPSILON.to_decimal(least_units(within, guess))
    return (
        f"epsilon {epsilon:g} at this dataset's composition_delta {share:g} converts to a rho "
        f"limit below {RHO.to_decimal(1):g} (the advanced filter's rho*), which is enforced "
        f"as 0 and would admit no charge; state epsilon at least {least:g}"
    )


def least_epsilon(mode: Mode, delta: Decimal) -> Decimal | None:
    """The least epsilon on the 10^-9 grid whose limit at ``delta`` in converting ``mode``
    is at least one unit, or None if none up to MAX_EPSILON is. The answer is decided by
    the conversion itself, so stating it does admit a charge; floating point only
    proposes it: the epsilon that a loss of one unit reports (for rdp the same formula
    inverted, exactly; for zcdp and gdp the same optimisation, within a few units)."""

    def within(units: int) -> bool:
        return units > 0 and converted_limit(mode, EPSILON.to_decimal(units), delta) > 0

    top = EPSILON.limit_units(MAX_EPSILON)
    if not within(top):
        return None
    delta_units = DELTA.limit_units(delta)
    one = 2 if mode.name == "gdp" else 1  # mu_limit keeps one unit below its bisection
    guess = (
        EPSILON.limit_units(mode.report(Amount(rho=one), delta_units)["epsilon"])
        if delta_units > 0
        else None
    )
    return EPSILON.to_decimal(least_units(within, guess))
