"""The charge: one function, one transaction, from the lock to the commit.

``submit`` is the whole life of a charge, and ``_charge`` its unit of work,
which reads top to bottom:

1. its transaction (``group.run``): BEGIN before ``_charge`` runs, COMMIT
   (or ROLLBACK) once it has. Charges of one dataset that queue in this
   process while a transaction runs join it and share its commit: the
   thread leading the transaction runs their units after its own
   (``accountant.group_commit``); each is checked against the totals the
   ones before it left, as if it had come alone, and none is answered before
   the commit;
2. its reads (``charge_reads.read``): the dataset's row, locked, with the
   caller's role, grant and key as they stand; the charged partitions; every
   scope's row. A request whose idempotency key is known, with the same
   body, writes nothing: once the transaction ends it gets its first
   answer's facts again, its output regenerated exactly or refused
   (``idempotency.output_of``); with another body it is refused;
3. its decision (``accounting.decide``), pure: the grant check, the price,
   every scope checked, a grant or a denial;
4. a grant runs the mechanism inside the transaction (``run_mechanism``): if it
   fails, nothing is charged;
5. its writes (``charge_plan.plan``), applied in the transaction
   (``tx.apply``): a grant's new partitions and its scopes; every charge's
   ledger entry and its count for /metrics; with an idempotency key, the
   facts of its answer. On PostgreSQL they travel with the COMMIT in one
   round trip: a simple charge holds the lock for two round trips. Without a
   key, the facts (a grant's signed receipt among them) are built after the
   commit, outside the lock.

A refusal (a 403, a 400, a failed mechanism) raises before the writes: it is
that charge's outcome alone, and the others in its transaction commit. No
charge is committed without its output, and no output leaves before its
charge is durable. Alerts are sent after the commit and never fail the
charge.
"""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accountant.accounting.charge_inputs import ChargeRequest
from accountant.accounting.decide import Decision, decide
from accountant.alerts import AlertDispatcher
from accountant.clock import Clock
from accountant.driver import Driver
from accountant.errors import MechanismFailed
from accountant.group_commit import GroupCommit, Transaction
from accountant.key_hashing import KeyHasher
from accountant.noise import NoiseSecret
from accountant.services import charge_plan, charge_reads, idempotency, receipts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChargeContext:
    """What a charge needs of the running service besides its database connection."""

    noise: NoiseSecret
    signer: Ed25519PrivateKey
    clock: Clock
    alerts: AlertDispatcher
    #: Whether the signer's public key is known to be in the database: until it is, every
    #: grant publishes it in its own transaction, so no receipt leaves with an unknown key.
    signer_published: list[bool]
    #: The queues in which this process's charges of one dataset share a transaction.
    group: GroupCommit
    #: The key-hash secret, which seals each chain head a charge writes (``accountant.seals``).
    hasher: KeyHasher
    #: The datasets read so far that belong to no population: a dataset never joins one
    #: after its creation, so their charges need not lock one (``charge_reads``).
    outside_populations: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Granted:
    decision: Decision
    facts: dict[str, Any]  # what its answer states, but the output
    output: dict[str, Any] | None  # None for a hold, which runs nothing


@dataclass(frozen=True)
class Denied:
    decision: Decision
    facts: dict[str, Any]  # the denial: scope, amounts, when a retry may succeed


@dataclass(frozen=True)
class Replayed:
    facts: dict[str, Any]  # the first answer's
    output: dict[str, Any] | None  # its output regenerated, for a grant


Submitted = Granted | Denied | Replayed


def submit(connection: Driver, request: ChargeRequest, context: ChargeContext) -> Submitted:
    """Charge ``request`` once, or give its first response again; see the module's notes.
    ``connection`` is this request's own, on which its transaction runs if it leads one."""
    # A duplicate key (PostgreSQL: the same key committed on another dataset between this
    # charge's read and its write) sends it back once, to read that charge's response.
    done = context.group.run(
        request.dataset,
        connection,
        functools.partial(_charge, request=request, context=context),
        duplicates=request.key is not None,
    )
    if isinstance(done, idempotency.Remembered):  # outside the lock; no new alerts
        return Replayed(done.facts, replayed_output(done, request, context.noise))
    decision, planned, output = done  # committed: its answer is built outside the lock
    if not decision.granted:
        return Denied(decision, planned.facts)
    granted = Granted(decision, planned.facts, output)
    context.signer_published[0] = True  # committed with the charge
    context.alerts.after_grant(  # after the commit, never failing the charge
        decision.checks,
        decision.mode.components,
        dataset=request.dataset,
        consumer=request.principal.name,
        charge_id=granted.facts.get("charge_id") or granted.facts["hold_id"],
        at=context.clock.now_us() / 1e6,
    )
    return granted


def replayed_output(
    first: idempotency.Remembered, request: ChargeRequest, noise: NoiseSecret
) -> dict[str, Any] | None:
    """The output of the first answer to ``request``'s key, regenerated (None for a denial
    or a hold)."""
    if not first.granted:
        return None
    return idempotency.output_of(first, request.mechanism_to_run, request.data, noise)


def _charge(
    tx: Transaction, *, request: ChargeRequest, context: ChargeContext
) -> tuple[Decision, charge_plan.Planned, dict[str, Any] | None] | idempotency.Remembered:
    """The charge's unit of work, in its dataset's transaction: read, decide, run, write."""
    reads = charge_reads.read(
        tx.driver, request, context.clock, outside=context.outside_populations
    )
    if isinstance(reads, idempotency.Remembered):  # a known key: nothing to write
        return idempotency.same_request(reads, request.key, request.fingerprint)
    decision = decide(reads, request)
    charge_id = str(uuid.uuid4())
    output, digest = (
        run_mechanism(request, decision, charge_id, context.noise)
        if decision.granted and request.hold is None  # a hold runs nothing
        else (None, None)
    )
    signing = charge_plan.Signing(context.signer, not context.signer_published[0], context.hasher)
    planned = charge_plan.plan(
        decision, request, charge_id=charge_id, output_sha256=digest, signing=signing
    )
    tx.apply(planned.writes)
    return decision, planned, output


def run_mechanism(
    request: ChargeRequest, decision: Decision, charge_id: str, noise: NoiseSecret
) -> tuple[dict[str, Any], str]:
    """Run the mechanism inside the charge's transaction: if it fails, nothing is charged.
    The output and its SHA-256."""
    mechanism = request.mechanism_to_run
    try:
        output: dict[str, Any] = mechanism.runner()(
            decision.priced.run_params, request.data or {}, noise.source_for(charge_id)
        )
        return output, receipts.output_sha256(output)
    except Exception as error:  # a plugin's run may raise anything
        log.error(
            "mechanism failed after its preparation passed; the charge is rolled back",
            extra={
                "mechanism": mechanism.name,
                "implementation": mechanism.implementation,
                "error": repr(error)[:500],
            },
            exc_info=True,
        )
        raise MechanismFailed(
            f"mechanism {mechanism.name!r} failed to run ({type(error).__name__}); nothing was "
            "charged. This is a bug of its plugin, and it has been logged; report it to the "
            f"plugin's authors ({mechanism.implementation})"
        ) from None
