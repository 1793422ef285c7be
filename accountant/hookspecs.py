"""The plugin contract: every hook a plugin may implement, documented in one place.

Plugins are found through the ``accountant`` entry-point group (the built-ins
in ``plugins/`` too) and implement hooks with ``from accountant import hookimpl``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from accountant.alerts import AlertSettings, BudgetAlert
    from accountant.mechanism import Mechanism

PROJECT = "accountant"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def accountant_register_mechanisms() -> list[Mechanism]:  # type: ignore[empty-body]  # a specification, no body
    """Return the mechanisms this plugin provides.

    Called once, when the plugin manager is built (at service start and by
    the command line). Not first-result: every plugin's list is collected.
    Each item must be an ``accountant.mechanism.Mechanism``; the registry
    checks it (unique name, valid JSON Schemas, a callable cost, a callable
    run or none for an accounting-only mechanism, known accounting modes)
    and refuses the plugin's mechanisms that fail, logging why, without
    stopping the service.
    """


@hookspec
def accountant_budget_alert(alert: BudgetAlert, alerting: AlertSettings) -> None:
    """React to a budget scope crossing a utilisation threshold.

    Called after a granted charge is committed, once for each scope (the
    dataset's lifetime, a partition, the consumer's quota, a window) whose
    utilisation went from below a configured threshold (``alerting.thresholds``,
    default 50, 80 and 100 percent) to at or above it. ``alerting`` holds the
    alert settings (thresholds, webhook URL, timeout and secret file) and
    nothing else of the service's configuration. Charges on a dataset are
    serialised, so each crossing is reported by exactly one charge. Not
    first-result: every plugin is called. Return nothing; an exception is
    logged and never fails the charge. Implementations must not block: do
    network work on a thread of your own (as the built-in webhook plugin does).
    """
