"""Grants and quotas: which datasets a service consumer may charge, its quota on each and
its use of it, and the ledgered changes to them (``update_consumer``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from accountant import seals
from accountant.accounting.admits import AdmitsNothing, admitting_limit
from accountant.accounting.checks import at_limit, remaining
from accountant.accounting.loss import loss_now
from accountant.driver import Driver
from accountant.errors import Conflict, InvalidRequest, NotFound, field_error
from accountant.exact import COMPONENTS, DELTA, Amount
from accountant.key_hashing import KeyHasher
from accountant.models import Consumer, Dataset, Grant, Tally
from accountant.services import ledger, limit_notes
from accountant.services.api_keys import Principal
from accountant.services.datasets import (
    describe_limit,
    lifetime_loss,
    rule_of,
    stated,
    tally_state,
)

_NOT_GRANTED = (
    "a quota is for a dataset granted to the consumer, and this one is not granted; "
    "add it to datasets or remove the quota"
)


def only_services() -> InvalidRequest:
    """The refusal of dataset grants to a consumer that is not a service."""
    return InvalidRequest(
        "only service consumers take dataset grants; admins and auditors see every dataset",
        errors=[{"field": "datasets", "message": "must be empty for this role"}],
    )


def quota_not_granted(dataset_name: str) -> InvalidRequest:
    """The refusal of a quota on a dataset the consumer is not granted."""
    return InvalidRequest(
        f"quotas.{dataset_name}: {_NOT_GRANTED}",
        errors=[{"field": f"quotas.{dataset_name}", "message": _NOT_GRANTED}],
    )


def unknown_datasets(missing: list[str]) -> NotFound:
    """The refusal of grants on datasets that do not exist."""
    return NotFound(
        f"no dataset named {', '.join(missing)}; create it first with POST /v1/datasets",
        extra={"errors": [{"field": "datasets", "message": f"unknown: {', '.join(missing)}"}]},
    )


def set_quota(grant: Grant, dataset: Dataset, stated: dict[str, Any], field_name: str) -> None:
    """Give ``grant`` the quota ``stated`` (in the request's field ``field_name``), in the
    units ``dataset``'s mode enforces."""
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


def dataset_names(session: Session) -> dict[int, str]:
    """Every dataset's name by id (a consumer's grants name datasets)."""
    return {row.id: row.name for row in session.execute(select(Dataset.id, Dataset.name))}


def grant_of(session: Session, consumer_id: int, dataset_id: int) -> Grant | None:
    return session.execute(
        select(Grant).where(Grant.consumer_id == consumer_id, Grant.dataset_id == dataset_id)
    ).scalar_one_or_none()


def quota_use(session: Session, grant: Grant, dataset: Dataset) -> dict[str, Any]:
    """A consumer's loss on ``dataset`` (its consumer scope) and, with a quota, the quota and
    what is left of it, in the dataset's mode."""
    mode = dataset.mode
    loss = consumer_loss(session, grant.consumer_id, dataset)
    delta = dataset.limit_delta or 0
    entry: dict[str, Any] = {"loss": mode.labelled(mode.report(loss, delta), loss)}
    if grant.quota is not None:
        quota = grant.quota
        entry["quota"] = mode.labelled(describe_limit(quota, mode), quota.bounds())
        left = remaining(quota, loss, mode.components)
        # what the quota states (a pure quota's delta is 0; an approx one may omit delta)
        limited = tuple(n for n in COMPONENTS if quota[n] is not None)
        entry["remaining"] = stated(mode, left, dataset, limited, bound=True)
        entry["at_limit"] = at_limit(grant.quota, loss, mode.components)
    return entry


def consumer_loss(session: Session, consumer_id: int, dataset: Dataset) -> Amount:
    """A consumer's loss on ``dataset``: its consumer scope, by the dataset's rule."""
    rule, names = rule_of(dataset), dataset.mode.components
    tally = session.execute(
        select(Tally).where(
            Tally.dataset_id == dataset.id,
            Tally.kind == "consumer",
            Tally.consumer_id == consumer_id,
        )
    ).scalar_one_or_none()
    return loss_now(rule, tally_state(session, tally, rule, names), names)


def update_consumer(
    session: Session,
    name: str,
    body: dict[str, Any],
    actor: Principal,
    now: int,
    hasher: KeyHasher,
    *,
    approval: dict[str, Any] | None = None,
) -> tuple[Consumer, limit_notes.Outcome]:
    """Apply a PATCH of grants (``datasets``: the new set) and quotas (a limit, or null to
    remove one), in ``session``'s write transaction. Each dataset whose grant or quota
    changes gets a ledgered limit change on its own chain, under its lock, stating the old
    and new terms, who changed them and the reason given or none; a quota restated as it
    was is not ledgered (``limit_notes``). ``approval``: who approved the change and why,
    ledgered with it."""
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
        raise only_services()
    for dataset_name in quotas:
        if dataset_name not in wanted:
            raise quota_not_granted(dataset_name)
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
        raise unknown_datasets(missing)
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
                    set_quota(grant, dataset, quotas[dataset_name], f"quotas.{dataset_name}")
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
                **(approval or {}),
            },
            loss_after=lifetime_loss(session, dataset),
            hasher=hasher,
        )
        if grant is not None and grant.quota is not None and new["quota"] != old["quota"]:
            spent = consumer_loss(session, consumer.id, dataset)
            note = limit_notes.below_spent(
                what,
                limit=grant.quota,
                spent=spent,
                mode=dataset.mode,
                consequence="its charges there are denied",
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
