"""``GET /openapi.json``: the OpenAPI 3.1 document, from the schemas that validate requests and
the rules the service enforces beyond them (``rules``), with this deployment's limits."""

from __future__ import annotations

import copy
from typing import Any

from flask import Blueprint, current_app, request

from accountant.api import responses, rules, schemas
from accountant.api.receipts import VERIFY
from accountant.config import Settings
from accountant.models.admin_chain import ADMINS
from accountant.web import runtime

bp = Blueprint("openapi", __name__)

_PROBLEM = {"$ref": "#/components/schemas/Problem"}
_OBJECT: dict[str, Any] = {"type": "object"}

#: (method, path) -> (summary, request schema or None, success status, error statuses); every
#: operation may also be answered 414 and 431, and one with a request schema 413 (``rules``)
OPERATIONS: dict[tuple[str, str], tuple[str, dict[str, Any] | None, int, list[int]]] = {
    ("GET", "/healthz"): ("Liveness", None, 200, []),
    ("GET", "/readyz"): (
        "Readiness: the database answers and the schema is current",
        None,
        200,
        [503],
    ),
    ("GET", "/openapi.json"): ("This document", None, 200, []),
    ("GET", "/metrics"): ("Prometheus metrics", None, 200, []),
    ("GET", "/v1/mechanisms"): ("Registered mechanisms", None, 200, [401]),
    ("POST", "/v1/datasets"): (
        "Register a dataset",
        schemas.DATASET_CREATE,
        201,
        [400, 401, 403, 409],
    ),
    ("GET", "/v1/datasets"): ("Datasets visible to the caller", None, 200, [401]),
    ("GET", "/v1/datasets/{name}"): ("One dataset", None, 200, [401, 403, 404]),
    ("PATCH", "/v1/datasets/{name}"): (
        "Change limits (ledgered)",
        schemas.DATASET_PATCH,
        200,
        [400, 401, 403, 404, 409],
    ),
    ("POST", "/v1/datasets/{name}/partitions"): (
        "Declare partitions",
        schemas.PARTITIONS_DECLARE,
        201,
        [400, 401, 403, 404],
    ),
    ("GET", "/v1/datasets/{name}/budget"): (
        "Loss, limits and remaining budget",
        None,
        200,
        [401, 403, 404],
    ),
    ("GET", "/v1/datasets/{name}/partitions"): (
        "Partitions and their spend",
        None,
        200,
        [400, 401, 403, 404],
    ),
    ("POST", "/v1/populations"): (
        "Register a population: a lifetime budget over datasets of the same people",
        schemas.POPULATION_CREATE,
        201,
        [400, 401, 403, 409],
    ),
    ("GET", "/v1/populations"): ("Populations", None, 200, [401, 403]),
    ("GET", "/v1/populations/{name}"): ("One population", None, 200, [401, 403, 404]),
    ("PATCH", "/v1/populations/{name}"): (
        "Change its limit (ledgered in its own chain)",
        schemas.POPULATION_PATCH,
        200,
        [400, 401, 403, 404],
    ),
    ("GET", "/v1/populations/{name}/budget"): (
        "Its loss (the sum of its datasets'), limit, remaining, and each dataset's loss",
        None,
        200,
        [401, 403, 404],
    ),
    ("POST", "/v1/consumers"): (
        "Create a consumer and its first key",
        schemas.CONSUMER_CREATE,
        201,
        [400, 401, 403, 404, 409],
    ),
    ("GET", "/v1/consumers"): ("Consumers, without keys", None, 200, [401, 403]),
    ("PATCH", "/v1/consumers/{name}"): (
        "Change grants and quotas (ledgered)",
        schemas.CONSUMER_PATCH,
        200,
        [400, 401, 403, 404, 409],
    ),
    ("GET", "/v1/consumers/me"): ("The caller's consumer, quotas and their use", None, 200, [401]),
    ("POST", "/v1/consumers/{name}/keys"): (
        "Issue a key",
        schemas.KEY_CREATE,
        201,
        [400, 401, 403, 404, 409],
    ),
    ("DELETE", "/v1/keys/{key_id}"): ("Revoke a key", None, 204, [401, 403, 404]),
    ("POST", "/v1/charges"): (
        "Charge the budgets and run the mechanism",
        schemas.CHARGE,
        201,
        [400, 401, 403, 404, 409, 422, 429, 503],
    ),
    ("POST", "/v1/charges/batch"): (
        "Charge a release plan: every item or none, each with its output (idempotent)",
        schemas.BATCH,
        201,
        [400, 401, 403, 404, 409, 422, 429, 503],
    ),
    ("POST", "/v1/charges/preview"): (
        "Price and check without charging",
        schemas.PREVIEW,
        200,
        [400, 401, 403, 404],
    ),
    ("POST", "/v1/charges/plan"): (
        "How many more identical charges fit, the least-noise parameter for count of them, "
        "or the least noise for each item of a weighted list",
        schemas.PLAN_EITHER,
        200,
        [400, 401, 403, 404],
    ),
    ("GET", "/v1/charges/{charge_id}"): ("One charge as recorded", None, 200, [401, 403, 404]),
    ("POST", "/v1/requests"): (
        "A service asks for a quota; an admin approves or denies",
        schemas.REQUEST_CREATE,
        202,
        [400, 401, 403, 404],
    ),
    ("GET", "/v1/requests"): ("Requests for approval", None, 200, [400, 401, 403]),
    ("GET", "/v1/requests/{request_id}"): ("One request", None, 200, [401, 403, 404]),
    ("POST", "/v1/requests/{request_id}/approve"): (
        "Approve another admin's or a service's request: its change applies (ledgered)",
        schemas.REQUEST_DECISION,
        200,
        [400, 401, 403, 404, 409],
    ),
    ("POST", "/v1/requests/{request_id}/deny"): (
        "Deny a request: nothing changes",
        schemas.REQUEST_DECISION,
        200,
        [400, 401, 403, 404, 409],
    ),
    ("GET", "/v1/ledger"): ("Ledger entries, oldest first", None, 200, [400, 401, 403, 404]),
    ("GET", "/v1/ledger/export"): (
        "The filtered entries as CSV or JSON Lines",
        None,
        200,
        [400, 401, 403, 404],
    ),
    ("POST", "/v1/holds"): (
        "Reserve budget for a job that runs elsewhere, charged at once (idempotent)",
        schemas.HOLD,
        201,
        [400, 401, 403, 404, 409, 422, 429, 503],
    ),
    ("POST", "/v1/holds/{hold_id}/settle"): (
        "Settle a hold at what its job used; the rest goes back (idempotent)",
        schemas.SETTLE,
        200,
        [400, 401, 403, 404, 409, 422, 503],
    ),
    ("POST", "/v1/holds/{hold_id}/release"): (
        "Settle a hold at what its charges drew (idempotent)",
        schemas.RELEASE,
        200,
        [400, 401, 403, 404, 409, 422, 503],
    ),
    ("GET", "/v1/holds"): ("Holds visible to the caller", None, 200, [400, 401, 403, 404]),
    ("GET", "/v1/holds/{hold_id}"): ("One hold", None, 200, [401, 403, 404]),
    ("GET", "/v1/ledger/verify"): ("Recompute the hash chains", None, 200, [401, 403]),
    ("GET", "/v1/receipts/public-key"): ("Receipt verification keys (JWK set)", None, 200, []),
    ("POST", "/v1/receipts/verify"): ("Verify a receipt", VERIFY, 200, [400, 401]),
}

