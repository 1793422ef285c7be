"""The plugin contract: every hook a plugin may implement, documented in one place.

Plugins are found through the ``accountant`` entry-point group (the built-ins
in ``plugins/`` too) and implement hooks with ``from accountant import hookimpl``.
"""

from __future__ import annotations

import pluggy

from accountant.mechanism import Mechanism

PROJECT = "accountant"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def accountant_register_mechanisms() -> list[Mechanism]:  # type: ignore[empty-body]
    """Return the mechanisms this plugin provides.

    Called once, when the plugin manager is built (at service start and by
    the command line). Not first-result: every plugin's list is collected.
    Each item must be an ``accountant.mechanism.Mechanism``; the registry
    checks it (unique name, valid JSON Schemas, a callable cost and run,
    known accounting modes) and refuses the plugin's mechanisms that fail,
    logging why, without stopping the service.
    """
