"""The charge: one function, one transaction, from the lock to the commit.

``submit`` is the whole life of a charge:

1. lock the dataset row (``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR
   UPDATE`` on PostgreSQL), sending with it the charge's other reads
   (``evaluation.send_reads``). Every scope of a charge (lifetime,
   partitions, windows, the consumer's quota) belongs to one dataset, so
   this one lock serialises every charge that could touch the same totals,
   across processes and hosts, and no two charges can deadlock;
2. a request whose idempotency key is known gets its first response again,
   with its output regenerated exactly or refused (``replay``);
3. price the release and check every scope (``evaluation.evaluate``);
4. a grant runs the mechanism inside the transaction, then adds the charge
   to every scope; every charge is ledgered and, with a key, its response
   remembered (``charge_writes``, ``charge_responses``). These writes do
   not depend on each other's, and run together (``Driver.together``: one
   statement on PostgreSQL);
5. commit. On PostgreSQL the writes travel with the COMMIT in one round
   trip: a simple charge holds the lock for two round trips.

Charges of one dataset that queue in this process while its transaction
runs join that transaction and share its commit
(``accountant.group_commit``): each is checked against the totals the ones
before it left, as if it had come alone, and none is answered before the
commit.

No charge is committed without its output (a failing mechanism rolls it
back), and no output leaves before its charge is durable. Alerts are sent
after the commit and never fail the charge.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.exc import IntegrityError

from accountant.alerts import AlertDispatcher
from accountant.clock import Clock
from accountant.driver import Driver
from accountant.errors import Forbidden, IdempotencyKeyReused, MechanismFailed, Unauthorized
from accountant.group_commit import GroupCommit
from accountant.key_hashing import KeyHasher
from accountant.noise import NoiseSecret
from accountant.services import charge_responses, charge_writes, idempotency, receipts, replay
from accountant.services.consumers import UNKNOWN_KEY
from accountant.services.evaluation import ChargeRequest, Evaluation, evaluate, send_reads

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


@dataclass(frozen=True)
class Granted:
    evaluation: Evaluation
    response: idempotency.Outcome  # the 201 as remembered, without the output
    output: dict[str, Any]


@dataclass(frozen=True)
class Denied:
    evaluation: Evaluation
    response: idempotency.Outcome  # the problem document


@dataclass(frozen=True)
class Replayed:
    response: idempotency.Outcome  # the first response
    output: dict[str, Any] | None  # its output regenerated, for a grant


Submitted = Granted | Denied | Replayed


def submit(connection: Driver, request: ChargeRequest, context: ChargeContext) -> Submitted:
    """Charge ``request`` once, or give its first response again; see the module's notes."""
    for attempt in (1, 2):
        try:
            done = context.group.run(
                request.dataset,
                connection,
                lambda driver: _in_transaction(driver, request, context),
            )
            break
        except IntegrityError:
            # PostgreSQL only: a duplicate with the same key on another dataset committed
            # between our read and our insert; everything rolled back, so read it again.
            if request.key is None or attempt == 2:
                raise
    if isinstance(done, idempotency.Outcome):  # outside the lock; no new alerts
        return Replayed(done, replay.output_of(done, request, context.noise))
    if isinstance(done, Granted):  # after the commit, never failing the charge
        context.signer_published[0] = True  # committed with the charge
        context.alerts.after_grant(
            done.evaluation.checks,
            done.evaluation.mode.components,
            dataset=request.dataset,
            consumer=request.principal.name,
            charge_id=done.response.charge_id,
            at=context.clock.now_us() / 1e6,
        )
    return done


def _in_transaction(
    connection: Driver, request: ChargeRequest, context: ChargeContext
) -> idempotency.Outcome | Granted | Denied:
    consumer_id = request.principal.consumer_id
    reads = send_reads(connection, request, context.clock.now_us() / 1e6, lock=True)
    # Sent after the lock: a duplicate that waited for it sees the first one's row.
    remembered = (
        None if request.key is None else idempotency.find(connection, consumer_id, request.key)
    )
    dataset = reads.dataset.result()  # no such dataset: a 404 before anything else
    if not dataset.key_valid:  # revoked since it was read, or remembered (``KnownKeys``)
        raise Unauthorized(UNKNOWN_KEY)
    if remembered is not None and (first := remembered.result()) is not None:
        if first.request_hash != request.fingerprint:
            raise IdempotencyKeyReused(
                f"idempotency key {request.key!r} was first used with a different request; "
                "use a new key for a new request"
            )
        return first
    # the grant as it stands under the lock: one revoked since the key was read is gone
    if not (
        request.principal.role == "admin"
        or (request.principal.role == "service" and dataset.granted)
    ):
        raise Forbidden(
            f"{request.principal.name!r} (role {request.principal.role}) may not "
            f"charge dataset {dataset.name!r}; ask an admin for a grant"
        )
    now = context.clock.now_us()
    evaluation = evaluate(connection, reads, request, now / 1e6)
    charge_id = str(uuid.uuid4())
    done: Granted | Denied
    if evaluation.granted:
        tally_ids = charge_writes.open_scopes(connection, evaluation, now)
        output, digest = _run(request, evaluation, charge_id, context.noise)
    with connection.together():  # writes that do not depend on each other's
        head = charge_writes.record(connection, evaluation, request, charge_id, now, context.hasher)
        if evaluation.granted:
            charge_writes.add_to_scopes(connection, evaluation, tally_ids)
            if not context.signer_published[0]:
                receipts.publish(connection, context.signer, now)
            response = charge_responses.granted(
                evaluation, request, charge_id, now, digest, head, context.signer
            )
            done = Granted(evaluation, response, output)
        else:
            done = Denied(evaluation, charge_responses.denied(evaluation, request, charge_id, now))
        if request.key is not None:
            idempotency.remember(connection, consumer_id, request.key, done.response, now)
    return done


def _run(
    request: ChargeRequest, evaluation: Evaluation, charge_id: str, noise: NoiseSecret
) -> tuple[dict[str, Any], str]:
    """Run the mechanism inside the charge's transaction: if it fails, nothing is charged.
    The output and its SHA-256."""
    mechanism = request.mechanism
    try:
        output = mechanism.run(
            evaluation.priced.run_params, request.data or {}, noise.source_for(charge_id)
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
