"""Populations: a lifetime budget over several datasets of the same people (DESIGN.md).

A population's loss is the sum of its member datasets' lifetime losses, kept on its row
(``Population.loss_*``) and moved by every grant, hold and settle on a member under the
population's lock (``services.charge_reads``). Here: creating one, joining a dataset to
it at the dataset's creation, changing its limit (ledgered in its own chain), and the
budget report, which shows the sum beside each member's own loss.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from accountant import seals
from accountant.accounting.checks import at_limit, remaining
from accountant.accounting.modes import Mode
from accountant.accounting.windows import isoformat
from accountant.driver import Driver
from accountant.errors import Conflict, NotFound, field_error
from accountant.exact import Amount, Limit
from accountant.key_hashing import KeyHasher
from accountant.models import Consumer, Dataset, LedgerEntry, Population
from accountant.services import datasets, ledger, limit_notes

#: What every member dataset must be, said wherever a population is created or shown.
IDENTITY = (
    "every member dataset must identify the same people by the same person-level id, "
    "and state its sensitivity per person (privacy unit user): the population's loss is "
    "then a bound on what all of its datasets' releases reveal about any one person; a "
    "person known by different ids in two datasets is two people to it"
)


def find(session: Session, name: str, *, lock: bool = False) -> Population:
    """The population named ``name`` (locked ``FOR UPDATE`` if asked), or a 404."""
    statement = select(Population).where(Population.name == name)
    if lock:
        statement = statement.with_for_update()
    population = session.execute(statement).scalar_one_or_none()
    if population is None:
        raise NotFound(f"no population named {name!r}; list populations with GET /v1/populations")
    return population


def all_populations(session: Session) -> list[Population]:
    """Every population, by name."""
    return list(session.execute(select(Population).order_by(Population.name)).scalars())


def create(
    session: Session, body: dict[str, Any], actor: ledger.Actor, now: int, hasher: KeyHasher
) -> Population:
    """A new population, its limit ledgered as the first entry of its own chain. A 400 for
    a privacy unit other than ``user``, or a mode whose losses do not add."""
    if body["privacy_unit"] != "user":
        raise field_error(
            "privacy_unit",
            "a population is of privacy unit user: records or partitions of different "
            "datasets are not the same unit, people are",
        )
    accounting = body.get("accounting", "approx")
    if accounting != "rdp" and "rdp_order" in body:
        raise field_error("rdp_order", "rdp_order applies only to accounting rdp")
    if datasets.name_taken(session, body["name"]):
        raise Conflict(
            f"a dataset or population named {body['name']!r} exists (they share one "
            "namespace); choose another name"
        )
    order = datasets.rdp_order_of(body) if accounting == "rdp" else None
    population = Population(
        name=body["name"],
        privacy_unit="user",
        accounting=accounting,
        rdp_order=order,
        created_at=now,
        ledger_seq=0,
        ledger_head="",
    )
    limit = datasets.lifetime_limit(population.mode, body["budget"])
    population.limit_epsilon, population.limit_delta, population.limit_rho = (
        limit.epsilon,
        limit.delta,
        limit.rho,
    )
    if seals.heads_begun(session):  # its chain is sealed from its (empty) start
        population.head_seal = seals.of_head(hasher, population.name, 0, ledger.GENESIS)
    session.add(population)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"a population named {body['name']!r} exists") from None
    _ledger_limit(session, population, actor, None, body.get("reason"), now, hasher)
    return population


def members(session: Session, population: Population) -> list[Dataset]:
    """The population's datasets, by name."""
    return list(
        session.execute(
            select(Dataset).where(Dataset.population_id == population.id).order_by(Dataset.name)
        ).scalars()
    )


def describe(session: Session, population: Population) -> dict[str, Any]:
    """The population as created (its limit as currently set), with its datasets."""
    mode = population.mode
    view: dict[str, Any] = {
        "name": population.name,
        "privacy_unit": population.privacy_unit,
        "accounting": population.accounting,
        "budget": datasets.describe_limit(population.limit, mode),
        "datasets": [dataset.name for dataset in members(session, population)],
        "created_at": isoformat(population.created_at / 1e6),
        "identity": IDENTITY,
    }
    if mode.order is not None:
        view["rdp_order"] = mode.order
    return view


