"""The advanced-composition filter of approx datasets (Whitehouse, Ramdas, Rogers and Wu 2023).

Theorem (Whitehouse, Ramdas, Rogers and Wu 2023, "Fully-Adaptive Composition in
Differential Privacy", ICML, the advanced composition filter). Let the n-th release be
(epsilon_n, delta_n)-DP given the outputs before it, where the mechanism and its
parameters may be chosen from those outputs. Fix epsilon > 0 and delta = delta' + delta''
with delta' > 0 and delta'' >= 0, and stop before release n + 1 as soon as

    epsilon < sqrt(2 ln(1/delta') sum_{m <= n+1} epsilon_m^2) + (1/2) sum_{m <= n+1} epsilon_m^2
    or delta'' < sum_{m <= n+1} delta_m.

Then the whole interaction, stopped so, is (epsilon, delta)-DP.

With V = sum epsilon_m^2 and L = ln(1/delta') a release is admitted while
sqrt(2 L V) + V / 2 <= epsilon. The left side increases with V and equals epsilon at
V* = 2 (sqrt(L + epsilon) - sqrt(L))^2 (the positive root of s^2 / 2 + sqrt(2L) s = epsilon
is s = sqrt(2L + 2 epsilon) - sqrt(2L)), so the first condition is exactly

    rho = sum epsilon_m^2 / 2 <= rho* = (sqrt(L + epsilon) - sqrt(L))^2,

the largest rho with rho + 2 sqrt(rho L) <= epsilon (Bun and Steinke 2016, Proposition 1.3:
the filter is their zCDP conversion of sum epsilon_m^2 / 2). Both rho and the deltas add,
so the service keeps them as the rho and delta components of its usual books: a release
costs rho_n = epsilon_n^2 / 2 (rounded up) and delta_n (rounded up); a budget
(epsilon, delta) is enforced as rho* (rounded down) and delta'' = delta - delta'.
"""

from __future__ import annotations

import decimal
import functools
from decimal import Decimal

from accountant.exact import DELTA, EPSILON, RHO, Limit

_CONTEXT = decimal.Context(prec=60)
#: Subtracted from a limit before it is rounded down, added to a loss before it is rounded
#: up: far above the error of 60-digit arithmetic on these magnitudes (docs/accounting.md).
_GUARD = Decimal("1e-40")


def rho_limit(epsilon: Decimal, delta: Decimal) -> int:
    """Units of rho* = (sqrt(ln(1/delta) + epsilon) - sqrt(ln(1/delta)))^2, the largest rho
    with rho + 2 sqrt(rho ln(1/delta)) <= epsilon, rounded down (Bun and Steinke 2016,
    Proposition 1.3; with delta = delta', the advanced filter's bound on sum epsilon_m^2 / 2)."""
    if not 0 < delta < 1:
        raise ValueError("delta must be between 0 and 1")
    with decimal.localcontext(_CONTEXT):
        log_term = (1 / delta).ln()
        rho = ((log_term + epsilon).sqrt() - log_term.sqrt()) ** 2
        return max(0, RHO.limit_units(max(Decimal(0), rho - _GUARD)))


@functools.lru_cache(maxsize=4096)
def epsilon_of(rho_units: int, composition_delta: int) -> Decimal:
    """The filter's epsilon of rho = sum epsilon_m^2 / 2 at delta' (both in units):
    rho + 2 sqrt(rho ln(1/delta')) = sqrt(2 ln(1/delta') V) + V / 2 with V = 2 rho, rounded up.
    It is the least epsilon whose filter would still have admitted every release so far."""
    if rho_units == 0:
        return Decimal(0)
    with decimal.localcontext(_CONTEXT):
        rho = RHO.to_decimal(rho_units)
        log_term = (1 / DELTA.to_decimal(composition_delta)).ln()
        epsilon = rho + 2 * (rho * log_term).sqrt()
        return EPSILON.to_decimal(EPSILON.cost_units(epsilon + _GUARD))


def limit(epsilon: Decimal | None, delta: Decimal | None, composition_delta: int) -> Limit:
    """The enforced limit of a budget (epsilon, delta) stated on an advanced dataset:
    rho* at delta' and delta'' = delta - delta' on the releases' deltas. ``epsilon`` is kept
    as stated (the filter enforces rho); a component the budget omits is not limited."""
    share = DELTA.to_decimal(composition_delta)
    delta_limit = None
    if delta is not None:
        delta_limit = DELTA.limit_units(delta) - composition_delta
        if delta_limit < 0:
            raise ValueError(
                f"delta {delta} is below the dataset's composition_delta {share}, the share "
                "of delta that the advanced filter keeps for itself; state a delta of at "
                f"least {share}, or omit delta"
            )
    return Limit(
        epsilon=None if epsilon is None else EPSILON.limit_units(epsilon),
        delta=delta_limit,
        rho=None if epsilon is None else rho_limit(epsilon, share),
    )


def stated_delta(limit_delta: int | None, composition_delta: int) -> int | None:
    """The delta a budget states, from its enforced delta'' (``limit``'s inverse)."""
    return None if limit_delta is None else limit_delta + composition_delta


def default_share(delta: int) -> int:
    """delta' when the creator states none: half of the dataset's delta (in units), so that
    releases with delta > 0 (Gaussians) keep the other half."""
    return delta // 2
