"""The privacy-budget accountant: prices, charges and ledgers differentially private releases."""

from __future__ import annotations

from accountant.hookspecs import hookimpl

__all__ = ["hookimpl"]
__version__ = "0.1.0"
