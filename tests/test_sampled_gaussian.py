"""The Poisson-subsampled Gaussian (plugins/_sampled_gaussian.py): its Rényi bound against the
same closed form summed here at 120 digits, against the true divergence by quadrature at
fractional orders, and against dp_accounting (a test-only reference); its PLD epsilon against
dp_accounting at a finer grid, with the float inputs rounded against us."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import dp_accounting
import mpmath
import pytest
from dp_accounting.pld import privacy_loss_distribution
from hypothesis import given, settings
from hypothesis import strategies as st

from accountant_plugins import _sampled_gaussian as sg

#: The DP-SGD point of the reference figures: q 0.01, noise multiplier 1.1, 1000 steps.
Q, SIGMA, STEPS = Fraction(1, 100), Fraction(11, 10), 1000
DIGITS = 120


def _mp(value: Fraction) -> mpmath.mpf:
    return mpmath.mpf(value.numerator) / value.denominator


def closed_form(q: Fraction, sigma: Fraction, alpha: int) -> mpmath.mpf:
    """ln(Σ_k C(α,k) (1-q)^(α-k) q^k exp((k²-k)/(2σ²))) / (α-1) at 120 digits in plain
    mpmath (Mironov, Talwar and Zhang 2019, Section 3.3), written apart from the module."""
    with mpmath.workdps(DIGITS):
        rate, s2 = _mp(q), _mp(sigma) ** 2
        moment = mpmath.fsum(
            mpmath.binomial(alpha, k)
            * (1 - rate) ** (alpha - k)
            * rate**k
            * mpmath.exp(mpmath.mpf(k * k - k) / (2 * s2))
            for k in range(alpha + 1)
        )
        return mpmath.log(moment) / (alpha - 1)


def true_divergence(q: Fraction, sigma: Fraction, order: Fraction, *, forward: bool) -> Any:
    """D_α(μ1 || μ0) (forward) or D_α(μ0 || μ1) for μ0 = N(0, σ²) and
    μ1 = (1-q) N(0, σ²) + q N(1, σ²), from the definition (1/(α-1)) ln ∫ P^α Q^(1-α) by
    mpmath.quad at 40 digits: ∫ μ0(x) r(x)^(±α or 1-α) dx with r = μ1/μ0
    = 1 - q + q exp((2x - 1)/(2σ²))."""
    with mpmath.workdps(40):
        rate, s, a = _mp(q), _mp(sigma), _mp(order)
        power = a if forward else 1 - a

        def integrand(x: Any) -> Any:
            ratio = 1 - rate + rate * mpmath.exp((2 * x - 1) / (2 * s * s))
            return mpmath.npdf(x, 0, s) * ratio**power

        # the forward integrand has a second bump near x = α (the q N(1, σ²) part, tilted)
        points = sorted({-mpmath.inf, -5 * s, mpmath.mpf(0), mpmath.mpf(1), a, a + 5 * s})
        value, error = mpmath.quad(integrand, [*points, 2 * a + 10 * s, mpmath.inf], error=True)
        assert error < value * mpmath.mpf(10) ** -25
        return mpmath.log(value) / (a - 1)


def accountant_rdp(q: Fraction, sigma: Fraction, steps: int, order: float) -> float:
    """dp_accounting's RDP at ``order`` of ``steps`` Poisson-sampled Gaussian steps (its
    ``_compute_log_a_int`` or ``_compute_log_a_frac``, read from ``RdpAccountant.rdp``)."""
    accountant = dp_accounting.rdp.RdpAccountant(orders=[order])
    event = dp_accounting.PoissonSampledDpEvent(
        float(q), dp_accounting.GaussianDpEvent(float(sigma))
    )
    accountant.compose(event, steps)
    return float(accountant.rdp[0])


# --- Rényi DP ------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [2, 3, 8, 32])
def test_integer_orders_against_the_closed_form_and_dp_accounting(order: int) -> None:
    cost = sg.rdp_cost(sampling_rate=Q, noise_multiplier=SIGMA, steps=STEPS, order=Fraction(order))
    with mpmath.workdps(DIGITS):
        reference = STEPS * closed_form(Q, SIGMA, order)
        assert _mp(cost) >= reference
        assert (_mp(cost) - reference) / reference < mpmath.mpf(10) ** -30
    assert float(cost) == pytest.approx(accountant_rdp(Q, SIGMA, STEPS, order), rel=1e-9)


def test_the_documented_figure_at_order_8() -> None:
    """0.5840703355202512249 (an earlier 120-digit computation; dp_accounting 0.58407033552026)."""
    cost = sg.rdp_cost(sampling_rate=Q, noise_multiplier=SIGMA, steps=STEPS, order=Fraction(8))
    with mpmath.workdps(DIGITS):
        assert abs(STEPS * closed_form(Q, SIGMA, 8) - mpmath.mpf("0.5840703355202512249")) < 1e-19
    assert abs(cost - Fraction("0.5840703355202512249")) < Fraction(1, 10**19)


def test_the_quadrature_agrees_with_the_closed_form_at_an_integer_order() -> None:
    """The integral below is trusted at fractional orders because it gives the sum here."""
    with mpmath.workdps(40):
        integral = true_divergence(Q, SIGMA, Fraction(8), forward=True)
        assert abs(integral - closed_form(Q, SIGMA, 8)) < integral * mpmath.mpf(10) ** -25


@pytest.mark.parametrize(
    ("q", "sigma", "order"),
    [
        (Q, SIGMA, Fraction(9, 2)),
        (Q, SIGMA, Fraction(3, 2)),
        (Fraction(1, 5), Fraction(4, 5), Fraction(5, 2)),
        (Fraction(1, 10), Fraction(1), Fraction(101, 100)),
        (Fraction(1, 1000), Fraction(7, 10), Fraction(63, 4)),
    ],
)
def test_fractional_orders_dominate_the_true_divergence_both_ways(
    q: Fraction, sigma: Fraction, order: Fraction
) -> None:
    bound = sg.step_renyi_upper(sampling_rate=q, noise_multiplier=sigma, order=order)
    with mpmath.workdps(40):
        forward = true_divergence(q, sigma, order, forward=True)
        backward = true_divergence(q, sigma, order, forward=False)
        # Mironov, Talwar and Zhang 2019, Section 3: the forward direction is the larger
        assert forward >= backward
        assert _mp(bound) >= max(forward, backward)
    # dp_accounting 0.6.0's _compute_log_a_frac adds |C(α, i)| terms (log-gamma of negative
    # arguments is of the absolute value), so it lies above the true value, and below ours
    theirs = accountant_rdp(q, sigma, 1, float(order))
    assert theirs >= float(forward) * (1 - 1e-9)
    assert bound >= theirs


def test_no_sampling_is_the_plain_gaussian() -> None:
    for order in (Fraction(3, 2), Fraction(2), Fraction(9, 2), Fraction(256)):
        exact = order / (2 * SIGMA**2)
        assert (
            sg.step_renyi_upper(sampling_rate=Fraction(1), noise_multiplier=SIGMA, order=order)
            == exact
        )
    # the sum itself reduces to it: only k = α is left
    for alpha in (2, 8, 100):
        exact = Fraction(alpha) / (2 * SIGMA**2)
        low, high = sg._step_renyi_interval(Fraction(1), SIGMA, alpha, 200)
        assert low <= exact <= high
        assert high - low < exact / 2**190


@settings(max_examples=150, deadline=None)
@given(
    q=st.fractions(
        min_value=Fraction(1, 10**6), max_value=Fraction(999, 1000), max_denominator=10**6
    ),
    sigma=st.fractions(min_value=Fraction(1, 5), max_value=50, max_denominator=1000),
    order=st.fractions(min_value=Fraction(9, 8), max_value=64, max_denominator=8),
)
def test_the_bound_is_never_below_the_closed_form(
    q: Fraction, sigma: Fraction, order: Fraction
) -> None:
    """Fails if the lower end of the interval, or any value rounded down, were returned: the
    interval is about 2^-195 of the value wide, the reference good to 10^-100 of it."""
    alpha = math.ceil(order)
    bound = sg.step_renyi_upper(sampling_rate=q, noise_multiplier=sigma, order=order)
    with mpmath.workdps(DIGITS):
        reference = closed_form(q, sigma, alpha)
        assert _mp(bound) >= reference
        assert (_mp(bound) - reference) / reference < mpmath.mpf(10) ** -30


def test_refusals() -> None:
    for order in (Fraction(1), Fraction(1, 2), Fraction(1025), Fraction(20481, 20)):
        with pytest.raises(ValueError, match="order"):
            sg.step_renyi_upper(sampling_rate=Q, noise_multiplier=SIGMA, order=order)
    assert sg.step_renyi_upper(sampling_rate=Q, noise_multiplier=SIGMA, order=Fraction(1024)) > 0
    for q, sigma in ((Fraction(0), SIGMA), (Fraction(11, 10), SIGMA), (Q, Fraction(0))):
        with pytest.raises(ValueError):
            sg.step_renyi_upper(sampling_rate=q, noise_multiplier=sigma, order=Fraction(2))
    with pytest.raises(ValueError, match="steps"):
        sg.rdp_cost(sampling_rate=Q, noise_multiplier=SIGMA, steps=0, order=Fraction(2))
    for delta in (Fraction(0), Fraction(1)):
        with pytest.raises(ValueError, match="delta"):
            sg.approx_epsilon(sampling_rate=Q, noise_multiplier=SIGMA, steps=1, delta=delta)


# --- approximate DP by the privacy-loss distribution ---------------------------------------


def pld_epsilon(*, interval: float, pessimistic: bool) -> float:
    """dp_accounting's epsilon at the reference point and delta 1e-6, built here."""
    distribution = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=1.1,
        sensitivity=1.0,
        pessimistic_estimate=pessimistic,
        sampling_prob=0.01,
        value_discretization_interval=interval,
        use_connect_dots=pessimistic,  # connect the dots is pessimistic only
    )
    return float(distribution.self_compose(STEPS).get_epsilon_for_delta(1e-6))


