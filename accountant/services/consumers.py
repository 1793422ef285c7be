"""Consumers, API keys (random, stored as SHA-256, shown once) and authentication."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session, selectinload

from accountant import seals
from accountant.accounting.admits import AdmitsNothing, admitting_limit
from accountant.accounting.decide import may_charge, may_read
from accountant.accounting.modes import Mode, mode_of
from accountant.driver import Driver
from accountant.errors import Conflict, InvalidRequest, NotFound, field_error
from accountant.exact import DELTA, Amount
from accountant.key_hashing import KeyHasher, ensure_registered
from accountant.models import ApiKey, Consumer, Dataset, Grant
from accountant.services import limit_notes
from accountant.services.datasets import describe_limit
from accountant.statements import statement

KEY_PREFIX = "pba_"


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of one request."""

    consumer_id: int
    name: str
    role: str
    key_id: str
    granted: frozenset[int] = field(default_factory=frozenset)

    def may_read(self, dataset_id: int) -> bool:
        return may_read(self.role, dataset_id in self.granted)

    def may_charge(self, dataset_id: int) -> bool:
        return may_charge(self.role, dataset_id in self.granted)


#: What a caller with an unknown or revoked key is told.
UNKNOWN_KEY = "unknown or revoked API key; ask an admin for a key"


def authenticate(driver: Driver, key_hash: str) -> Principal | None:
    """The principal of the unrevoked key whose stored hash is ``key_hash`` (the key's, by
    ``KeyHasher``), or None. The lookup is by hash, never by the key.

    One driver statement and no ORM objects: this runs on every request.
    """
    rows = driver.rows(_AUTHENTICATE, {"hash": key_hash})
    if not rows:
        return None
    first = rows[0]
    granted = frozenset(row.dataset_id for row in rows if row.dataset_id is not None)
    return Principal(first.consumer_id, first.name, first.role, first.key_id, granted)


class KnownKeys:
    """Principals this process has authenticated, by their key's hash, for the charge path:
    a charge reads its key, its consumer's role and its grant again under its dataset's
    lock (``charge_reads``), so a principal found here never stands for more than the
    request's own transaction checks. Grants are not kept, since a charge never uses them.
    Bounded: emptied when full."""

    def __init__(self, size: int = 4096) -> None:
        self._found: dict[str, Principal] = {}
        self._size = size

    def get(self, key_hash: str) -> Principal | None:
        return self._found.get(key_hash)

    def remember(self, key_hash: str, principal: Principal) -> None:
        if len(self._found) >= self._size:
            self._found.clear()
        self._found[key_hash] = replace(principal, granted=frozenset())

    def forget(self, key_hash: str) -> None:
        self._found.pop(key_hash, None)


_NOT_GRANTED = (
    "a quota is for a dataset granted to the consumer, and this one is not granted; "
    "add it to datasets or remove the quota"
)
_AUTHENTICATE = statement(
    select(
        ApiKey.id.label("key_id"),
        Consumer.id.label("consumer_id"),
        Consumer.name,
        Consumer.role,
        Grant.dataset_id,
    )
    .join(Consumer, Consumer.id == ApiKey.consumer_id)
    .outerjoin(Grant, Grant.consumer_id == Consumer.id)
    .where(ApiKey.key_hash == bindparam("hash"), ApiKey.revoked_at.is_(None))
)


def issue_key(
    session: Session,
    consumer: Consumer,
    now: int,
    hasher: KeyHasher,
    key: str | None = None,
    *,
    new: bool = False,
) -> tuple[ApiKey, str]:
    """A new key for ``consumer`` (``new``: created in this transaction, so not sealed
    yet); the plaintext is returned once and never stored. Refused (``Conflict``) for a
    consumer whose seal does not hold."""
    ensure_registered(session, hasher)  # before the first keyed hash this database holds
    if not new and not seals.consumer_holds(session, hasher, consumer.id):
        raise Conflict(seals.refusal(f"consumer {consumer.name!r}"))
    plaintext = key if key is not None else KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(
        id=secrets.token_hex(8),
        consumer_id=consumer.id,
        key_hash=hasher(plaintext),
        prefix=display_prefix(plaintext),
        created_at=now,
    )
    session.add(row)
    session.flush()
    seals.seal_consumer(session, hasher, consumer.id)
    return row, plaintext


def display_prefix(plaintext: str) -> str:
    """What a key listing shows of a key: the fixed marker of generated keys, never a
    character of the secret (the key's random id tells keys apart)."""
    return KEY_PREFIX if plaintext.startswith(KEY_PREFIX) else ""


