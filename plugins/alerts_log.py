"""Budget alerts as structured warnings in the service log."""

from __future__ import annotations

import logging

from accountant import hookimpl
from accountant.alerts import AlertSettings, BudgetAlert

log = logging.getLogger("accountant.alerts")


@hookimpl
def accountant_budget_alert(alert: BudgetAlert, alerting: AlertSettings) -> None:
    log.warning("budget threshold crossed", extra={"alert": alert.as_json()})