def update_limit(
    session: Session,
    population: Population,
    body: dict[str, Any],
    actor: ledger.Actor,
    now: int,
    hasher: KeyHasher,
    *,
    approval: dict[str, Any] | None = None,
) -> limit_notes.Outcome:
    """Apply a PATCH of the population's limit (its row locked): ledgered in its chain with
    the reason given (and ``approval``, when approved), unless the enforced limit is the one
    it had."""
    mode = population.mode
    old = population.limit
    stated = {
        k: v for k, v in datasets.describe_limit(old, mode).items() if k in ("epsilon", "delta")
    }
    limit = datasets.lifetime_limit(mode, stated | body["budget"])
    if limit == old:
        return limit_notes.Outcome(False, (limit_notes.unchanged("the population's limit"),))
    population.limit_epsilon, population.limit_delta, population.limit_rho = (
        limit.epsilon,
        limit.delta,
        limit.rho,
    )
    _ledger_limit(session, population, actor, old, body.get("reason"), now, hasher, approval)
    notes = [
        note
        for note in (
            limit_notes.below_spent(
                "the population's limit",
                limit=limit,
                spent=population.loss,
                mode=mode,
                consequence="charges on its datasets that cost anything there are denied",
            ),
        )
        if note is not None
    ]
    if not limit_notes.given(body.get("reason")):
        notes.append(limit_notes.UNSTATED)
    return limit_notes.Outcome(True, tuple(notes))


def _ledger_limit(
    session: Session,
    population: Population,
    actor: ledger.Actor,
    old: Limit | None,
    reason: str | None,
    now: int,
    hasher: KeyHasher,
    approval: dict[str, Any] | None = None,
) -> None:
    """A ``limit_change`` entry in the population's chain: its old (None: created) and new
    limit as exact text, and the reason (with an approved change's ``approval``)."""
    mode = population.mode
    ledger.append(
        Driver.of(session),
        population,
        actor,
        kind="limit_change",
        status="granted",
        created_at=now,
        detail={
            "scope": "population",
            "old": None if old is None else datasets.as_text(datasets.describe_limit(old, mode)),
            "new": datasets.as_text(datasets.describe_limit(population.limit, mode)),
            "reason": reason,
            **(approval or {}),
        },
        loss_after=population.loss,
        hasher=hasher,
    )


def budget_report(session: Session, population: Population) -> dict[str, Any]:
    """What GET /v1/populations/{name}/budget shows: the population's loss (the sum of its
    datasets' lifetime losses), limit and what remains, each dataset's own loss, and the
    history of its limit."""
    mode, names = population.mode, population.mode.components
    loss, limit = population.loss, population.limit
    shares = {
        dataset.name: _stated(mode, datasets.lifetime_loss(session, dataset), population)
        for dataset in members(session, population)
    }
    history = [
        {
            "at": isoformat(entry.created_at / 1e6),
            "scope": "population",
            "old": datasets.as_numbers(entry.detail.get("old")),
            "new": datasets.as_numbers(entry.detail.get("new")),
            "reason": limit_notes.reason_of(entry.detail),
            **datasets.changed_by(entry, actor),
        }
        for entry, actor in session.execute(
            select(LedgerEntry, Consumer.name)
            .outerjoin(Consumer, Consumer.id == LedgerEntry.consumer_id)
            .where(
                LedgerEntry.population_id == population.id,
                LedgerEntry.kind == "limit_change",
            )
            .order_by(LedgerEntry.id)
        ).all()
    ]
    return {
        "population": population.name,
        "privacy_unit": population.privacy_unit,
        "accounting": population.accounting,
        "loss": _stated(mode, loss, population),
        "limit": _stated(mode, limit.bounds(), population, bound=True),
        "remaining": _stated(mode, remaining(limit, loss, names), population, bound=True),
        "at_limit": at_limit(limit, loss, names),
        "datasets": shares,
        "limit_history": history,
        "guarantees": (
            "the loss is the sum of the member datasets' lifetime losses: a bound on what "
            "their releases reveal about any one person, if every dataset identifies people "
            "by the same person-level id"
        ),
    }


def _stated(
    mode: Mode, amount: Amount, population: Population, *, bound: bool = False
) -> dict[str, Any]:
    """``amount`` as the population's mode states it (zcdp: with epsilon at its delta);
    ``bound``: a limit or what remains of one (``Mode.report``)."""
    return mode.labelled(mode.report(amount, population.limit_delta or 0, bound=bound), amount)