def revoke_key(session: Session, key_id: str, now: int, hasher: KeyHasher) -> None:
    """Revoke a key at once. Its consumer is resealed only if its seal held: a key revoked
    from a consumer edited in the database is revoked, and the edit still shows."""
    row = session.get(ApiKey, key_id)
    if row is None or row.revoked_at is not None:
        raise NotFound(f"no active key with id {key_id!r}; list keys with GET /v1/consumers")
    holds = seals.consumer_holds(session, hasher, row.consumer_id)
    row.revoked_at = now
    session.flush()
    if holds:  # a key revoked from edited rows is revoked; their seal stays broken
        seals.seal_consumer(session, hasher, row.consumer_id)


def create_consumer(
    session: Session, body: dict[str, Any], now: int, hasher: KeyHasher
) -> tuple[Consumer, str]:
    """Create a consumer with its grants and quotas, and its first key."""
    if body["name"] == "me":
        raise InvalidRequest(
            "'me' is reserved: /v1/consumers/me is the caller's own record; choose another name",
            errors=[{"field": "name", "message": "reserved"}],
        )
    if session.execute(select(Consumer.id).where(Consumer.name == body["name"])).first():
        raise Conflict(
            f"a consumer named {body['name']!r} exists; choose another name or "
            f"add a key with POST /v1/consumers/{body['name']}/keys"
        )
    names = list(body.get("datasets", []))
    quotas = body.get("quotas", {})
    for name in quotas:
        if name not in names:
            raise InvalidRequest(
                f"quotas.{name}: {_NOT_GRANTED}",
                errors=[{"field": f"quotas.{name}", "message": _NOT_GRANTED}],
            )
    if body["role"] != "service" and names:
        raise InvalidRequest(
            "only service consumers take dataset grants; admins and auditors see every dataset",
            errors=[{"field": "datasets", "message": "must be empty for this role"}],
        )
    datasets = {
        d.name: d for d in session.execute(select(Dataset).where(Dataset.name.in_(names))).scalars()
    }
    missing = [name for name in names if name not in datasets]
    if missing:
        raise NotFound(
            f"no dataset named {', '.join(missing)}; create it first with POST /v1/datasets",
            extra={"errors": [{"field": "datasets", "message": f"unknown: {', '.join(missing)}"}]},
        )
    consumer = Consumer(name=body["name"], role=body["role"], created_at=now)
    for name in names:
        dataset = datasets[name]
        grant = Grant(dataset_id=dataset.id)
        if name in quotas:
            _set_quota(grant, dataset, quotas[name], f"quotas.{name}")
        consumer.grants.append(grant)
    session.add(consumer)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"a consumer named {body['name']!r} exists") from None
    _, key = issue_key(session, consumer, now, hasher, new=True)
    return consumer, key


def _set_quota(grant: Grant, dataset: Dataset, stated: dict[str, Any], field_name: str) -> None:
    mode = dataset.mode
    try:
        quota = admitting_limit(mode, stated, DELTA.to_decimal(dataset.limit_delta or 0))
    except AdmitsNothing as error:
        raise field_error(f"{field_name}.{error.component}", str(error)) from None
    except ValueError as error:
        raise InvalidRequest(
            str(error), errors=[{"field": field_name, "message": str(error)}]
        ) from None
    grant.has_quota = True
    grant.quota_epsilon, grant.quota_delta, grant.quota_rho = quota.epsilon, quota.delta, quota.rho


def describe_consumer(consumer: Consumer, dataset_names: dict[int, str]) -> dict[str, Any]:
    quotas = {}
    modes = _modes_of_quotas(consumer)  # the enforced part named as its dataset's mode names it
    for grant in consumer.grants:
        quota = grant.quota
        if quota is not None:
            quotas[dataset_names[grant.dataset_id]] = describe_limit(
                quota, modes.get(grant.dataset_id)
            )
    return {
        "name": consumer.name,
        "role": consumer.role,
        "datasets": sorted(dataset_names[g.dataset_id] for g in consumer.grants),
        "quotas": quotas,
        "keys": [
            {"id": k.id, "prefix": k.prefix, "revoked": k.revoked_at is not None}
            for k in sorted(consumer.keys, key=lambda k: k.created_at)
        ],
    }


def ensure_first_admin(session: Session, key: str, now: int, hasher: KeyHasher) -> bool:
    """Create the admin ``admin`` with ``key`` unless an admin exists; True if created.

    Safe when several processes start at once: the consumer name is unique,
    so at most one insert succeeds; the others raise ``IntegrityError``, and
    their caller rolls back.
    """
    if session.execute(select(Consumer.id).where(Consumer.role == "admin").limit(1)).first():
        return False
    consumer = Consumer(name="admin", role="admin", created_at=now)
    session.add(consumer)
    session.flush()
    issue_key(session, consumer, now, hasher, key=key, new=True)
    return True


