"""``GET /openapi.json``: the OpenAPI 3.1 document, from the schemas that validate requests."""

from __future__ import annotations

import copy
from typing import Any

from flask import Blueprint, current_app

from accountant.api import schemas
from accountant.api.receipts import VERIFY

bp = Blueprint("openapi", __name__)

_PROBLEM = {"$ref": "#/components/schemas/Problem"}
_OBJECT: dict[str, Any] = {"type": "object"}

#: (method, path) -> (summary, request schema or None, success status, error statuses)
OPERATIONS: dict[tuple[str, str], tuple[str, dict[str, Any] | None, int, list[int]]] = {
    ("GET", "/healthz"): ("Liveness", None, 200, []),
    ("GET", "/readyz"): ("Readiness: the database answers and the schema is current",
                         None, 200, [503]),
    ("GET", "/openapi.json"): ("This document", None, 200, []),
    ("GET", "/metrics"): ("Prometheus metrics", None, 200, []),
    ("GET", "/v1/mechanisms"): ("Registered mechanisms", None, 200, [401]),
    ("POST", "/v1/datasets"): ("Register a dataset", schemas.DATASET_CREATE, 201,
                               [400, 401, 403, 409, 413]),
    ("GET", "/v1/datasets"): ("Datasets visible to the caller", None, 200, [401]),
    ("GET", "/v1/datasets/{name}"): ("One dataset", None, 200, [401, 403, 404]),
    ("PATCH", "/v1/datasets/{name}"): ("Change limits (ledgered)", schemas.DATASET_PATCH, 200,
                                       [400, 401, 403, 404, 413]),
    ("POST", "/v1/datasets/{name}/partitions"): ("Declare partitions",
                                                 schemas.PARTITIONS_DECLARE, 201,
                                                 [400, 401, 403, 404, 413]),
    ("GET", "/v1/datasets/{name}/budget"): ("Loss, limits and remaining budget", None, 200,
                                            [401, 403, 404]),
    ("GET", "/v1/datasets/{name}/partitions"): ("Partitions and their spend", None, 200,
                                                [400, 401, 403, 404]),
    ("POST", "/v1/consumers"): ("Create a consumer and its first key", schemas.CONSUMER_CREATE,
                                201, [400, 401, 403, 404, 409, 413]),
    ("GET", "/v1/consumers"): ("Consumers, without keys", None, 200, [401, 403]),
    ("PATCH", "/v1/consumers/{name}"): ("Change grants and quotas (ledgered)",
                                        schemas.CONSUMER_PATCH, 200,
                                        [400, 401, 403, 404, 413]),
    ("GET", "/v1/consumers/me"): ("The caller's consumer, quotas and their use", None, 200,
                                  [401]),
    ("POST", "/v1/consumers/{name}/keys"): ("Issue a key", schemas.KEY_CREATE, 201,
                                            [400, 401, 403, 404]),
    ("DELETE", "/v1/keys/{key_id}"): ("Revoke a key", None, 204, [401, 403, 404]),
    ("POST", "/v1/charges"): ("Charge the budgets and run the mechanism", schemas.CHARGE, 201,
                              [400, 401, 403, 404, 409, 413, 422, 429, 503]),
    ("POST", "/v1/charges/preview"): ("Price and check without charging", schemas.PREVIEW, 200,
                                      [400, 401, 403, 404, 413]),
    ("POST", "/v1/charges/plan"): ("How many more identical charges fit, or the least-noise "
                                   "parameter for count of them", schemas.PLAN, 200,
                                   [400, 401, 403, 404, 413]),
    ("GET", "/v1/charges/{charge_id}"): ("One charge as recorded", None, 200, [401, 403, 404]),
    ("GET", "/v1/ledger"): ("Ledger entries, oldest first", None, 200, [400, 401, 403, 404]),
    ("GET", "/v1/ledger/export"): ("The filtered entries as CSV or JSON Lines", None, 200,
                                   [400, 401, 403, 404]),
    ("GET", "/v1/ledger/verify"): ("Recompute the hash chains", None, 200, [401, 403]),
    ("GET", "/v1/receipts/public-key"): ("Receipt verification keys (JWK set)", None, 200, []),
    ("POST", "/v1/receipts/verify"): ("Verify a receipt", VERIFY, 200, [400, 401, 413]),
}

_SLUG_QUERY: dict[str, Any] = {"type": "string", "pattern": schemas.SLUG}
_TIME: dict[str, Any] = {"type": "string", "format": "date-time"}
_CURSOR: dict[str, Any] = {"type": "string", "pattern": "^[0-9]{1,18}$"}
_FILTERS = [("dataset", _SLUG_QUERY), ("consumer", _SLUG_QUERY),
            ("status", {"enum": ["granted", "denied"]}), ("since", _TIME), ("until", _TIME)]
_QUERY: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "/v1/ledger": [*_FILTERS, ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                   ("cursor", _CURSOR)],
    "/v1/ledger/export": [("format", {"enum": ["csv", "jsonl"]}), *_FILTERS],
    "/v1/datasets/{name}/partitions": [
        ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
        ("cursor", {"type": "string", "pattern": "^[0-9]{1,9}$"})],
}
_CONTENT: dict[str, list[str]] = {
    "/metrics": ["text/plain"],
    "/v1/ledger/export": ["text/csv", "application/x-ndjson"],
}


def flask_path(path: str) -> str:
    if path == "/v1/consumers/{name}":
        return "/v1/consumers/<consumer_name:name>"
    return path.replace("{charge_id}", "<uuid:charge_uuid>").replace("{", "<").replace("}", ">")


def document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for (method, path), (summary, request_schema, success, errors) in OPERATIONS.items():
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": f"{method.lower()}_{path.strip('/').replace('/', '_')}"
                           .replace("{", "").replace("}", "").replace(".", "_"),
            "responses": {str(success): {"description": "success"} if success == 204 else {
                "description": "success",
                "content": {kind: {"schema": _OBJECT if kind.endswith("json") else
                                   {"type": "string"}}
                            for kind in _CONTENT.get(path, ["application/json"])}}},
        }
        for status in errors:
            operation["responses"][str(status)] = {
                "description": "problem", "content": {"application/problem+json": {
                    "schema": _PROBLEM}}}
        parameters = [{"name": name.strip("{}"), "in": "path", "required": True,
                       "schema": {"type": "string"}}
                      for name in path.split("/") if name.startswith("{")]
        parameters += [{"name": name, "in": "query", "required": False, "schema": schema}
                       for name, schema in _QUERY.get(path, []) if method == "GET"]
        if parameters:
            operation["parameters"] = parameters
        if request_schema is not None:
            operation["requestBody"] = {"required": method != "POST" or "keys" not in path,
                                        "content": {"application/json": {
                                            "schema": copy.deepcopy(request_schema)}}}
        if path.startswith("/v1/") and path != "/v1/receipts/public-key":
            operation["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Privacy-budget accountant", "version": "1"},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Problem": {
                "type": "object", "required": ["type", "title", "status", "detail"],
                "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                               "status": {"type": "integer"}, "detail": {"type": "string"},
                               "errors": {"type": "array"}}}},
        },
    }


@bp.get("/openapi.json")
def openapi() -> Any:
    return current_app.json.response(document())