def test_approx_epsilon_against_dp_accounting() -> None:
    ours = sg.approx_epsilon(
        sampling_rate=Q, noise_multiplier=SIGMA, steps=STEPS, delta=Fraction(1, 10**6)
    )
    assert abs(float(ours) - pld_epsilon(interval=5e-5, pessimistic=True)) < 1e-3
    assert ours >= Fraction(pld_epsilon(interval=1e-4, pessimistic=False))
    assert abs(float(ours) - 1.752985) < 1e-5  # the earlier figure 1.75298537736406


def test_approx_epsilon_falls_as_the_noise_grows() -> None:
    epsilons = [
        sg.approx_epsilon(
            sampling_rate=Q, noise_multiplier=sigma, steps=100, delta=Fraction(1, 10**6)
        )
        for sigma in (Fraction(11, 10), Fraction(13, 10), Fraction(2))
    ]
    assert epsilons[0] > epsilons[1] > epsilons[2] > 0


def one_step_delta(q: Fraction, sigma: Fraction, epsilon: Any, *, remove: bool) -> Any:
    """The exact δ(ε) of one step, at 40 digits, in one direction: remove is
    ∫ [μ1 - e^ε μ0]_+, add is ∫ [μ0 - e^ε μ1]_+. The loss ln(μ1/μ0) = ln(1 - q + q e^((2x-1)/(2σ²)))
    is increasing in x, so each integral is over a half-line (x > x* for remove, x < x* for
    add) and is a difference of normal tails."""
    with mpmath.workdps(40):
        rate, s, e = _mp(q), _mp(sigma), mpmath.mpf(epsilon)
        if remove:
            cut = s * s * mpmath.log((mpmath.exp(e) - 1 + rate) / rate) + mpmath.mpf(1) / 2
            above = mpmath.ncdf(-cut / s)
            return (1 - rate) * above + rate * mpmath.ncdf((1 - cut) / s) - mpmath.exp(e) * above
        if mpmath.exp(-e) <= 1 - rate:
            return mpmath.mpf(0)
        cut = s * s * mpmath.log((mpmath.exp(-e) - 1 + rate) / rate) + mpmath.mpf(1) / 2
        below = mpmath.ncdf(cut / s)
        return below - mpmath.exp(e) * ((1 - rate) * below + rate * mpmath.ncdf((cut - 1) / s))


