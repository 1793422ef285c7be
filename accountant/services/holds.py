"""Holds as the API and the budget report show them: read, never written here (a hold is
made by the charge's own transaction, ``services.charges.submit``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, aliased

from accountant.accounting.windows import isoformat
from accountant.errors import Forbidden, NotFound
from accountant.exact import Amount
from accountant.models import Consumer, Dataset, Hold
from accountant.services import idempotency
from accountant.services.api_keys import Principal

#: The states a hold reads as. ``expired`` is an open hold whose expiry has come: it keeps
#: its amount charged and can be neither drawn on nor settled.
STATES = ("open", "settled", "expired")


def state_of(hold: Hold, now_us: int) -> str:
    """A hold's state at ``now_us``: expired from ``expires_at`` inclusive."""
    if hold.state == "open" and now_us >= hold.expires_at:
        return "expired"
    return hold.state


def describe(
    hold: Hold,
    dataset: Dataset,
    consumer: str | None,
    now_us: int,
    settled_by: str | None = None,
) -> dict[str, Any]:
    """One hold as the API shows it (``consumer`` holds it; ``settled_by`` settled it)."""
    mode, delta = dataset.mode, dataset.limit_delta or 0

    def stated(amount: Amount) -> dict[str, Any]:
        return mode.labelled(mode.report_cost(amount, delta), amount)

    return {
        "hold_id": hold.id,
        "dataset": dataset.name,
        "consumer": consumer,
        "partitions": hold.partitions,
        "release": hold.release,
        "mechanism": hold.mechanism,
        "params": idempotency.decimals_as_floats(idempotency.decode_params(hold.params)),
        "amount": stated(hold.amount),
        "multiplicity": hold.multiplicity,
        "charged": stated(hold.amount.scaled(hold.multiplicity)),
        "drawn": stated(hold.drawn),
        "state": state_of(hold, now_us),
        "purpose": hold.purpose,
        "created_at": isoformat(hold.created_at / 1e6),
        "expires_at": isoformat(hold.expires_at / 1e6),
        "settled_at": None if hold.settled_at is None else isoformat(hold.settled_at / 1e6),
        # once settled: what its job used in all, and what went back to its scopes
        "settled_by": settled_by,
        "used": None if (used := hold.used) is None else stated(used),
        "returned": None if used is None else stated(hold.amount.minus(used)),
    }


_SETTLER = aliased(Consumer)


def _visible(caller: Principal) -> Select[Hold, Dataset, str, str]:
    query = (
        select(Hold, Dataset, Consumer.name, _SETTLER.name)
        .join(Dataset, Dataset.id == Hold.dataset_id)
        .outerjoin(Consumer, Consumer.id == Hold.consumer_id)
        .outerjoin(_SETTLER, _SETTLER.id == Hold.settled_by)
    )
    if caller.role == "service":  # its own holds, on the datasets granted to it
        query = query.where(
            Hold.consumer_id == caller.consumer_id, Hold.dataset_id.in_(caller.granted)
        )
    return query


def show(session: Session, hold_id: str, caller: Principal, now_us: int) -> dict[str, Any]:
    """The hold ``hold_id``: 404 if there is none, 403 for a service that does not hold it."""
    row = session.execute(_visible(caller).where(Hold.id == hold_id)).first()
    if row is None:
        exists = session.execute(
            select(Hold.consumer_id, Dataset.name)
            .join(Dataset, Dataset.id == Hold.dataset_id)
            .where(Hold.id == hold_id)
        ).first()
        if exists is not None and exists.consumer_id == caller.consumer_id:
            raise Forbidden(  # its own hold, on a dataset no longer granted to it
                f"dataset {exists.name!r} is not granted to {caller.name!r}: its holds there "
                "are read by an admin or an auditor"
            )
        if exists is not None:
            raise Forbidden("a service may read only its own holds")
        raise NotFound(f"no hold with id {hold_id!r}")
    hold, dataset, consumer, settler = row
    return describe(hold, dataset, consumer, now_us, settler)


def listing(
    session: Session,
    caller: Principal,
    now_us: int,
    *,
    dataset_id: int | None = None,
    state: str | None = None,
) -> list[dict[str, Any]]:
    """The holds ``caller`` may read, newest first, of one dataset and state if named."""
    query = _visible(caller).order_by(Hold.created_at.desc(), Hold.id)
    if dataset_id is not None:
        query = query.where(Hold.dataset_id == dataset_id)
    if state == "settled":
        query = query.where(Hold.state == "settled")
    elif state == "open":
        query = query.where(Hold.state == "open", Hold.expires_at > now_us)
    elif state == "expired":
        query = query.where(Hold.state == "open", Hold.expires_at <= now_us)
    rows = session.execute(query.limit(1000)).all()
    return [
        describe(hold, dataset, consumer, now_us, settler)
        for hold, dataset, consumer, settler in rows
    ]
