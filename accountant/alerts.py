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

from accountant.accounting.checks import ScopeCheck
from accountant.accounting.windows import isoformat
from accountant.config import Settings
from accountant.exact import COMPONENTS, Amount, ComponentName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BudgetAlert:
    """One scope of one dataset that crossed ``threshold`` percent of its limit (a population
    scope names its population; ``dataset`` is the one whose charge crossed it)."""

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
    population: str | None = None

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


def crossings(
    checks: tuple[ScopeCheck, ...],
    names: tuple[ComponentName, ...],
    thresholds: tuple[int, ...],
    *,
    dataset: str,
    consumer: str,
    charge_id: str,
    at: float,
) -> list[BudgetAlert]:
    alerts = []
    for check in checks:
        before = _utilisation(check.spent, check, names)
        after = _utilisation(check.after, check, names)
        for threshold in thresholds:
            if before < threshold / 100 <= after:
                window = (
                    {}
                    if check.window is None
                    else {
                        "period": check.window.name,
                        "start": isoformat(check.window.start),
                        "end": isoformat(check.window.end),
                    }
                )
                alerts.append(
                    BudgetAlert(
                        dataset=dataset,
                        scope=check.scope,
                        threshold=threshold,
                        utilisation=round(after, 6),
                        loss=_amount(check.after, names),
                        limit={
                            n: float(COMPONENTS[n].to_decimal(v))
                            for n in names
                            if (v := check.limit[n]) is not None
                        },
                        charge_id=charge_id,
                        at=isoformat(at),
                        partition=check.partition if check.scope == "partition" else None,
                        consumer=consumer if check.scope == "consumer" else None,
                        window=window,
                        population=check.population,
                    )
                )
    return alerts


@dataclass(frozen=True)
class AlertSettings:
    """What an alert plugin may know of the service's settings, and nothing more: the
    webhook's secret is named by its file (read when an alert is signed), never held."""

    thresholds: tuple[int, ...]
    webhook_url: str | None
    webhook_timeout_ms: int
    webhook_secret_file: str = ""

    @classmethod
    def of(cls, settings: Settings) -> AlertSettings:
        return cls(
            settings.alert_thresholds,
            settings.alert_webhook_url,
            settings.alert_webhook_timeout_ms,
            settings.alert_webhook_secret_file,
        )


class AlertDispatcher:
    """Calls every plugin's ``accountant_budget_alert`` through the plugin manager, one
    plugin at a time, so that one plugin's failure is logged and reaches neither the other
    plugins nor the charge."""

    def __init__(self, pm: pluggy.PluginManager, alerting: AlertSettings) -> None:
        self.alerting = alerting
        hook = pm.hook.accountant_budget_alert
        plugins = [impl.plugin for impl in hook.get_hookimpls()]
        self._callers = [
            (
                pm.get_name(plugin),
                pm.subset_hook_caller(
                    "accountant_budget_alert", [p for p in plugins if p is not plugin]
                ),
            )
            for plugin in plugins
        ]

    def after_grant(
        self, checks: tuple[ScopeCheck, ...], names: tuple[ComponentName, ...], **facts: Any
    ) -> None:
        """Send an alert for each threshold a granted charge crossed."""
        self.fire(crossings(checks, names, self.alerting.thresholds, **facts))

    def fire(self, alerts: list[BudgetAlert]) -> None:
        for alert in alerts:
            for name, caller in self._callers:
                try:
                    caller(alert=alert, alerting=self.alerting)
                except Exception:  # a plugin's bug must never fail a charge
                    log.exception("alert plugin failed", extra={"plugin": name})
