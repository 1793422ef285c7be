"""A retry's output: regenerated exactly, or refused, never drawn afresh.

A granted charge's output is not stored. A retry with its idempotency key
runs the mechanism again on the charge's keyed random source
(``accountant.noise``), only with the noise secret and the implementation
recorded with the charge, and releases the output only if its SHA-256 is
the first one's. Anything else is a ``ReplayUnavailable`` that releases
nothing: fresh noise for the same request would let a caller average it
away.
"""

from __future__ import annotations

import logging
from typing import Any

from accountant.errors import ReplayUnavailable
from accountant.noise import NoiseSecret
from accountant.services import idempotency, receipts
from accountant.services.evaluation import ChargeRequest

log = logging.getLogger(__name__)


def output_of(
    outcome: idempotency.Outcome, request: ChargeRequest, noise: NoiseSecret
) -> dict[str, Any] | None:
    """The first response's output (None for a denial), regenerated."""
    if outcome.status != 201:
        return None
    stored = outcome.body
    mechanism = request.mechanism
    why = None
    if "output_sha256" not in stored:
        why = "it was recorded before this service kept what a replay needs"
    elif outcome.noise_secret != noise.id:
        why = (
            f"its noise was drawn with noise secret {outcome.noise_secret}, and this host "
            f"has {noise.id}"
        )
    elif outcome.implementation != mechanism.implementation:
        why = (
            f"it was produced by {outcome.implementation}, and this service runs "
            f"{mechanism.implementation}"
        )
    output = None
    if why is None:
        try:
            output = mechanism.run(
                idempotency.decode_params(stored["run_params"]),
                request.data or {},
                noise.source_for(outcome.charge_id),
            )
        except Exception as error:  # a plugin's run may raise anything
            log.error(
                "a replay's mechanism failed",
                extra={"mechanism": mechanism.name, "error": repr(error)[:500]},
            )
            why = f"its mechanism failed when run again ({type(error).__name__})"
        if output is not None and receipts.output_sha256(output) != stored["output_sha256"]:
            log.error(
                "a replay's output differs from the first; its implementation changed "
                "without a new version",
                extra={"implementation": mechanism.implementation, "charge_id": outcome.charge_id},
            )
            why = "regenerated, its output differs from the first one"
    if why is not None:
        raise ReplayUnavailable(
            f"the first response to this request (charge {outcome.charge_id}) cannot be "
            f"given again exactly: {why}. Nothing is released: a retry never draws new noise. "
            "The charge stands (GET /v1/charges/{id}); send a new request with a new "
            "idempotency key for a new release, which is charged again",
            extra={"charge_id": outcome.charge_id},
        )
    return output
