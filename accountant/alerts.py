"""Budget alerts: which scopes a granted charge pushed across a utilisation threshold.

A crossing is judged on the loss before and after the charge, as the charge
transaction computed them under the dataset lock, so each crossing belongs
to exactly one charge and needs no state of its own. Alerts are dispatched
after the commit; a plugin's failure is logged and never reaches the caller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pluggy

from accountant.accounting.pricing import ScopeCheck
from accountant.accounting.windows import isoformat
from accountant.config import Settings
from accountant.exact import COMPONENTS, Amount, ComponentName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BudgetAlert:
    """One scope of one dataset that crossed ``threshold`` percent of its limit."""

    dataset: str
    scope: str
    threshold: int
    utilisation: float
    loss: dict[str, float]
    limit: dict[str, float]
    charge_id: str
    at: str
    partition: str | None = None
    consumer: str | None = None
    window: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v not in (None, {})}


def _utilisation(amount: Amount, check: ScopeCheck, names: tuple[ComponentName, ...]) -> float:
    ratios = []
    for name in names:
        bound = check.limit[name]
        if bound is None:
            continue
        ratios.append(amount[name] / bound if bound > 0 else (1.0 if amount[name] else 0.0))
    return max(ratios, default=0.0)


def _amount(amount: Amount, names: tuple[ComponentName, ...]) -> dict[str, float]:
    return {name: float(COMPONENTS[name].to_decimal(amount[name])) for name in names}


def crossings(checks: tuple[ScopeCheck, ...], names: tuple[ComponentName, ...],
              thresholds: tuple[int, ...], *, dataset: str, consumer: str, charge_id: str,
              at: float) -> list[BudgetAlert]:
    alerts = []
    for check in checks:
        before = _utilisation(check.spent, check, names)
        after = _utilisation(check.after, check, names)
        for threshold in thresholds:
            if before < threshold / 100 <= after:
                window = {} if check.window is None else {
                    "period": check.window.name, "start": isoformat(check.window.start),
                    "end": isoformat(check.window.end)}
                alerts.append(BudgetAlert(
                    dataset=dataset, scope=check.scope, threshold=threshold,
                    utilisation=round(after, 6), loss=_amount(check.after, names),
                    limit={n: float(COMPONENTS[n].to_decimal(v)) for n in names
                           if (v := check.limit[n]) is not None},
                    charge_id=charge_id, at=isoformat(at),
                    partition=check.partition if check.scope == "partition" else None,
                    consumer=consumer if check.scope == "consumer" else None, window=window))
    return alerts


class AlertDispatcher:
    """Calls every ``accountant_budget_alert`` implementation; never raises."""

    def __init__(self, pm: pluggy.PluginManager, settings: Settings) -> None:
        self._hook = pm.hook.accountant_budget_alert
        self._settings = settings

    def fire(self, alerts: list[BudgetAlert]) -> None:
        for alert in alerts:
            for impl in self._hook.get_hookimpls():
                try:
                    impl.function(alert=alert, settings=self._settings)
                except Exception:  # a plugin's bug must never fail a charge
                    log.exception("alert plugin failed", extra={"plugin": impl.plugin_name})
