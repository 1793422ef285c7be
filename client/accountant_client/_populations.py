"""Populations (API.md, DESIGN.md): a lifetime budget over several ``user`` datasets of the
same people; the request bodies of their calls, shared by ``Client`` and ``AsyncClient``.

A population's loss is the sum of its member datasets' lifetime losses, and a charge, hold
or batch on a member is granted only if that sum stays within the population's limit
(a refusal is a ``BudgetExhausted`` whose ``scope`` is ``population`` and whose
``population`` names it). The sum bounds what the releases reveal about one person only if
every member identifies the same people by the same person-level id: that is for whoever
creates the population and its datasets to make sure of; the service cannot check it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accountant_client._holds import _plain


def _population_body(
    name: str,
    *,
    accounting: str,
    budget: Mapping[str, Any],
    privacy_unit: str,
    rdp_order: float | str | None,
) -> dict[str, Any]:
    """``POST /v1/populations``'s body; the order only when given (rdp populations), and a
    budget's Decimal figures as JSON numbers."""
    body: dict[str, Any] = {
        "name": name,
        "privacy_unit": privacy_unit,
        "accounting": accounting,
        "budget": _plain(budget),
    }
    if rdp_order is not None:
        body["rdp_order"] = rdp_order
    return body


def _limit_body(budget: Mapping[str, Any], reason: str | None) -> dict[str, Any]:
    """``PATCH /v1/populations/{name}``'s body: the new limit, and why (the ledger records
    it; with approvals on, the service requires it)."""
    body: dict[str, Any] = {"budget": _plain(budget)}
    if reason is not None:
        body["reason"] = reason
    return body
