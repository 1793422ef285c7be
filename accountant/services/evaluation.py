"""A charge evaluated as it would be now, without its dataset's lock, writing nothing: the
preview, and the scopes of a plan (``services.plans``).

It reads what a charge reads (``charge_reads.read_unlocked``) and decides as a charge
decides (``accounting.decide``), asking whether the caller may read the dataset rather
than charge it.
"""

from __future__ import annotations

from accountant.accounting.charge_inputs import ChargeRequest
from accountant.accounting.decide import Decision, decide
from accountant.driver import Driver
from accountant.services import charge_reads

#: A decision, as the preview and the plan know it.
Evaluation = Decision

__all__ = ["ChargeRequest", "Evaluation", "preview"]


def preview(driver: Driver, request: ChargeRequest, now_us: int) -> Decision:
    """``request`` decided as it would be now, without the lock, writing nothing."""
    driver.begin_read()
    try:
        with driver.pipeline():
            reads = charge_reads.read_unlocked(driver, request, now_us)
            return decide(reads, request, preview=True)
    finally:
        driver.rollback()
