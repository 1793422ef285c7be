"""/v1/populations: budgets over several datasets of the same people (DESIGN.md)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from accountant.api import requests, schemas
from accountant.api.auth import principal
from accountant.api.common import json_body
from accountant.services import approvals, populations
from accountant.services.ledger import Actor
from accountant.web import db, now_us, runtime, unit_of_work

bp = Blueprint("populations", __name__)
#: Who reads populations: what they sum spans datasets a service may not be granted.
READERS = ("admin", "auditor")


@bp.post("/v1/populations")
def create() -> Any:
    caller = principal("admin")
    body = json_body(schemas.POPULATION_CREATE)
    with unit_of_work() as session:
        population = populations.create(
            session, body, Actor(caller.consumer_id, caller.name), now_us(), runtime().key_hasher
        )
        view = populations.describe(session, population)
    return view, 201


@bp.get("/v1/populations")
def list_populations() -> Any:
    principal(*READERS)
    session = db()
    return {
        "populations": [
            populations.describe(session, p) for p in populations.all_populations(session)
        ]
    }


@bp.get("/v1/populations/<name>")
def show(name: str) -> Any:
    principal(*READERS)
    return populations.describe(db(), populations.find(db(), name))


@bp.patch("/v1/populations/<name>")
def patch(name: str) -> Any:
    caller = principal("admin")
    body = json_body(schemas.POPULATION_PATCH)
    with unit_of_work() as session:
        population = populations.find(session, name, lock=True)
        before = population.limit
        outcome = populations.update_limit(
            session,
            population,
            body,
            Actor(caller.consumer_id, caller.name),
            now_us(),
            runtime().key_hasher,
        )
        raised = requests.on() and approvals.raises(
            before, population.limit, population.mode, population.limit_delta
        )
        if raised or not outcome.changed:  # as it was, or not until approved
            session.rollback()
    if raised:
        return requests.pending(kind="population_limit", target=name, change=body, caller=caller)
    return {**populations.describe(db(), populations.find(db(), name)), **outcome.view()}


@bp.get("/v1/populations/<name>/budget")
def budget(name: str) -> Any:
    principal(*READERS)
    return populations.budget_report(db(), populations.find(db(), name))
