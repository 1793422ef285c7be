"""/v1/consumers and /v1/keys: callers, their grants and quotas, and their API keys."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response
from flask.blueprints import BlueprintSetupState
from werkzeug.routing import BaseConverter

from accountant.accounting.windows import isoformat
from accountant.api import requests, schemas
from accountant.api.auth import principal
from accountant.api.common import json_body
from accountant.services import api_keys, consumers, grants
from accountant.web import db, now_us, runtime, unit_of_work

bp = Blueprint("consumers", __name__)


class ConsumerName(BaseConverter):
    """A consumer's name in a path, never ``me``: /v1/consumers/me is the caller's own record
    (so its Allow header lists only GET), and ``me`` is not a name a consumer can take."""

    regex = r"(?!me/|me$)[^/]+"


@bp.record_once
def _register_converter(state: BlueprintSetupState) -> None:
    state.app.url_map.converters["consumer_name"] = ConsumerName


def _dataset_names() -> dict[int, str]:
    return grants.dataset_names(db())


@bp.post("/v1/consumers")
def create() -> Any:
    caller = principal("admin")
    body = json_body(schemas.CONSUMER_CREATE)
    if body["role"] == "admin" and requests.on():  # a new admin: another admin approves
        consumers.check_name_free(db(), body["name"])
        return requests.pending(
            kind="admin_consumer", target=body["name"], change=body, caller=caller
        )
    with unit_of_work() as session:
        consumer, key = consumers.create_consumer(session, body, now_us(), runtime().key_hasher)
    view = consumers.describe_consumer(consumer, _dataset_names())
    return {**view, "api_key": key, "key_id": consumer.keys[0].id}, 201


@bp.get("/v1/consumers")
def list_consumers() -> Any:
    principal("admin", "auditor")
    names = _dataset_names()
    return {
        "consumers": [consumers.describe_consumer(c, names) for c in consumers.all_consumers(db())]
    }


@bp.patch("/v1/consumers/<consumer_name:name>")
def update(name: str) -> Any:
    """Change a consumer's grants and quotas; each change is ledgered on its dataset."""
    caller = principal("admin")
    body = json_body(schemas.CONSUMER_PATCH)
    with unit_of_work() as session:
        consumer, outcome = grants.update_consumer(
            session, name, body, caller, now_us(), runtime().key_hasher
        )
        if not outcome.changed:  # the grants and quotas as they were: nothing to write
            session.rollback()
    return {**consumers.describe_consumer(consumer, _dataset_names()), **outcome.view()}


@bp.get("/v1/consumers/me")
def me() -> Any:
    """The caller's own consumer, grants, quotas and their current use (any key)."""
    caller = principal("admin", "service", "auditor")
    return consumers.describe_me(db(), caller)


@bp.post("/v1/consumers/<name>/keys")
def create_key(name: str) -> Any:
    caller = principal("admin")
    body = json_body(schemas.KEY_CREATE, empty_ok=True)
    if requests.on() and consumers.find_consumer(db(), name).role == "admin":
        return requests.pending(kind="admin_key", target=name, change=body, caller=caller)
    with unit_of_work() as session:
        consumer = consumers.find_consumer(session, name)
        row, key = api_keys.issue_key(session, consumer, now_us(), runtime().key_hasher)
    return {
        "id": row.id,
        "prefix": row.prefix,
        "consumer": name,
        "api_key": key,
        "created_at": isoformat(row.created_at / 1e6),
    }, 201


@bp.delete("/v1/keys/<key_id>")
def revoke(key_id: str) -> Any:
    principal("admin")
    with unit_of_work() as session:
        api_keys.revoke_key(session, key_id, now_us(), runtime().key_hasher)
    revoked = Response(status=204)
    del revoked.headers["Content-Type"]  # no body, so no type (not Flask's text/html)
    return revoked
