"""Exact 95% half-widths of the integer noise the built-in mechanisms sample.

For integer noise Y with a symmetric law, the half-width is the smallest
integer w >= 0 with P(|Y| <= w) >= 19/20 (``accountant.mechanism.CONFIDENCE``);
the real-valued mechanisms multiply it by their grid. docs/mechanisms.md,
"Accuracy", derives each formula.

- Discrete Laplace, P(y) = (1 - q)/(1 + q) q^|y| with q = exp(-1/b)
  (Inusah and Kozubowski, "A discrete analogue of the Laplace distribution",
  J. Stat. Plan. Inference 136, 2006): P(|Y| > w) = 2 q^(w+1)/(1 + q), so
  w = ceil(b ln(40/(1 + q))) - 1.
- Discrete Gaussian, P(y) = exp(-y^2/(2 sigma^2))/Z (Canonne, Kamath and
  Steinke, NeurIPS 2020): P(|Y| > w) <= 1/20 exactly when 40 S(w + 1) <=
  Z = 1 + 2 S(1), with S(a) = sum over integers y >= a of exp(-y^2/(2
  sigma^2)). S is summed directly for sigma < 16, and by Euler-Maclaurin
  with eight correction terms and a proven bound on the remainder beyond.

Everything is computed at 50 significant digits (mpmath). A comparison is
decided only when its two sides differ by more than every truncation bound
plus 10^-30 of their size; one that cannot be decided (never seen; its
probability is of that order) takes the wider answer, which still covers
95%, and is reported as not exact.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

import mpmath

from accountant.mechanism import Accuracy

_DIGITS = 50
#: The relative size below which two computed quantities are not told apart.
_MARGIN = Fraction(1, 10**30)
#: Below this sigma the discrete Gaussian's tails are summed term by term.
_DIRECT_BELOW = 16
#: Euler-Maclaurin correction terms (their remainder is below 10^-23 at sigma 16).
_TERMS = 8
#: Phi^-1(0.975), a first guess of the Gaussian half-width in units of sigma.
_Z_975 = 1.959963984540054

Tail = Callable[[int], tuple[mpmath.mpf, mpmath.mpf]]


def _mpf(value: Fraction) -> mpmath.mpf:
    return mpmath.mpf(value.numerator) / value.denominator


def exact_fraction(value: mpmath.mpf) -> Fraction:
    """An mpmath number as the binary rational it is."""
    mantissa, exponent = value.man_exp
    return Fraction(int(mantissa)) * Fraction(2) ** int(exponent)


def up(value: mpmath.mpf) -> Fraction:
    """A rational at least ``value`` computed at the working precision (whose error is far
    below the relative 10^-30 added)."""
    return exact_fraction(value * (1 + _mpf(_MARGIN)))


def down(value: mpmath.mpf) -> Fraction:
    """A rational at most ``value`` computed at the working precision."""
    return exact_fraction(value * (1 - _mpf(_MARGIN)))


def discrete_laplace_half_width(s: int, t: int) -> tuple[int, bool]:
    """(w, exact): the smallest integer w with P(|Y| <= w) >= 95% for P(y) proportional to
    exp(-|y| s/t), from w + 1 >= x = (t/s) ln(40/(1 + q)), q = exp(-s/t)."""
    with mpmath.workdps(_DIGITS):
        rate = mpmath.mpf(s) / t
        x = mpmath.log(40 / (1 + mpmath.exp(-rate))) / rate
        nearest = int(mpmath.nint(x))
        if abs(x - nearest) <= _mpf(_MARGIN) * max(1, x):
            return nearest, False  # w + 1 >= x holds at w = nearest whichever side x is on
        return max(0, int(mpmath.ceil(x)) - 1), True


def discrete_gaussian_half_width(sigma2: Fraction) -> tuple[int, bool]:
    """(w, exact): the smallest integer w with P(|Y| <= w) >= 95% for the discrete Gaussian
    of variance parameter ``sigma2``: the least w with h(w) = Z - 40 S(w + 1) >= 0."""
    with mpmath.workdps(_DIGITS):
        s2 = _mpf(sigma2)
        sigma = mpmath.sqrt(s2)
        tail = _direct_tail(s2, sigma) if sigma < _DIRECT_BELOW else _euler_maclaurin_tail(sigma)
        half, half_error = tail(1)
        total = 1 + 2 * half

        def sign(w: int) -> int:
            """+1 if h(w) > 0 surely, -1 if h(w) < 0 surely, 0 if the bounds cannot tell."""
            s, error = tail(w + 1)
            h = total - 40 * s
            margin = 2 * half_error + 40 * error + _mpf(_MARGIN) * total
            return 1 if h > margin else -1 if h < -margin else 0

        w = max(0, int(mpmath.floor(sigma * _Z_975)))
        while sign(w) <= 0:
            w += 1
        while w > 0 and sign(w - 1) > 0:
            w -= 1
        return w, w == 0 or sign(w - 1) < 0


def _direct_tail(s2: mpmath.mpf, sigma: mpmath.mpf) -> Tail:
    """S(a) summed over a <= y <= n, n about 14 sigma, with the bound f(n + 1)/(1 - r) on the
    rest, r = exp(-(2n + 3)/(2 sigma^2)) bounding every later ratio f(y + 1)/f(y)."""
    n = int(mpmath.ceil(14 * sigma)) + 2
    # f(y + 1) = f(y) a b^y with a = exp(-1/(2 sigma^2)), b = exp(-1/sigma^2): two products a
    # term, each rounded at 50 digits (far inside the 10^-30 margin)
    a, b = mpmath.exp(-1 / (2 * s2)), mpmath.exp(-1 / s2)
    terms, ratio = [mpmath.mpf(1)], a
    for _ in range(n):
        terms.append(terms[-1] * ratio)
        ratio *= b
    suffix = [mpmath.mpf(0)] * (n + 2)
    for y in range(n, -1, -1):
        suffix[y] = suffix[y + 1] + terms[y]
    rest = mpmath.exp(-(mpmath.mpf(n + 1) ** 2) / (2 * s2)) / (
        1 - mpmath.exp(-mpmath.mpf(2 * n + 3) / (2 * s2))
    )

    def tail(a: int) -> tuple[mpmath.mpf, mpmath.mpf]:
        return (suffix[a], rest) if a <= n else (mpmath.mpf(0), rest)  # S(a) <= S(n + 1)

    return tail


def _euler_maclaurin_tail(sigma: mpmath.mpf) -> Tail:
    """S(a) = integral_a^inf f + f(a)/2 - sum_{j<=m} B_2j/(2j)! f^(2j-1)(a) + R with
    f(x) = exp(-x^2/(2 sigma^2)), f^(n)(x) = (-1/sigma)^n He_n(x/sigma) f(x) (He the
    probabilists' Hermite polynomials) and |R| <= |B_2m|/(2m)! integral |f^(2m)|
    <= 2 zeta(2m)/(2 pi)^2m sigma^(1-2m) sqrt(2 pi (2m)!) (Cauchy-Schwarz with
    E He_n(N)^2 = n!)."""
    m = _TERMS
    coefficients = [mpmath.bernoulli(2 * j) / mpmath.factorial(2 * j) for j in range(1, m + 1)]
    remainder = (
        2
        * mpmath.zeta(2 * m)
        / (2 * mpmath.pi) ** (2 * m)
        * sigma ** (1 - 2 * m)
        * mpmath.sqrt(2 * mpmath.pi * mpmath.factorial(2 * m))
    )

    def tail(a: int) -> tuple[mpmath.mpf, mpmath.mpf]:
        u = mpmath.mpf(a) / sigma
        f = mpmath.exp(-(u**2) / 2)
        integral = sigma * mpmath.sqrt(mpmath.pi / 2) * mpmath.erfc(u / mpmath.sqrt(2))
        hermite = [mpmath.mpf(1), u]
        for n in range(1, 2 * m - 1):
            hermite.append(u * hermite[n] - n * hermite[n - 1])
        # - B_2j/(2j)! f^(2j-1)(a) = + B_2j/(2j)! sigma^(1-2j) He_(2j-1)(u) f(a)
        corrections = mpmath.fsum(
            c * sigma ** (1 - 2 * j) * hermite[2 * j - 1]
            for j, c in enumerate(coefficients, start=1)
        )
        return integral + f / 2 + corrections * f, remainder

    return tail


@lru_cache(maxsize=4096)
def discrete_laplace(s: int, t: int, grid: float = 1.0) -> Accuracy:
    """Noise ``grid`` times a discrete Laplace of scale t/s: scale (t/s) g, half-width w g."""
    w, exact = discrete_laplace_half_width(s, t)
    g = Fraction(grid)
    return Accuracy("additive_noise", "discrete_laplace", Fraction(t, s) * g, w * g, exact, grid=g)


@lru_cache(maxsize=4096)
def discrete_gaussian(sigma2: Fraction, grid: float = 1.0) -> Accuracy:
    """Noise ``grid`` times a discrete Gaussian of variance parameter ``sigma2``: scale
    sigma g, half-width w g."""
    w, exact = discrete_gaussian_half_width(sigma2)
    g = Fraction(grid)
    scale = sqrt_fraction(sigma2) * g
    return Accuracy("additive_noise", "discrete_gaussian", scale, w * g, exact, grid=g)


def sqrt_fraction(value: Fraction) -> Fraction:
    """sqrt(``value``) to the working precision, as a rational."""
    with mpmath.workdps(_DIGITS):
        return exact_fraction(mpmath.sqrt(_mpf(value)))


def log_times_up(scale: Fraction, x: int) -> Fraction:
    """A rational at least ``scale`` ln(x), for x >= 1."""
    with mpmath.workdps(_DIGITS):
        return up(_mpf(scale) * mpmath.log(x))