@pytest.mark.parametrize(
    ("q", "sigma", "delta"),
    [
        (Fraction(1, 10), Fraction(1), Fraction(1, 10**6)),
        (Fraction(1, 2), Fraction(2), Fraction(1, 100)),
    ],
)
def test_one_step_meets_the_exact_profile_both_ways(
    q: Fraction, sigma: Fraction, delta: Fraction
) -> None:
    """Independent of dp_accounting: at the returned ε the exact δ of either adjacency
    direction is at most δ, and ε is within 1e-6 of the least such."""
    epsilon = sg.approx_epsilon(sampling_rate=q, noise_multiplier=sigma, steps=1, delta=delta)
    for remove in (True, False):
        assert one_step_delta(q, sigma, _mp(epsilon), remove=remove) <= _mp(delta)
    least = _mp(epsilon) - mpmath.mpf(10) ** -6
    assert one_step_delta(q, sigma, least, remove=True) > _mp(delta)


@given(value=st.fractions(min_value=Fraction(1, 10**12), max_value=10**6, max_denominator=10**15))
def test_doubles_on_the_safe_side(value: Fraction) -> None:
    up, down = sg._double_at_least(value), sg._double_at_most(value)
    assert Fraction(math.nextafter(up, -math.inf)) < value <= Fraction(up)
    assert Fraction(down) <= value < Fraction(math.nextafter(down, math.inf))