#: The operations that, with approvals on, may answer 202 with a pending request.
PENDING = {
    ("PATCH", "/v1/datasets/{name}"),
    ("PATCH", "/v1/populations/{name}"),
    ("POST", "/v1/consumers"),
    ("POST", "/v1/consumers/{name}/keys"),
}

#: (method, path) -> (operation id, schema of the success answer, or None for none or text)
ANSWERS: dict[tuple[str, str], tuple[str, str | None]] = {
    ("GET", "/healthz"): ("health", "Health"),
    ("GET", "/readyz"): ("readiness", "Health"),
    ("GET", "/openapi.json"): ("openapiDocument", None),
    ("GET", "/metrics"): ("metrics", None),
    ("GET", "/v1/mechanisms"): ("listMechanisms", "MechanismList"),
    ("POST", "/v1/datasets"): ("createDataset", "Dataset"),
    ("GET", "/v1/datasets"): ("listDatasets", "DatasetList"),
    ("GET", "/v1/datasets/{name}"): ("getDataset", "Dataset"),
    ("PATCH", "/v1/datasets/{name}"): ("updateDataset", "DatasetUpdate"),
    ("POST", "/v1/datasets/{name}/partitions"): ("declarePartitions", "PartitionsDeclared"),
    ("GET", "/v1/datasets/{name}/budget"): ("getBudget", "Budget"),
    ("GET", "/v1/datasets/{name}/partitions"): ("listPartitions", "PartitionPage"),
    ("POST", "/v1/populations"): ("createPopulation", "Population"),
    ("GET", "/v1/populations"): ("listPopulations", "PopulationList"),
    ("GET", "/v1/populations/{name}"): ("getPopulation", "Population"),
    ("PATCH", "/v1/populations/{name}"): ("updatePopulation", "PopulationUpdate"),
    ("GET", "/v1/populations/{name}/budget"): ("getPopulationBudget", "PopulationBudget"),
    ("POST", "/v1/consumers"): ("createConsumer", "NewConsumer"),
    ("GET", "/v1/consumers"): ("listConsumers", "ConsumerList"),
    ("PATCH", "/v1/consumers/{name}"): ("updateConsumer", "ConsumerUpdate"),
    ("GET", "/v1/consumers/me"): ("getMyConsumer", "Consumer"),
    ("POST", "/v1/consumers/{name}/keys"): ("createKey", "NewKey"),
    ("DELETE", "/v1/keys/{key_id}"): ("revokeKey", None),
    ("POST", "/v1/charges"): ("createCharge", "Charge"),
    ("POST", "/v1/charges/batch"): ("createBatch", "Batch"),
    ("POST", "/v1/charges/preview"): ("previewCharge", "Preview"),
    ("POST", "/v1/charges/plan"): ("planCharges", "Plan"),
    ("GET", "/v1/charges/{charge_id}"): ("getCharge", "ChargeRecord"),
    ("POST", "/v1/holds"): ("createHold", "Hold"),
    ("POST", "/v1/holds/{hold_id}/settle"): ("settleHold", "Settlement"),
    ("POST", "/v1/holds/{hold_id}/release"): ("releaseHold", "Settlement"),
    ("GET", "/v1/holds"): ("listHolds", "HoldList"),
    ("GET", "/v1/holds/{hold_id}"): ("getHold", "Hold"),
    ("POST", "/v1/requests"): ("createRequest", "ChangeRequest"),
    ("GET", "/v1/requests"): ("listRequests", "ChangeRequestList"),
    ("GET", "/v1/requests/{request_id}"): ("getRequest", "ChangeRequest"),
    ("POST", "/v1/requests/{request_id}/approve"): ("approveRequest", "ChangeRequestDecided"),
    ("POST", "/v1/requests/{request_id}/deny"): ("denyRequest", "ChangeRequestDecided"),
    ("GET", "/v1/ledger"): ("listLedgerEntries", "LedgerPage"),
    ("GET", "/v1/ledger/export"): ("exportLedger", None),
    ("GET", "/v1/ledger/verify"): ("verifyLedger", "LedgerVerification"),
    ("GET", "/v1/receipts/public-key"): ("getReceiptKeys", "JWKSet"),
    ("POST", "/v1/receipts/verify"): ("verifyReceipt", "ReceiptVerification"),
}

