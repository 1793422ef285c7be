"""What every dashboard page shares: how it is rendered, and how it writes numbers,
moments and limits (one format on every page, docs/dashboard.md)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from flask import render_template

from accountant.dashboard.session import csrf_token
from accountant.services.api_keys import Principal


def page(template: str, who: Principal | None, **context: Any) -> str:
    """A page for ``who`` (None: signed out), with the session's CSRF token for its forms."""
    return render_template(template, who=who, csrf=csrf_token(), **context)


def name(field: str) -> str:
    """A field of an amount as the pages name it."""
    return _NAMES.get(field, field)


_NAMES = {"mu2": "mu²"}


def figure(value: Decimal | float) -> str:
    """Every number the dashboard shows, in one format: 6 significant digits, written out
    from 0.001 to 10^9 (0.25, 1500), else as a power of ten (3e-7, 1e-6, 2.5e12)."""
    number = float(value)
    if number == 0:
        return "0"
    if 1e-3 <= abs(number) < 1e9:
        text = f"{number:.6g}"
        return text if "e" not in text else f"{number:.0f}"
    mantissa, exponent = f"{number:.5e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def when(iso: str) -> str:
    """Every moment the dashboard shows, in one format: 2026-11-24 20:36:40 UTC."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S UTC")


def limits(stated: Any) -> str:
    """Limits as a limit change records them: a mapping of amounts (a consumer's with whether
    it is granted), a list of windows, or none."""
    if stated is None:
        return "none"
    if isinstance(stated, list):
        return "; ".join(limits(item) for item in stated) or "none"
    if not isinstance(stated, dict):
        return str(stated)
    terms = []
    for field, value in stated.items():
        if field == "granted":
            terms.append("granted" if value else "not granted")
        elif value is None or isinstance(value, dict | list):
            terms.append(f"{field} {limits(value)}")
        elif field == "mu":  # the measure is mu^2: a gdp page shows no mu
            terms.append(f"{name('mu2')} {figure(Decimal(value) ** 2)}")
        else:
            amount = field in ("epsilon", "delta", "rho", "rdp", "order")
            terms.append(f"{field} {figure(Decimal(value)) if amount else value}")
    return ", ".join(terms)
