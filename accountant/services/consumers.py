"""Consumers: creating one with its grants and first key, the first admin, and the
consumers as the API describes them (with their grants, quotas and keys)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session, selectinload

from accountant.accounting.modes import Mode, mode_of
from accountant.errors import Conflict, InvalidRequest, NotFound
from accountant.key_hashing import KeyHasher
from accountant.models import Consumer, Dataset, Grant
from accountant.services.api_keys import Principal, issue_key
from accountant.services.datasets import describe_limit
from accountant.services.grants import (
    dataset_names,
    only_services,
    quota_not_granted,
    quota_use,
    set_quota,
    unknown_datasets,
)


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
            raise quota_not_granted(name)
    if body["role"] != "service" and names:
        raise only_services()
    datasets = {
        d.name: d for d in session.execute(select(Dataset).where(Dataset.name.in_(names))).scalars()
    }
    missing = [name for name in names if name not in datasets]
    if missing:
        raise unknown_datasets(missing)
    consumer = Consumer(name=body["name"], role=body["role"], created_at=now)
    for name in names:
        dataset = datasets[name]
        grant = Grant(dataset_id=dataset.id)
        if name in quotas:
            set_quota(grant, dataset, quotas[name], f"quotas.{name}")
        consumer.grants.append(grant)
    session.add(consumer)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"a consumer named {body['name']!r} exists") from None
    _, key = issue_key(session, consumer, now, hasher, new=True)
    return consumer, key


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


def all_consumers(session: Session) -> list[Consumer]:
    """Every consumer with its grants and keys, by name."""
    return list(
        session.execute(
            select(Consumer)
            .options(selectinload(Consumer.grants), selectinload(Consumer.keys))
            .order_by(Consumer.name)
        ).scalars()
    )


def check_name_free(session: Session, name: str) -> None:
    """A 409 if a consumer named ``name`` exists."""
    if session.execute(select(Consumer.id).where(Consumer.name == name)).first():
        raise Conflict(f"a consumer named {name!r} exists; choose another name")


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