_TAGS = [
    ("/v1/charges", "charges"),
    ("/v1/datasets", "datasets"),
    ("/v1/populations", "populations"),
    ("/v1/consumers", "consumers"),
    ("/v1/keys", "consumers"),
    ("/v1/holds", "holds"),
    ("/v1/ledger", "ledger"),
    ("/v1/requests", "requests"),
    ("/v1/receipts", "receipts"),
    ("/v1/mechanisms", "mechanisms"),
    ("/", "service"),
]

_RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds until a retry may succeed (429: until the window resets)",
        "schema": {"type": "integer"},
    }
}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "a unique string per logical charge: a retry with the same "
    "key and body returns the first answer, charged once. Printable characters only; "
    "when the body's idempotency_key is sent too, the same value",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
}

_SLUG_QUERY: dict[str, Any] = {"type": "string", "pattern": schemas.SLUG}
#: A ledger filter's chain: a dataset's or a population's name, or the admins' chain's.
_CHAIN_QUERY: dict[str, Any] = {
    "type": "string",
    "pattern": schemas.SLUG.replace("^", f"^(?:{ADMINS}|", 1).replace("$", ")$", 1),
}
_TIME: dict[str, Any] = {"type": "string", "format": "date-time"}
_CURSOR: dict[str, Any] = {"type": "string", "pattern": "^[0-9]{1,18}$"}
_FILTERS = [
    ("dataset", _CHAIN_QUERY),
    ("consumer", _SLUG_QUERY),
    ("status", {"enum": ["granted", "denied"]}),
    ("since", _TIME),
    ("until", _TIME),
]
_QUERY: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "/v1/ledger": [
        *_FILTERS,
        ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
        ("cursor", _CURSOR),
    ],
    "/v1/ledger/export": [("format", {"enum": ["csv", "jsonl"]}), *_FILTERS],
    "/v1/holds": [("dataset", _SLUG_QUERY), ("state", {"enum": ["open", "settled", "expired"]})],
    "/v1/requests": [
        ("state", {"enum": ["pending", "approved", "denied", "expired"]}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
        ("cursor", {"type": "string", "pattern": "^[0-9]{1,18}_[0-9a-f-]{1,36}$"}),
    ],
    "/v1/datasets/{name}/partitions": [
        ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
        ("cursor", {"type": "string", "pattern": "^[0-9]{1,9}$"}),
    ],
}
_CONTENT: dict[str, list[str]] = {
    "/metrics": ["text/plain"],
    "/v1/ledger/export": ["text/csv", "application/x-ndjson"],
}


