"""Privacy of the Poisson-subsampled Gaussian mechanism (DP-SGD), bounded from above.

One step of DP-SGD includes each record independently with probability q (Poisson
sampling), sums the clipped contributions (L2 norm at most 1 after dividing by the
clipping norm) and adds N(0, σ²) noise to every coordinate, σ being the noise multiplier.
Under add/remove neighbours the privacy of one step is that of the pair of one-dimensional
distributions

    μ0 = N(0, σ²)    and    μ1 = (1 - q) N(0, σ²) + q N(1, σ²),

in both orders (Mironov, Talwar and Zhang 2019, "Rényi Differential Privacy of the Sampled
Gaussian Mechanism", arXiv 1908.10530, Section 3, which also shows that the direction
D_α(μ1 || μ0) is the larger one for α >= 1). Two prices are computed here:

- ``step_renyi_upper``/``rdp_cost``: Rényi DP at an order α, as an exact rational that is
  never below the true value (interval arithmetic, then the upper end);
- ``approx_epsilon``: the ε of T steps at a given δ, by Google's dp_accounting
  pessimistic privacy-loss distribution (Koskela et al. 2020 / Doroshenko et al. 2022,
  "Connect the Dots"), an upper estimate covering both adjacency directions.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Any

from mpmath import libmp

#: Orders above this are refused: the sum has ceil(α) - 1 terms (about 1 ms at order 8,
#: 20 ms at 256, 0.15 s at 1024), and the service uses orders from about 1.5 to 256.
MAX_ORDER = 1024
#: Working precision of the interval arithmetic, in bits. Each term of A_α - 1 is positive
#: and carried to about this relative precision, so the bound exceeds the true value by
#: about 2^-190 of it at most (some ulps per operation, times the number of terms).
PRECISION_BITS = 200
#: dp_accounting's value_discretization_interval (its default). The single-step PLD has one
#: bucket per this much privacy loss over its truncated range; building it dominates the
#: running time, about proportional to 1/interval and little dependent on T: 0.6 to 1 s at
#: q 0.01, σ 1.1, T 1000 or 10000, 2.4 s at σ 0.6 (plus 1 to 2 s to import dp_accounting
#: on the first call). The pessimistic bias in ε measured at q 0.01, σ 1.1, T 1000 is
#: about T * interval² (9e-6 at 1e-4, 9e-4 at 1e-3).
VALUE_DISCRETIZATION_INTERVAL = 1e-4


def _check(sampling_rate: Fraction, noise_multiplier: Fraction) -> None:
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"the sampling rate must lie in (0, 1]; got {sampling_rate}")
    if not noise_multiplier > 0:
        raise ValueError(f"the noise multiplier must be positive; got {noise_multiplier}")


def _integer_order(order: Fraction) -> int:
    """ceil(order), after refusing orders at most 1 or above ``MAX_ORDER``."""
    if not order > 1:
        raise ValueError(f"the Rényi order must exceed 1; got {order}")
    alpha = math.ceil(order)
    if alpha > MAX_ORDER:
        raise ValueError(
            f"Rényi orders above {MAX_ORDER} are refused (got {order}); use an order from "
            "about 1.5 to 256"
        )
    return alpha


Interval = tuple[Any, Any]


def _rational_interval(numerator: int, denominator: int, bits: int) -> Interval:
    """[floor, ceiling] of numerator/denominator at ``bits``, as a raw mpmath interval."""
    return (
        libmp.from_rational(numerator, denominator, bits, libmp.round_floor),
        libmp.from_rational(numerator, denominator, bits, libmp.round_ceiling),
    )


def _magnitude(value: Any) -> int:
    """About log2 of a positive raw mpf (its exponent plus its mantissa's bit count)."""
    _, _, exponent, bit_count = value
    return int(exponent + bit_count)


def _expm1_interval(numerator: int, denominator: int, bits: int) -> Interval:
    """e^c - 1 for the rational c = numerator/denominator > 0, to ``bits`` relative: exp at
    as many more bits as c is below 1, then 1 subtracted with the rounding outward; below
    2^-bits, c <= e^c - 1 <= c + c² (true for 0 < c <= 1)."""
    low, high = _rational_interval(numerator, denominator, bits)
    tiny = -_magnitude(high)
    if tiny > bits:
        square = libmp.mpf_mul(high, high, bits, libmp.round_ceiling)
        return low, libmp.mpf_add(high, square, bits, libmp.round_ceiling)
    wide = bits + max(0, tiny) + 16
    low, high = _rational_interval(numerator, denominator, wide)
    return (
        libmp.mpf_sub(
            libmp.mpf_exp(low, wide, libmp.round_floor), libmp.fone, bits, libmp.round_floor
        ),
        libmp.mpf_sub(
            libmp.mpf_exp(high, wide, libmp.round_ceiling), libmp.fone, bits, libmp.round_ceiling
        ),
    )


def _log1p_interval(x: Interval, bits: int) -> Interval:
    """ln(1 + x) for an interval of x > 0, to ``bits`` relative: 1 + x rounded outward and
    its ln at as many more bits as x is below 1; below 2^-bits, x - x²/2 <= ln(1 + x) <= x."""
    low, high = x
    tiny = -_magnitude(high)
    if tiny > bits:
        half_square = libmp.mpf_shift(libmp.mpf_mul(low, low, bits, libmp.round_ceiling), -1)
        return libmp.mpf_sub(low, half_square, bits, libmp.round_floor), high
    wide = bits + max(0, tiny) + 16
    return (
        libmp.mpf_pos(_ln_one_plus(low, wide, libmp.round_floor), bits, libmp.round_floor),
        libmp.mpf_pos(_ln_one_plus(high, wide, libmp.round_ceiling), bits, libmp.round_ceiling),
    )


def _ln_one_plus(x: Any, bits: int, rounding: Any) -> Any:
    return libmp.mpf_ln(libmp.mpf_add(libmp.fone, x, bits, rounding), bits, rounding)


def _step_renyi_interval(
    sampling_rate: Fraction, noise_multiplier: Fraction, alpha: int, bits: int
) -> tuple[Fraction, Fraction]:
    """An interval [lower, upper] holding ε(α) = ln(A_α) / (α - 1) for an integer α >= 2,

        A_α = Σ_{k=0}^{α} C(α, k) (1 - q)^(α-k) q^k exp((k² - k) / (2σ²))

    (Mironov, Talwar and Zhang 2019, Section 3.3), in mpmath's interval arithmetic at
    ``bits``: the ``mpmath.iv`` operations, called through ``mpmath.libmp`` with an
    explicit precision, as ``iv.prec`` is process-wide state and the service prices in
    several threads at once.

    The binomial weights sum to 1 and the exponents of k = 0, 1 are 0, so
    A_α - 1 = Σ_{k>=2} C(α, k) (1 - q)^(α-k) q^k (e^((k²-k)/(2σ²)) - 1), a sum of positive
    terms, and ε(α) = ln(1 + (A_α - 1)) / (α - 1): each piece keeps its relative precision
    however close A_α is to 1 (small q, large σ), where ln(A_α) from A_α itself would lose
    all its digits. At q = 1 only k = α remains and ε(α) = α / (2σ²), the plain Gaussian's
    (Mironov 2017, "Rényi Differential Privacy", Table II)."""
    n, d = sampling_rate.numerator, sampling_rate.denominator
    variance = noise_multiplier**2
    rate, keep = _rational_interval(n, d, bits), _rational_interval(d - n, d, bits)
    excess = (libmp.fzero, libmp.fzero)
    for k in range(2, alpha + 1):
        count = (libmp.from_int(math.comb(alpha, k)),) * 2
        weight = libmp.mpi_mul(
            libmp.mpi_mul(count, libmp.mpi_pow_int(rate, k, bits), bits),
            libmp.mpi_pow_int(keep, alpha - k, bits),
            bits,
        )
        growth = _expm1_interval(k * (k - 1) * variance.denominator, 2 * variance.numerator, bits)
        excess = libmp.mpi_add(excess, libmp.mpi_mul(weight, growth, bits), bits)
    divisor = (libmp.from_int(alpha - 1),) * 2
    low, high = libmp.mpi_div(_log1p_interval(excess, bits), divisor, bits)
    return _to_fraction(low), _to_fraction(high)


def _to_fraction(value: Any) -> Fraction:
    numerator, denominator = libmp.to_rational(value)
    return Fraction(numerator, denominator)


@lru_cache(maxsize=4096)
def _integer_order_upper(
    sampling_rate: Fraction, noise_multiplier: Fraction, alpha: int
) -> Fraction:
    """The upper end of ``_step_renyi_interval`` at ``PRECISION_BITS``, exactly."""
    return _step_renyi_interval(sampling_rate, noise_multiplier, alpha, PRECISION_BITS)[1]


def step_renyi_upper(
    *, sampling_rate: Fraction, noise_multiplier: Fraction, order: Fraction
) -> Fraction:
    """An upper bound on the Rényi DP of order ``order`` of one step of the
    Poisson-subsampled Gaussian with add/remove neighbours: sampling rate q in (0, 1], noise
    standard deviation σ = ``noise_multiplier`` times the L2 sensitivity.

    For an integer order α this is ln(A_α) / (α - 1) with A_α the binomial sum of Mironov,
    Talwar and Zhang 2019 (Section 3.3; ``_step_renyi_interval``), which is
    D_α(μ1 || μ0) >= D_α(μ0 || μ1) (their Section 3), computed in interval arithmetic and
    returned as the exact upper end, so it is never below the true value. A fractional
    order is priced at ceil(order): the Rényi divergence does not decrease with its order
    (van Erven and Harremoës 2014, "Rényi Divergence and Kullback-Leibler Divergence",
    Theorem 3). At q = 1 (no sampling) the exact α / (2σ²) is returned for every order
    (Mironov 2017, "Rényi Differential Privacy", Table II).

    Raises ValueError for q outside (0, 1], σ <= 0, an order at most 1 or above
    ``MAX_ORDER``.
    """
    _check(sampling_rate, noise_multiplier)
    alpha = _integer_order(order)
    if sampling_rate == 1:
        return Fraction(order) / (2 * noise_multiplier**2)
    return _integer_order_upper(Fraction(sampling_rate), Fraction(noise_multiplier), alpha)


def rdp_cost(
    *, sampling_rate: Fraction, noise_multiplier: Fraction, steps: int, order: Fraction
) -> Fraction:
    """An upper bound on the Rényi DP at ``order`` of ``steps`` adaptively composed steps:
    ``steps`` times ``step_renyi_upper`` exactly (Rényi DP adds up under composition;
    Mironov 2017, Proposition 1)."""
    _check_steps(steps)
    return steps * step_renyi_upper(
        sampling_rate=sampling_rate, noise_multiplier=noise_multiplier, order=order
    )


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer of at least 1; got {steps!r}")


def _double_at_least(value: Fraction) -> float:
    """The least double >= value (float() rounds to nearest, either way)."""
    result = float(value)
    if Fraction(result) < value:
        result = math.nextafter(result, math.inf)
    return result


def _double_at_most(value: Fraction) -> float:
    """The greatest double <= value."""
    result = float(value)
    if Fraction(result) > value:
        result = math.nextafter(result, -math.inf)
    return result


def approx_epsilon(
    *, sampling_rate: Fraction, noise_multiplier: Fraction, steps: int, delta: Fraction
) -> Fraction:
    """An upper estimate of the ε at which ``steps`` steps of the Poisson-subsampled Gaussian
    are (ε, δ)-DP under add/remove neighbours, from dp_accounting's privacy-loss
    distribution (PLD) with ``pessimistic_estimate=True``.

    What dp_accounting does (``dp_accounting/pld/``, version 0.6.0, read for this):

    - ``privacy_loss_distribution.from_gaussian_mechanism`` with ``sampling_prob`` < 1 and
      the default ``neighboring_relation=ADD_OR_REMOVE_ONE`` builds, through
      ``_pld_for_subsampled_mechanism``, one PMF per ``AdjacencyType``: REMOVE,
      mu_upper = (1 - q) μ(x) + q μ(x + 1) against mu_lower = μ(x), and ADD, mu_upper = μ(x)
      against mu_lower = (1 - q) μ(x) + q μ(x - 1) (``privacy_loss_mechanism.
      GaussianPrivacyLoss``), i.e. D(μ1 || μ0) and D(μ0 || μ1) above.
      ``PrivacyLossDistribution.get_epsilon_for_delta`` returns the max over the two, so
      both directions are covered; at q = 1 the two coincide and one PMF is kept.
    - Pessimistic rounding: losses are rounded up to the discretisation grid (connect the
      dots), the noise mass below the truncation point (``log_mass_truncation_bound``,
      e^-50 per step) is put at infinite loss and the mass above it at the largest kept
      loss (``GaussianPrivacyLoss.privacy_loss_tail``); ``DensePLDPmf.self_compose`` adds
      its truncated tail mass (``tail_mass_truncation``, 1e-15) to the infinite-loss mass.
      The divergence of the composition, hence ε, is thus estimated from above.
    - Not covered: binary64 rounding in its FFT convolutions and sums (relative errors
      near 1e-16 of each mass), which no pessimistic flag accounts for.

    Inputs reach dp_accounting as doubles rounded against us: q up and σ down (ε grows with
    q and falls with σ: the hockey-stick divergence of either direction is non-decreasing
    in q, being a supremum of functions affine in q that are non-decreasing wherever
    positive, and adding noise is post-processing), δ down (ε(δ) is non-increasing). The
    returned double is made an exact Fraction; the service rounds it up to its units.
    dp_accounting is imported here (it takes seconds) and nothing is cached.

    Raises ValueError for q outside (0, 1], σ <= 0, δ outside (0, 1), steps < 1, inputs
    with no double on the safe side, or an infinite ε (δ below the truncated mass, about
    1e-15).
    """
    _check(sampling_rate, noise_multiplier)
    _check_steps(steps)
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1); got {delta}")
    try:
        q, sigma, target = (
            _double_at_least(sampling_rate),
            _double_at_most(noise_multiplier),
            _double_at_most(delta),
        )
    except OverflowError:
        raise ValueError(f"the noise multiplier {noise_multiplier} is too large") from None
    if sigma <= 0 or target <= 0 or not math.isfinite(sigma):
        raise ValueError(
            f"the noise multiplier {noise_multiplier} or delta {delta} is out of the range of "
            "doubles"
        )
    from dp_accounting.pld import privacy_loss_distribution

    distribution = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma,
        sensitivity=1.0,
        pessimistic_estimate=True,
        sampling_prob=q,
        value_discretization_interval=VALUE_DISCRETIZATION_INTERVAL,
    )
    epsilon = float(distribution.self_compose(steps).get_epsilon_for_delta(target))
    if not math.isfinite(epsilon):
        raise ValueError(
            f"no finite epsilon at delta {delta}: below the mass the PLD truncates (about 1e-15)"
        )
    return Fraction(epsilon)
