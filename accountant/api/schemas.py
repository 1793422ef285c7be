"""JSON Schemas of the request bodies: the one source that validates requests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from accountant.accounting.windows import PERIODS
from accountant.api.quick_accept import Check, compile_check
from accountant.api.schema_messages import plain
from accountant.errors import InvalidRequest, field_error
from accountant.exact import MAX_EPSILON, MAX_RHO

# (?!\n): Python's $ also matches before a final newline, which ECMA-262's does not
SLUG = r"^[a-z0-9][a-z0-9_-]{0,62}$(?!\n)"
#: Each pattern in words, for the messages of the values that miss it.
_PATTERNS = {
    SLUG: "a name of 1 to 63 characters, each a lowercase letter, a digit, a hyphen or an "
    "underscore, the first a letter or digit",
}
EPSILON: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": int(MAX_EPSILON)}
DELTA: dict[str, Any] = {"type": "number", "minimum": 0, "exclusiveMaximum": 1}
RHO: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": int(MAX_RHO)}


def _amount(required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"epsilon": EPSILON, "delta": DELTA, "rho": RHO},
        "required": required,
        "additionalProperties": False,
        "minProperties": 1,
    }


BUDGET = _amount(["epsilon"])
SUB_BUDGET = _amount([])
WINDOW: dict[str, Any] = {
    "type": "object",
    "properties": {
        "period": {"enum": sorted(PERIODS, key=PERIODS.__getitem__)},
        "epsilon": EPSILON,
        "delta": DELTA,
        "rho": RHO,
    },
    "required": ["period"],
    "additionalProperties": False,
    "minProperties": 2,
}
BOUND: dict[str, Any] = {"type": ["integer", "null"], "minimum": 1, "maximum": 1_000_000_000}

DATASET_CREATE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": SLUG},
        "privacy_unit": {"enum": ["record", "user", "partition"]},
        "max_partitions_per_user": BOUND,
        "max_records_per_user": BOUND,
        "accounting": {
            "enum": ["pure", "approx", "zcdp", "rdp", "gdp"],
            "default": "approx",
            "description": "how the dataset composes its releases, fixed for life: approx "
            "(the default when omitted: epsilons and deltas add), pure, zcdp, rdp or gdp "
            "(docs/accounting.md)",
        },
        "rdp_order": {
            "type": "number",
            "exclusiveMinimum": 1,
            "maximum": 1000000,
            "description": "the Renyi order of an rdp dataset, fixed for life; "
            "by default the best for its budget",
        },
        "composition": {
            "enum": ["basic", "advanced"],
            "description": "approx only, fixed for life: basic composition (epsilons and "
            "deltas add; the default) or the advanced-composition filter of Whitehouse, "
            "Ramdas, Rogers and Wu 2023",
        },
        "composition_delta": {
            "type": "number",
            "exclusiveMinimum": 0,
            "exclusiveMaximum": 1,
            "description": "advanced composition only, fixed for life: delta', the share of "
            "budget.delta the filter keeps for itself; by default half of budget.delta",
        },
        "budget": BUDGET,
        "partition_budget": {"anyOf": [SUB_BUDGET, {"type": "null"}]},
        "windows": {"type": "array", "items": WINDOW, "maxItems": len(PERIODS)},
        "description": {"type": "string", "maxLength": 1000},
        "population": {
            "type": "string",
            "pattern": SLUG,
            "description": "the population the dataset joins, for life: its privacy unit "
            "must be user and its accounting (and rdp order) the population's",
        },
    },
    "required": ["name", "privacy_unit", "budget"],
    "additionalProperties": False,
}

DATASET_PATCH: dict[str, Any] = {
    "type": "object",
    "properties": {
        "budget": BUDGET,
        "partition_budget": {"anyOf": [SUB_BUDGET, {"type": "null"}]},
        "windows": {"type": "array", "items": WINDOW, "maxItems": len(PERIODS)},
        "reason": {"type": "string", "maxLength": 1000},
    },
    "additionalProperties": False,
    "minProperties": 1,
}

POPULATION_CREATE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": SLUG},
        "privacy_unit": {
            "enum": ["record", "user", "partition"],
            "description": "user: a population counts people (any other unit is refused)",
        },
        "accounting": {
            "enum": ["pure", "approx", "zcdp", "rdp", "gdp"],
            "default": "approx",
            "description": "the mode in which its datasets' losses add, fixed for life; every "
            "member dataset has the same (approx: with basic composition)",
        },
        "rdp_order": {
            "type": "number",
            "exclusiveMinimum": 1,
            "maximum": 1000000,
            "description": "the Renyi order of an rdp population and of all its datasets, "
            "fixed for life; by default the best for its budget",
        },
        "budget": BUDGET,
        "reason": {"type": "string", "maxLength": 1000},
    },
    "required": ["name", "privacy_unit", "budget"],
    "additionalProperties": False,
}

POPULATION_PATCH: dict[str, Any] = {
    "type": "object",
    "properties": {"budget": BUDGET, "reason": {"type": "string", "maxLength": 1000}},
    "required": ["budget"],
    "additionalProperties": False,
}

REASON: dict[str, Any] = {"type": "string", "maxLength": 1000}

REQUEST_CREATE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"const": "quota"},
        "dataset": {"type": "string", "pattern": SLUG},
        "quota": SUB_BUDGET,
        "reason": REASON,
    },
    "required": ["kind", "dataset", "quota", "reason"],
    "additionalProperties": False,
}

REQUEST_DECISION: dict[str, Any] = {
    "type": "object",
    "properties": {"reason": REASON},
    "required": ["reason"],
    "additionalProperties": False,
}

PARTITION_KEY: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 128}

PARTITIONS_DECLARE: dict[str, Any] = {
    "type": "object",
    "properties": {"keys": {"type": "array", "items": PARTITION_KEY, "minItems": 1}},
    "required": ["keys"],
    "additionalProperties": False,
}

CONSUMER_CREATE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": SLUG},
        "role": {"enum": ["admin", "service", "auditor"]},
        "datasets": {
            "type": "array",
            "items": {"type": "string", "pattern": SLUG},
            "uniqueItems": True,
        },
        "quotas": {
            "type": "object",
            "additionalProperties": SUB_BUDGET,
            "description": "the most this consumer may spend of each granted dataset, keyed by "
            'dataset name: {"clicks": {"epsilon": 3}} (an amount, as a sub-budget: epsilon, '
            "optionally delta, or rho on zcdp); none by default",
        },
        "reason": {"type": "string", "maxLength": 1000},
    },
    "required": ["name", "role"],
    "additionalProperties": False,
}

CONSUMER_PATCH: dict[str, Any] = {
    "type": "object",
    "properties": {
        "datasets": CONSUMER_CREATE["properties"]["datasets"],
        "quotas": {
            "type": "object",
            "additionalProperties": {"oneOf": [SUB_BUDGET, {"type": "null"}]},
            "description": "quotas to set, keyed by dataset name as on creation; a dataset "
            "left out keeps its quota",
        },
        "reason": {"type": "string", "maxLength": 1000},
    },
    "additionalProperties": False,
    "minProperties": 1,
}

KEY_CREATE: dict[str, Any] = {
    "type": "object",
    "properties": {"reason": {"type": "string", "maxLength": 1000}},
    "additionalProperties": False,
}

CHARGE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "dataset": {"type": "string", "minLength": 1, "maxLength": 63},
        "partitions": {
            "anyOf": [  # the list first: generated clients try the forms in order
                {"type": "array", "items": PARTITION_KEY, "minItems": 1},
                {"const": "*"},
            ]
        },
        "release": {"enum": ["joint", "parallel"]},
        "mechanism": {"type": "string", "minLength": 1, "maxLength": 63},
        "params": {"type": "object"},
        "input": {"type": "object"},
        "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 255},
        "hold": {
            "type": "string",
            "minLength": 1,
            "maxLength": 36,
            "description": "the id of a hold to draw on (POST /v1/holds): its remainder pays",
        },
    },
    "required": ["dataset", "partitions", "mechanism", "params", "input"],
    "additionalProperties": False,
}
PREVIEW: dict[str, Any] = {**CHARGE, "required": ["dataset", "partitions", "mechanism", "params"]}
PLAN: dict[str, Any] = {
    **PREVIEW,
    "properties": {
        **CHARGE["properties"],
        "count": {"type": "integer", "minimum": 1, "maximum": 10**9},
    },
}

#: A weighted plan: each item a charge body with its noise parameter left out and a weight;
#: the least noise such that all of them fit ``share`` of what remains.
PLAN_WEIGHTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {"type": "object"},
            "minItems": 1,
            "maxItems": 100,
        },
        "share": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "delta": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    },
    "required": ["items"],
    "additionalProperties": False,
}
PLAN_ITEM: dict[str, Any] = {
    **PREVIEW,
    "properties": {
        **PREVIEW["properties"],
        "weight": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000},
    },
    "required": [*PREVIEW["required"], "weight"],
}

#: A body that is an object, to be checked against one of several forms.
ANY_OBJECT: dict[str, Any] = {"type": "object"}

#: What /v1/charges/plan takes: one charge (``PLAN``) or a weighted list (``PLAN_WEIGHTED``).
PLAN_EITHER: dict[str, Any] = {"anyOf": [PLAN, PLAN_WEIGHTED]}

#: A batch: 1 to 1000 charges granted all together or none (DESIGN.md, release plans);
#: each item is checked against ``CHARGE`` on its own, so that its errors name it.
BATCH: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "object"}, "minItems": 1, "maxItems": 1000},
        "delta": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "idempotency_key": CHARGE["properties"]["idempotency_key"],
    },
    "required": ["items"],
    "additionalProperties": False,
}

#: A hold: a charge's dataset, partitions and release, and an amount in the dataset's
#: measure or a mechanism and its parameters to price it (DESIGN.md, holds).
HOLD: dict[str, Any] = {
    "type": "object",
    "properties": {
        **{name: CHARGE["properties"][name] for name in ("dataset", "partitions", "release")},
        "amount": {
            "type": "object",
            "properties": {"epsilon": EPSILON, "delta": DELTA, "rho": RHO, "rdp": RHO, "mu": RHO},
            "additionalProperties": False,
            "minProperties": 1,
        },
        "mechanism": CHARGE["properties"]["mechanism"],
        "params": {"type": "object"},
        "expires_in": {"type": "integer", "minimum": 1, "maximum": 7 * 24 * 3600},
        "purpose": {"type": "string", "maxLength": 500},
        "idempotency_key": CHARGE["properties"]["idempotency_key"],
    },
    "required": ["dataset", "partitions", "expires_in"],
    "oneOf": [
        {"required": ["amount"], "not": {"anyOf": [{"required": ["mechanism"]}]}},
        {"required": ["mechanism", "params"], "not": {"required": ["amount"]}},
    ],
    "additionalProperties": False,
}

#: A settle: what the job used in all (draws included), in the dataset's measure, or the
#: parameters of what ran outside the accountant, merged into the hold's mechanism's.
_USED_PART: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": int(MAX_EPSILON)}
SETTLE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "used": {
            "type": "object",
            "properties": {name: _USED_PART for name in ("epsilon", "rho", "rdp", "mu")}
            | {"delta": DELTA},
            "additionalProperties": False,
            "minProperties": 1,
        },
        "params": {"type": "object", "minProperties": 1},
        "idempotency_key": CHARGE["properties"]["idempotency_key"],
    },
    "oneOf": [{"required": ["used"]}, {"required": ["params"]}],
    "additionalProperties": False,
}
#: A release: settling at what charges drew (the body may be empty).
RELEASE: dict[str, Any] = {
    "type": "object",
    "properties": {"idempotency_key": CHARGE["properties"]["idempotency_key"]},
    "additionalProperties": False,
}

#: Compiled validators by schema object. The entry keeps its schema alive and is used only
#: for that very object, so an id can never be reused by another schema.
_VALIDATORS: dict[int, tuple[Mapping[str, Any], Draft202012Validator, Check | None]] = {}


def is_valid(schema: Mapping[str, Any], instance: Any) -> bool:
    try:
        validate(schema, instance)
    except InvalidRequest:
        return False
    return True


def validate(schema: Mapping[str, Any], instance: Any, prefix: str = "") -> None:
    """Raise a 400 listing every violation of ``schema``, each with its dotted field path.

    Pass long-lived schema objects (module constants, a mechanism's own schema): each
    distinct object is compiled once. A body the quick check accepts is valid; any other
    is validated in full (``quick_accept``).
    """
    entry = _VALIDATORS.get(id(schema))
    if entry is None or entry[0] is not schema:
        entry = _VALIDATORS[id(schema)] = (
            schema,
            Draft202012Validator(schema),
            compile_check(schema),
        )
    _, validator, quick = entry
    if quick is not None and quick(instance):
        return
    problems = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if not problems:
        return
    errors = [
        {"field": field, "message": message}
        for error in problems
        for field, message in plain(error, prefix, _PATTERNS)
    ]
    summary = "; ".join(e["message"] for e in errors[:5])
    raise InvalidRequest(f"the request is invalid: {summary}", errors=errors)


def check_partition_keys(keys: list[str], field_name: str) -> None:
    """Partition keys: printable, never ``*``, no duplicates."""
    seen: set[str] = set()
    for index, key in enumerate(keys):
        if key == "*" or not key.isprintable():
            raise field_error(
                f"{field_name}.{index}",
                "a partition key is 1 to 128 printable characters and never *",
            )
        if key in seen:
            raise field_error(
                f"{field_name}.{index}", f'the key "{key}" comes twice; send each key once'
            )
        seen.add(key)