def flask_path(path: str) -> str:
    if path == "/v1/consumers/{name}":
        return "/v1/consumers/<consumer_name:name>"
    return (
        path.replace("{charge_id}", "<uuid:charge_uuid>")
        .replace("{hold_id}", "<uuid:hold_uuid>")
        .replace("{", "<")
        .replace("}", ">")
    )


def _problem(description: str = "problem") -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _PROBLEM}},
    }


def document(server: str | None = None, settings: Settings | None = None) -> dict[str, Any]:
    limits = rules.Limits.of(settings or Settings())
    paths: dict[str, Any] = {}
    for (method, path), (summary, request_schema, success, errors) in OPERATIONS.items():
        operation_id, answer = ANSWERS[(method, path)]
        answer_schema = _OBJECT if answer is None else {"$ref": f"#/components/schemas/{answer}"}
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": operation_id,
            "tags": [next(tag for prefix, tag in _TAGS if path.startswith(prefix))],
            "responses": {
                str(success): {"description": "success"}
                if success == 204
                else {
                    "description": "success",
                    "content": {
                        kind: {
                            "schema": answer_schema if kind.endswith("json") else {"type": "string"}
                        }
                        for kind in _CONTENT.get(path, ["application/json"])
                    },
                }
            },
        }
        if (method, path) in PENDING:
            operation["responses"]["202"] = {
                "description": "with approvals on (ACCOUNTANT_APPROVALS=on), a change that "
                "raises a privacy limit or makes a new admin: kept as a pending request, "
                "nothing changed until another admin approves it (reason required)",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ChangeRequest"}}
                },
            }
        for status in errors:
            operation["responses"][str(status)] = _problem()
            if status in (429, 503):
                operation["responses"][str(status)]["headers"] = copy.deepcopy(_RETRY_AFTER)
        parameters = [
            {"name": name.strip("{}"), "in": "path", "required": True, "schema": {"type": "string"}}
            for name in path.split("/")
            if name.startswith("{")
        ]
        parameters += [
            {"name": name, "in": "query", "required": False, "schema": schema}
            for name, schema in _QUERY.get(path, [])
            if method == "GET"
        ]
        if method == "POST" and (
            path in ("/v1/charges", "/v1/charges/batch") or path.startswith("/v1/holds")
        ):
            parameters.append(copy.deepcopy(_IDEMPOTENCY_KEY))
        if parameters:
            operation["parameters"] = parameters
        for status, rule in sorted(rules.answers(limits, request_schema is not None).items()):
            operation["responses"][str(status)] = _problem(rule)
        operation["responses"] = dict(sorted(operation["responses"].items()))
        if request_schema is not None:
            schema = rules.request_schema((method, path), request_schema, limits)
            operation["requestBody"] = {
                "description": rules.BODY,
                "required": method != "POST" or "keys" not in path,
                "content": {"application/json": {"schema": schema}},
            }
        if path.startswith("/v1/") and path != "/v1/receipts/public-key":
            operation["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Privacy-budget accountant", "version": "1"},
        "servers": [{"url": server or "/", "description": "this service"}],
        "tags": [{"name": tag} for tag in dict.fromkeys(tag for _, tag in _TAGS)],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": copy.deepcopy(responses.SCHEMAS),
        },
    }


@bp.get("/openapi.json")
def openapi() -> Any:
    return current_app.json.response(document(request.host_url.rstrip("/"), runtime().settings))