def _modes_of_quotas(consumer: Consumer) -> dict[int, Mode]:
    """The mode of each dataset on which ``consumer`` has a quota, in one query."""
    ids = [grant.dataset_id for grant in consumer.grants if grant.has_quota]
    session = object_session(consumer)
    if not ids or session is None:
        return {}
    return {
        row.id: mode_of(row.accounting, row.rdp_order, row.composition_delta)
        for row in session.execute(
            select(
                Dataset.id, Dataset.accounting, Dataset.rdp_order, Dataset.composition_delta
            ).where(Dataset.id.in_(ids))
        )
    }


def dataset_names(session: Session) -> dict[int, str]:
    """Every dataset's name by id (a consumer's grants name datasets)."""
    return {row.id: row.name for row in session.execute(select(Dataset.id, Dataset.name))}


def all_consumers(session: Session) -> list[Consumer]:
    """Every consumer with its grants and keys, by name."""
    return list(
        session.execute(
            select(Consumer)
            .options(selectinload(Consumer.grants), selectinload(Consumer.keys))
            .order_by(Consumer.name)
        ).scalars()
    )


def find_consumer(session: Session, name: str) -> Consumer:
    consumer = session.execute(select(Consumer).where(Consumer.name == name)).scalar_one_or_none()
    if consumer is None:
        raise NotFound(f"no consumer named {name!r}; create it with POST /v1/consumers")
    return consumer


def describe_me(session: Session, principal: Principal) -> dict[str, Any]:
    """The caller's consumer with, per granted dataset, its loss in the consumer scope and,
    with a quota, the quota and what is left of it (allocation, not a privacy guarantee)."""
    consumer = session.execute(
        select(Consumer)
        .options(selectinload(Consumer.grants), selectinload(Consumer.keys))
        .where(Consumer.id == principal.consumer_id)
    ).scalar_one()
    view = describe_consumer(consumer, dataset_names(session))
    use: dict[str, Any] = {}
    for grant in consumer.grants:
        dataset = session.get(Dataset, grant.dataset_id)
        assert dataset is not None
        use[dataset.name] = quota_use(session, grant, dataset)
    view["use"] = use
    return view


def quota_use(session: Session, grant: Grant, dataset: Dataset) -> dict[str, Any]:
    """A consumer's loss on ``dataset`` (its consumer scope) and, with a quota, the quota and
    what is left of it, in the dataset's mode."""
    from accountant.accounting.checks import at_limit, remaining

    mode = dataset.mode
    loss = consumer_loss(session, grant.consumer_id, dataset)
    delta = dataset.limit_delta or 0
    entry: dict[str, Any] = {"loss": mode.labelled(mode.report(loss, delta), loss)}
    if grant.quota is not None:
        quota = grant.quota
        entry["quota"] = mode.labelled(describe_limit(quota, mode), quota.bounds())
        left = remaining(quota, loss, mode.components)
        entry["remaining"] = mode.labelled(mode.report(left, delta), left)
        entry["at_limit"] = at_limit(grant.quota, loss, mode.components)
    return entry


def consumer_loss(session: Session, consumer_id: int, dataset: Dataset) -> Amount:
    """A consumer's loss on ``dataset``: its consumer scope, by the dataset's rule."""
    from accountant.accounting.loss import loss_now
    from accountant.models import Tally
    from accountant.services.datasets import rule_of, tally_state

    rule, names = rule_of(dataset), dataset.mode.components
    tally = session.execute(
        select(Tally).where(
            Tally.dataset_id == dataset.id,
            Tally.kind == "consumer",
            Tally.consumer_id == consumer_id,
        )
    ).scalar_one_or_none()
    return loss_now(rule, tally_state(session, tally, rule, names), names)


def grant_of(session: Session, consumer_id: int, dataset_id: int) -> Grant | None:
    return session.execute(
        select(Grant).where(Grant.consumer_id == consumer_id, Grant.dataset_id == dataset_id)
    ).scalar_one_or_none()


