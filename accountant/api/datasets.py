"""/v1/datasets: registration, limits, partitions and the budget report."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from accountant.api import requests, schemas
from accountant.api.auth import principal
from accountant.api.common import int_arg, json_body
from accountant.errors import Forbidden
from accountant.models import Dataset
from accountant.services import approvals, datasets, grants
from accountant.services.api_keys import Principal
from accountant.services.ledger import Actor
from accountant.web import db, now_us, runtime, unit_of_work

bp = Blueprint("datasets", __name__)
READERS = ("admin", "service", "auditor")


def _readable(name: str, caller: Principal) -> Dataset:
    dataset = datasets.find(db(), name)
    if not caller.may_read(dataset.id):
        raise Forbidden(f"dataset {name!r} is not granted to {caller.name!r}")
    return dataset


@bp.post("/v1/datasets")
def create() -> Any:
    principal("admin")
    body = json_body(schemas.DATASET_CREATE)
    with unit_of_work() as session:
        dataset = datasets.create(session, body, now_us(), runtime().key_hasher)
    return datasets.describe(dataset), 201


@bp.get("/v1/datasets")
def list_datasets() -> Any:
    caller = principal(*READERS)
    return {
        "datasets": [
            datasets.describe(d) for d in datasets.all_datasets(db()) if caller.may_read(d.id)
        ]
    }


@bp.get("/v1/datasets/<name>")
def show(name: str) -> Any:
    return datasets.describe(_readable(name, principal(*READERS)))


@bp.patch("/v1/datasets/<name>")
def patch(name: str) -> Any:
    caller = principal("admin")
    body = json_body(schemas.DATASET_PATCH)
    with unit_of_work() as session:
        dataset = datasets.find(session, name, lock=True)
        before = (dataset.limit, dataset.partition_limit)
        outcome = datasets.update_limits(
            session,
            dataset,
            body,
            Actor(caller.consumer_id, caller.name),
            now_us(),
            runtime().key_hasher,
        )
        mode, delta = dataset.mode, dataset.limit_delta
        raised = requests.on() and (
            approvals.raises(before[0], dataset.limit, mode, delta)
            or approvals.raises(before[1], dataset.partition_limit, mode, delta)
        )
        if raised or not outcome.changed:  # as it was, or not until approved
            session.rollback()
    if raised:
        return requests.pending(kind="dataset_limits", target=name, change=body, caller=caller)
    return {**datasets.describe(dataset), **outcome.view()}


@bp.post("/v1/datasets/<name>/partitions")
def declare_partitions(name: str) -> Any:
    caller = principal("admin", "service")
    body = json_body(schemas.PARTITIONS_DECLARE)
    with unit_of_work() as session:
        dataset = datasets.find(session, name, lock=True)
        if not caller.may_charge(dataset.id):
            raise Forbidden(f"dataset {name!r} is not granted to {caller.name!r}")
        schemas.check_partition_keys(body["keys"], "keys")
        created, existing = datasets.declare_partitions(session, dataset, body["keys"], now_us())
    return {"dataset": name, "created": created, "existing": existing}, 201


@bp.get("/v1/datasets/<name>/budget")
def budget(name: str) -> Any:
    caller = principal(*READERS)
    dataset = _readable(name, caller)
    report = datasets.budget_report(db(), dataset, now_us() / 1e6)
    if caller.role == "service":  # other consumers' quotas are theirs and the admins'
        report["limit_history"] = [
            change
            for change in report["limit_history"]
            if change.get("consumer", caller.name) == caller.name
        ]
    grant = grants.grant_of(db(), caller.consumer_id, dataset.id)
    if grant is not None:  # a service sees its own share: loss, quota, what is left
        report["consumer"] = {"name": caller.name, **grants.quota_use(db(), grant, dataset)}
    return report


@bp.get("/v1/datasets/<name>/partitions")
def list_partitions(name: str) -> Any:
    dataset = _readable(name, principal(*READERS))
    limit = int_arg("limit", 100, 1, 1000)
    cursor = int_arg("cursor", 0, 0, 2**31 - 1)  # partition ids are 32-bit
    items, next_id = datasets.list_partitions(db(), dataset, limit=limit, after_id=cursor)
    return {"partitions": items, "next_cursor": None if next_id is None else str(next_id)}
