"""Seals: keyed digests of what the service itself set, so that ``ledger verify`` tells the
service's writes from edits made directly in the database.

The ledger's hash chain shows any edit of its entries, and each charge and limit change
records the digest of its dataset's terms. But a plain digest can be recomputed by anyone
who can write to the database. A seal cannot: it is HMAC-SHA256 under a key derived from
the key-hash secret (``accountant.key_hashing``), a file on the service's hosts that the
database never holds. The service seals

- each dataset's terms digest (privacy unit, mode, bounds, lifetime, partition and window
  limits), when it creates the dataset and at every limit change;
- each consumer's name, role, grants, quotas and keys (ids, stored hashes, revocations),
  whenever any of them changes;
- each dataset's chain head (the seq and hash of its last entry), in the statement that
  moves it, and only on top of a head it sealed before (``next_head_seal``).

``ledger verify`` on a host with the secret recomputes every seal. A limit edited before a
dataset's first ledger entry, a quota raised, a role escalated, a revoked key restored or a
key moved to another consumer shows as a broken seal; a missing seal is a broken one. An
entry appended in the database, with or without the dataset's head moved to it, lies past
the last head the service sealed (``services.verification``).

Nothing seals rows that exist already without an operator saying so. A change made
through the service reseals only a consumer or dataset whose seal held before it
(``consumer_holds``, ``datasets.terms_hold``): a change to edited rows is refused, and a
key revoked from them leaves their seal broken. A new database is sealed from its first
row on: the process that registers the key-hash secret on a database that holds no
dataset and no key records ``key_hash_secrets.sealed_at``, and every write seals what it
writes. A database from before seals is sealed only by ``accountant seals init``
(``accountant.services.sealing``), which is ledgered; until then ``verify`` reports it
DAMAGED and the service does not start on it (``require_sealed``), so that no write seals
part of it first. Chain heads began to be sealed later
(``heads_sealed_at``): a database sealed before has every head unsealed, the service appends
to them without sealing them, and ``accountant seals init`` seals them as they stand, once.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from sqlalchemy import Connection, func, select, update
from sqlalchemy.orm import Session

from accountant.key_hashing import KeyHasher
from accountant.models import (
    AdminChain,
    ApiKey,
    Consumer,
    Dataset,
    Grant,
    KeyHashSecret,
    Population,
)

Executor = Connection | Session


class NotSealed(RuntimeError):
    """A database with datasets or keys and no record of its seals: one from before seals,
    which ``accountant seals init`` seals, or one whose record was cleared."""


NEVER_SEALED = (
    "this database's datasets and consumers were never sealed (a database from before "
    "seals, or its seals and their record removed in the database): check it with "
    "'accountant ledger verify', then seal it as it stands with 'accountant seals init' "
    "(once, on a host with the key-hash secret)"
)


def cleared(carried: int) -> str:
    """Why a database whose rows carry ``carried`` seals but no record of them is damaged."""
    return (
        f"the record of this database's seals (key_hash_secrets.sealed_at) is empty, yet "
        f"{carried} datasets and consumers carry seals (cleared in the database?); find what "
        "else changed with 'accountant ledger verify' and restore the database from a backup "
        "taken before the edit"
    )


def holds_nothing(executor: Executor) -> bool:
    """Whether the database holds no dataset and no API key, so nothing to seal yet (a
    consumer being created has no key until its first one is issued)."""
    return not (
        executor.execute(select(Dataset.id).limit(1)).first()
        or executor.execute(select(ApiKey.id).limit(1)).first()
    )


def carried(executor: Executor) -> int:
    """How many datasets and consumers carry a seal."""
    datasets = executor.execute(select(func.count(Dataset.terms_seal))).scalar_one()
    consumers = executor.execute(select(func.count(Consumer.seal))).scalar_one()
    return int(datasets) + int(consumers)


def require_sealed(executor: Executor) -> None:
    """Raise ``NotSealed`` unless the database records when its seals began or holds nothing
    to seal. Run before a process writes (``accountant serve``, ``init``, ``keys create``):
    a write seals what it touches, and ``accountant seals init`` refuses a database in which
    anything is sealed, so a write on an unsealed database would leave it unsealable."""
    if executor.execute(select(KeyHashSecret.sealed_at)).scalar() is not None:
        return
    if holds_nothing(executor):
        return
    found = carried(executor)
    raise NotSealed(
        (cleared(found) if found else NEVER_SEALED)
        + "; the service does not start on a database without a record of its seals"
    )


def of_head(hasher: KeyHasher, name: str, seq: int, head: str) -> str:
    """The seal of a dataset's chain head, bound to its name: the seq and hash of its last
    entry (0 and 64 zeros before the first). Its content is ``_canonical({"dataset": name,
    "head": head, "seq": seq})``, written out here because every charge seals its head."""
    content = b'{"dataset":%s,"head":%s,"seq":%d}' % (
        json.dumps(name).encode(),
        json.dumps(head).encode(),
        seq,
    )
    return hasher.seal(content)


def next_head_seal(
    hasher: KeyHasher | None, name: str, old: tuple[int, str, str | None], new: tuple[int, str]
) -> str | None:
    """The seal a chain's head gets when an entry moves it from ``old`` (seq, head, seal) to
    ``new`` (seq, head): the new head's seal if the old seal holds, else the old seal as it
    was. So a head the service did not seal (an entry appended in the database, a database
    from before head seals) stays unsealed through every later append, and ``verify``
    still finds the last head the service sealed; without ``hasher`` (a host without the
    key-hash secret) nothing is sealed either."""
    seq, head, seal = old
    if hasher is None or seal is None:
        return seal
    if not hmac.compare_digest(seal, of_head(hasher, name, seq, head)):
        return seal
    return of_head(hasher, name, *new)


def heads_begun(executor: Executor) -> bool:
    """Whether the database records when its chain heads began to be sealed: a new chain's
    head is sealed from its start then (``of_head``)."""
    return executor.execute(select(KeyHashSecret.heads_sealed_at)).scalar() is not None


def holds_no_chain(executor: Executor) -> bool:
    """Whether the database holds no chain (a dataset's, a population's or the admins'),
    so no chain head to seal yet."""
    return not any(
        executor.execute(select(owner.id).limit(1)).first()
        for owner in (Dataset, Population, AdminChain)
    )


HEADS_NEVER_SEALED = (
    "its chain's head is not sealed, nor is any other: this database was sealed before "
    "chain heads were (migration 0016), so nothing yet tells the service's entries from "
    "entries appended in the database. Check the chains against earlier exports "
    "('accountant ledger verify --against EXPORT') and receipts, then seal every head as it "
    "stands with 'accountant seals init' (once, on a host with the key-hash secret)"
)

HEAD_UNSEALED = (
    "its chain's head has no seal (removed in the database, or the dataset written where "
    "the service never sealed it); find what changed against earlier exports ('accountant "
    "ledger verify --against EXPORT') and restore the database from a backup"
)


def heads_cleared(carried: int) -> str:
    """Why a database whose heads carry seals but that has no record of them is damaged."""
    return (
        "the record of when this database's chain heads began to be sealed "
        f"(key_hash_secrets.heads_sealed_at) is empty, yet {carried} chain heads carry seals "
        "(cleared in the database?); restore the database from a backup taken before the edit"
    )


def head_not_sealed(seq: int) -> str:
    """Why a chain whose head, and no earlier head, is the one sealed is damaged."""
    return (
        f"its chain's head (seq {seq}) is not the one the service sealed, nor is any head of "
        "its chain: the chain cut back, or rewritten, together with its recorded head, in the "
        "database; compare it with earlier exports ('accountant ledger verify --against "
        "EXPORT') and restore the database from a backup"
    )


def appended_after(first: int, last: int) -> str:
    """Why a chain that goes on past the last head the service sealed is damaged."""
    return (
        f"the chain goes on to seq {last} past the last head the service sealed (seq "
        f"{first - 1}): entry seq {first} was appended in the database, not by the service "
        "(forged?), and the service seals a new head only on top of a sealed one, so no head "
        "after it is sealed; restore the database from a backup"
    )


def of_terms(hasher: KeyHasher, name: str, terms_sha256: str) -> str:
    """The seal of a dataset's terms digest (bound to its name, so seals cannot be swapped)."""
    return hasher.seal(_canonical({"dataset": name, "terms_sha256": terms_sha256}))


def seal_consumer(executor: Executor, hasher: KeyHasher, consumer_id: int) -> None:
    """Seal ``consumer_id`` as its rows now stand (call after the session's changes are
    flushed). The consumer row is locked first: a transaction that changed one of its keys
    or grants at the same moment has then committed, and the reads after the lock see its
    change (READ COMMITTED reads each statement afresh), so no seal leaves out another's."""
    # FOR NO KEY UPDATE: it waits for another sealer, not for the key-share lock that
    # inserting a key or grant row takes on its consumer
    executor.execute(
        select(Consumer.id).where(Consumer.id == consumer_id).with_for_update(key_share=True)
    )
    executor.execute(
        update(Consumer)
        .where(Consumer.id == consumer_id)
        .values(seal=of_consumer(executor, hasher, consumer_id))
    )


def consumer_holds(executor: Executor, hasher: KeyHasher, consumer_id: int) -> bool:
    """Whether ``consumer_id``'s seal matches its rows, read under the lock ``seal_consumer``
    takes (call before changing them). A change to a consumer whose seal does not hold must
    not reseal it: the new seal would vouch for whatever was edited in the database."""
    executor.execute(
        select(Consumer.id).where(Consumer.id == consumer_id).with_for_update(key_share=True)
    )
    seal = executor.execute(select(Consumer.seal).where(Consumer.id == consumer_id)).scalar()
    return seal == of_consumer(executor, hasher, consumer_id)


def refusal(subject: str) -> str:
    """Why a change to ``subject``, whose seal does not hold, is refused."""
    return (
        f"the rows of {subject} are not as the service sealed them (edited in the "
        "database?), and changing them now would seal the edit; nothing was changed. Find "
        "the edit with 'accountant ledger verify' and restore the rows from a backup first"
    )


def of_consumer(executor: Executor, hasher: KeyHasher, consumer_id: int) -> str:
    """The seal of a consumer's name, role, grants with their quotas, and keys."""
    name, role = executor.execute(
        select(Consumer.name, Consumer.role).where(Consumer.id == consumer_id)
    ).one()
    grants = executor.execute(
        select(
            Grant.dataset_id,
            Grant.has_quota,
            Grant.quota_epsilon,
            Grant.quota_delta,
            Grant.quota_rho,
        )
        .where(Grant.consumer_id == consumer_id)
        .order_by(Grant.dataset_id)
    ).all()
    keys = executor.execute(
        select(ApiKey.id, ApiKey.key_hash, ApiKey.revoked_at)
        .where(ApiKey.consumer_id == consumer_id)
        .order_by(ApiKey.id)
    ).all()
    content = {
        "consumer": consumer_id,
        "name": name,
        "role": role,
        "grants": [[g[0], bool(g[1]), *map(_int_or_none, g[2:])] for g in grants],
        "keys": [[k[0], k[1], _int_or_none(k[2])] for k in keys],
    }
    return hasher.seal(_canonical(content))


def problem(session: Session, hasher: KeyHasher) -> tuple[str | None, str] | None:
    """Why the seals do not vouch for the database, as (the dataset's name or None, what is
    wrong); None if every dataset and consumer carries its seal and each holds, and the
    database records when its seals began. ``hasher`` must hold the database's secret."""
    registered = session.execute(select(KeyHashSecret.id, KeyHashSecret.sealed_at)).first()
    if registered is not None and registered.id != hasher.id:
        return None, (
            f"the seals cannot be checked: this host's key-hash secret (id {hasher.id}) is not "
            f"this database's (id {registered.id})"
        )
    sealed_at = None if registered is None else registered.sealed_at
    if sealed_at is None and not carried(session):
        return None if holds_nothing(session) else (None, NEVER_SEALED)
    found = broken(session, hasher)
    if found is None and sealed_at is None:
        return None, cleared(carried(session))
    return found


def broken(session: Session, hasher: KeyHasher) -> tuple[str | None, str] | None:
    """The first dataset or consumer whose seal is missing or does not match its rows, as
    (the dataset's name or None, what is wrong); None if every seal holds. ``verify``
    checks each dataset's terms digest against its rows first, so the seal covers its
    limits."""
    for name, terms_sha256, seal in session.execute(
        select(Dataset.name, Dataset.terms_sha256, Dataset.terms_seal).order_by(Dataset.id)
    ).all():
        if seal is None:
            return name, f"it has no seal ({_UNSEALED})"
        if seal != of_terms(hasher, name, terms_sha256):
            return name, (
                "its terms are not the ones the service sealed "
                "(limits, bounds or windows edited in the database?)"
            )
    for consumer_id, name, seal in session.execute(
        select(Consumer.id, Consumer.name, Consumer.seal).order_by(Consumer.id)
    ).all():
        if seal is None:
            return None, f"consumer {name!r} has no seal ({_UNSEALED})"
        if seal != of_consumer(session, hasher, consumer_id):
            return None, (
                f"consumer {name!r}: its role, grants, quotas or keys are not the ones the "
                "service sealed (edited in the database?)"
            )
    return None


_UNSEALED = "its seal removed in the database, or rows written where the service never sealed"


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _canonical(content: dict[str, Any]) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