def update_consumer(
    session: Session,
    name: str,
    body: dict[str, Any],
    actor: Principal,
    now: int,
    hasher: KeyHasher,
) -> tuple[Consumer, limit_notes.Outcome]:
    """Apply a PATCH of grants (``datasets``: the new set) and quotas (a limit, or null to
    remove one). Each dataset whose grant or quota changes gets a ledgered limit change on
    its own chain, under its lock, stating the old and new terms, who changed them and the
    reason given or none; a quota restated as it was is not ledgered (``limit_notes``)."""
    from accountant.db import begin_write
    from accountant.services import ledger
    from accountant.services.datasets import lifetime_loss

    begin_write(session)
    consumer = session.execute(
        select(Consumer).options(selectinload(Consumer.grants)).where(Consumer.name == name)
    ).scalar_one_or_none()
    if consumer is None:
        raise NotFound(f"no consumer named {name!r}; create it with POST /v1/consumers")
    if not seals.consumer_holds(session, hasher, consumer.id):
        raise Conflict(seals.refusal(f"consumer {name!r}"))
    granted = {grant.dataset_id: grant for grant in consumer.grants}
    names = dataset_names(session)
    wanted = (
        set(body["datasets"])
        if "datasets" in body
        else {names[dataset_id] for dataset_id in granted}
    )
    quotas = body.get("quotas", {})
    if (wanted or quotas) and consumer.role != "service":
        raise InvalidRequest(
            "only service consumers take dataset grants; admins and auditors see every dataset",
            errors=[{"field": "datasets", "message": "must be empty for this role"}],
        )
    for dataset_name in quotas:
        if dataset_name not in wanted:
            raise InvalidRequest(
                f"quotas.{dataset_name}: {_NOT_GRANTED}",
                errors=[{"field": f"quotas.{dataset_name}", "message": _NOT_GRANTED}],
            )
    touched = wanted | {names[dataset_id] for dataset_id in granted}
    datasets = {
        d.name: d
        for d in session.execute(
            select(Dataset)
            .where(Dataset.name.in_(sorted(touched)))
            .order_by(Dataset.id)
            .with_for_update()
        ).scalars()
    }
    missing = sorted(wanted - set(datasets))
    if missing:
        raise NotFound(
            f"no dataset named {', '.join(missing)}; create it first with POST /v1/datasets",
            extra={"errors": [{"field": "datasets", "message": f"unknown: {', '.join(missing)}"}]},
        )
    actor_row = ledger.Actor(actor.consumer_id, actor.name)
    notes: list[str] = []
    changed = False
    for dataset_name in sorted(touched):
        dataset = datasets[dataset_name]
        grant = granted.get(dataset.id)
        old = _terms(grant)
        if dataset_name not in wanted:
            assert grant is not None
            consumer.grants.remove(grant)
            session.delete(grant)
            grant = None
        else:
            if grant is None:
                grant = Grant(dataset_id=dataset.id)
                consumer.grants.append(grant)
            if dataset_name in quotas:
                if quotas[dataset_name] is None:
                    grant.has_quota = False
                    grant.quota_epsilon = grant.quota_delta = grant.quota_rho = None
                else:
                    _set_quota(grant, dataset, quotas[dataset_name], f"quotas.{dataset_name}")
        new = _terms(grant)
        what = f"the quota of {consumer.name} on {dataset_name}"
        if new == old:
            if dataset_name in quotas:
                notes.append(limit_notes.unchanged(what))
            continue
        changed = True
        session.flush()
        ledger.append(
            Driver.of(session),
            dataset,
            actor_row,
            kind="limit_change",
            status="granted",
            created_at=now,
            detail={
                "scope": "consumer",
                "consumer": consumer.name,
                "old": old,
                "new": new,
                "reason": body.get("reason"),
                "terms_sha256": dataset.terms_sha256,
            },
            loss_after=lifetime_loss(session, dataset),
            hasher=hasher,
        )
        if grant is not None and grant.quota is not None and new["quota"] != old["quota"]:
            spent = consumer_loss(session, consumer.id, dataset)
            note = limit_notes.below_spent(
                what, grant.quota, spent, dataset.mode, "its charges there are denied"
            )
            notes += [note] if note is not None else []
    if not changed:
        return consumer, limit_notes.Outcome(False, (limit_notes.nothing_changed(),))
    session.flush()
    seals.seal_consumer(session, hasher, consumer.id)
    if not limit_notes.given(body.get("reason")):
        notes.append(limit_notes.UNSTATED)
    return consumer, limit_notes.Outcome(True, tuple(notes))


def _terms(grant: Grant | None) -> dict[str, Any]:
    """A consumer's terms on a dataset, as ledgered: granted, and its quota as exact text."""
    quota = None if grant is None else grant.quota
    return {
        "granted": grant is not None,
        "quota": None if quota is None else {k: str(v) for k, v in describe_limit(quota).items()},
    }