def test_inputs_reach_dp_accounting_rounded_against_us(monkeypatch: pytest.MonkeyPatch) -> None:
    """q = 1/3 and σ = 1.1 have nearest doubles below and above; δ is chosen with its nearest
    double above. What dp_accounting receives must be at least q, at most σ, at most δ."""
    delta = next(
        Fraction(k, 10**7)
        for k in range(1, 100)
        if Fraction(float(Fraction(k, 10**7))) > Fraction(k, 10**7)
    )
    q = Fraction(1, 3)
    assert Fraction(float(q)) < q and Fraction(float(SIGMA)) > SIGMA
    seen: dict[str, float] = {}
    build = privacy_loss_distribution.from_gaussian_mechanism
    epsilon_of = privacy_loss_distribution.PrivacyLossDistribution.get_epsilon_for_delta

    def spy_build(**kwargs: Any) -> Any:
        seen.update(q=kwargs["sampling_prob"], sigma=kwargs["standard_deviation"])
        return build(**kwargs)

    def spy_epsilon(self: Any, target: float) -> Any:
        seen["delta"] = target
        return epsilon_of(self, target)

    monkeypatch.setattr(privacy_loss_distribution, "from_gaussian_mechanism", spy_build)
    monkeypatch.setattr(
        privacy_loss_distribution.PrivacyLossDistribution, "get_epsilon_for_delta", spy_epsilon
    )
    epsilon = sg.approx_epsilon(sampling_rate=q, noise_multiplier=SIGMA, steps=1, delta=delta)
    assert Fraction(seen["q"]) >= q and Fraction(seen["sigma"]) <= SIGMA
    assert Fraction(seen["delta"]) <= delta
    assert math.nextafter(seen["q"], 0) < q and math.nextafter(seen["sigma"], math.inf) > SIGMA
    assert epsilon > 0
