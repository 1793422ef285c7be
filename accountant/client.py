"""The Python client under its former name, for code that imports ``accountant.client``.

The client is its own distribution, ``privacy-accountant-client`` (``client/`` in this
repository), imported as ``accountant_client``; a service installs that alone
(``pip install ./client``), without the accountant. This module re-exports it where both
are installed.
"""

from __future__ import annotations

try:
    import accountant_client
    from accountant_client import *  # noqa: F403  # every public name, as the client lists them
except ImportError as missing:
    if missing.name != "accountant_client":
        raise  # the client is installed but one of its own imports fails: show that one
    raise ImportError(
        "accountant.client re-exports the client distribution privacy-accountant-client, "
        "which is not installed; install it from the repository with `pip install ./client` "
        "and import it as `accountant_client`",
        name=missing.name,
    ) from None

__all__ = accountant_client.__all__
