"""The rules the service enforces on a request beyond its JSON Schemas, stated for
/openapi.json.

The request schemas (``schemas``) validate every body first; the rules below are checked
in code after them, where a message can name the offending value and say what to do (a
duplicate partition key by its index, a quota by its dataset). So that a client learns
them from the document, ``request_schema`` states each one on a copy of the operation's
schema: as a JSON Schema keyword where one says exactly the same (``uniqueItems``,
``maxItems``, ``maximum``, ``enum``), else in its field's description. ``BODY`` and
``answers`` state what holds for every body and every request: the parser's limits and the
HTTP server's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accountant.config import Settings
from accountant.jsonio import MAX_EXPONENT, MAX_NUMBER_CHARACTERS
from accountant.services.plans import NOISE_PARAMETERS
from accountant.serving import REQUEST_FIELD_BYTES, REQUEST_FIELDS, REQUEST_LINE_BYTES

#: (where in the schema, the rule in words or None, the schema keywords that state it)
Rule = tuple[str, str | None, dict[str, Any]]


@dataclass(frozen=True)
class Limits:
    """The limits a deployment sets (README, "Configuration")."""

    max_body_bytes: int
    max_partitions_per_charge: int
    max_vector_length: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            settings.max_body_bytes,
            settings.max_partitions_per_charge,
            settings.max_vector_length,
        )


BODY = (
    "A JSON document. Besides its schema, the parser refuses (400): a number of more than "
    f"{MAX_NUMBER_CHARACTERS} characters or with a decimal exponent beyond "
    f"±{MAX_EXPONENT}; NaN and Infinity; an object with a duplicate key; a string with a "
    "lone UTF-16 surrogate escape (\\ud800-\\udfff unpaired); nesting deeper than the "
    "parser's recursion limit (about 1,000 levels)."
)

PARTITION_KEY = (
    "Printable characters only (no Unicode 'Other' or 'Separator' character but the ASCII "
    "space), and never '*', which stands alone for every declared partition."
)
_CONVERTED = (
    "On zcdp, rdp and gdp datasets a limit states epsilon, converted at its delta or else "
    "the dataset's (on zcdp, rho instead may be given)."
)
_BUDGET = (
    "A pure dataset's delta is 0 (give none, or 0); a zcdp, rdp or gdp dataset's budget "
    "has a delta of at least 1e-18, its epsilon converted at it"
)
_SERVICE_ONLY = (
    "Only consumers of role service take datasets and quotas: admins and auditors read "
    "every dataset."
)
_QUOTAS = (
    "Each quota is for one of the consumer's datasets, stated as the dataset's accounting "
    "mode states a limit. " + _CONVERTED
)


def _charge(limits: Limits) -> list[Rule]:
    most = limits.max_vector_length
    return [
        (
            "properties/partitions/anyOf/0",
            f"Each key at most once; at most {limits.max_partitions_per_charge} keys per "
            "charge (ACCOUNTANT_MAX_PARTITIONS_PER_CHARGE): charge '*' or split the release.",
            {"uniqueItems": True, "maxItems": limits.max_partitions_per_charge},
        ),
        ("properties/partitions/anyOf/0/items", PARTITION_KEY, {}),
        (
            "properties/params",
            "Validated against the mechanism's params_schema (GET /v1/mechanisms); "
            "sensitivity_unit, when given, is 'record' (or null).",
            {"properties": {"sensitivity_unit": {"enum": ["record", None]}}},
        ),
        (
            "properties/input",
            "Validated against the mechanism's input_schema (GET /v1/mechanisms); every "
            f"vector holds at most {most} values, and size is at most {most} "
            "(ACCOUNTANT_MAX_VECTOR_LENGTH).",
            {
                "properties": {"size": {"maximum": most, "maxItems": most}},
                "additionalProperties": {"maxItems": most},
            },
        ),
        (
            "properties/idempotency_key",
            "Printable characters only; when the Idempotency-Key header is sent too, the "
            "same value.",
            {},
        ),
    ]


def _plan(limits: Limits) -> list[Rule]:
    one = [
        *_charge(limits),
        (
            "properties/count",
            "With count, params leave out the mechanism's noise parameter (one of "
            f"{', '.join(sorted(NOISE_PARAMETERS))}), which the plan solves for.",
            {},
        ),
    ]
    return [(f"anyOf/0/{where}", text, keywords) for where, text, keywords in one] + [
        (
            "anyOf/1/properties/items",
            "Each item a charge body (POST /v1/charges, input optional) with a weight, its "
            "params leaving out the mechanism's noise parameter (one of "
            f"{', '.join(sorted(NOISE_PARAMETERS))}): the answer is the least noise for "
            "each such that all of them, charged as one batch, fit share of what every "
            "scope has left, each item's share of its dataset's measure proportional to "
            "its weight (docs/api.md).",
            {},
        ),
    ]


def _batch(limits: Limits) -> list[Rule]:
    return [
        (
            "properties/items",
            "Each item a charge body as POST /v1/charges takes it, within the same limits "
            f"(at most {limits.max_partitions_per_charge} partition keys, vectors of at "
            f"most {limits.max_vector_length} values), without hold or idempotency_key.",
            {},
        ),
    ]


def _limit_rules(budget: str) -> list[Rule]:
    return [
        ("properties/windows", "Each period at most once.", {}),
        ("properties/windows/items", _CONVERTED, {}),
        ("properties/partition_budget/anyOf/0", _CONVERTED, {}),
        ("properties/budget", budget, {}),
    ]


def _dataset_create(_limits: Limits) -> list[Rule]:
    return [
        *_limit_rules(_BUDGET + "."),
        ("properties/max_partitions_per_user", "Only with privacy_unit user.", {}),
        ("properties/max_records_per_user", "Only with privacy_unit user.", {}),
        ("properties/rdp_order", "Only with accounting rdp.", {}),
    ]


def _dataset_patch(_limits: Limits) -> list[Rule]:
    return _limit_rules(_BUDGET + " (the current delta unless another is given).")


def _partitions(_limits: Limits) -> list[Rule]:
    return [
        ("properties/keys", "Each key at most once.", {"uniqueItems": True}),
        ("properties/keys/items", PARTITION_KEY, {}),
    ]


def _consumer_create(_limits: Limits) -> list[Rule]:
    return [
        ("properties/name", "'me' is reserved (/v1/consumers/me is the caller's own).", {}),
        ("properties/datasets", _SERVICE_ONLY, {}),
        ("properties/quotas", _QUOTAS, {}),
    ]


def _consumer_patch(_limits: Limits) -> list[Rule]:
    return [
        ("properties/datasets", _SERVICE_ONLY, {}),
        ("properties/quotas", _QUOTAS + " A quota of null removes it.", {}),
    ]


_RULES: dict[tuple[str, str], Callable[[Limits], list[Rule]]] = {
    ("POST", "/v1/charges"): _charge,
    ("POST", "/v1/charges/preview"): _charge,
    ("POST", "/v1/charges/plan"): _plan,
    ("POST", "/v1/charges/batch"): _batch,
    ("POST", "/v1/datasets"): _dataset_create,
    ("PATCH", "/v1/datasets/{name}"): _dataset_patch,
    ("POST", "/v1/datasets/{name}/partitions"): _partitions,
    ("POST", "/v1/consumers"): _consumer_create,
    ("PATCH", "/v1/consumers/{name}"): _consumer_patch,
}


def request_schema(
    operation: tuple[str, str], schema: dict[str, Any], limits: Limits
) -> dict[str, Any]:
    """A copy of ``schema`` with every rule ``operation`` enforces beyond it stated."""
    stated = copy.deepcopy(schema)
    for where, text, keywords in _RULES[operation](limits) if operation in _RULES else []:
        node: Any = stated
        for step in where.split("/"):
            node = node[int(step)] if step.isdigit() else node[step]
        for keyword, value in keywords.items():
            node[keyword] = {**node.get(keyword, {}), **value} if keyword == "properties" else value
        if text is not None:
            before = node.get("description", "")
            node["description"] = f"{before.rstrip('.')}. {text}" if before else text
    return stated


def answers(limits: Limits, reads_body: bool) -> dict[int, str]:
    """What the service, or the HTTP server before it, answers any request it refuses whole:
    by status, the rule in words."""
    refused = {
        414: f"The request line (method, path with its query, and HTTP version) is longer "
        f"than {REQUEST_LINE_BYTES} bytes: answered by the HTTP server before the "
        "application. Send a shorter URL.",
        431: f"A header line is longer than {REQUEST_FIELD_BYTES} bytes, or there are more "
        f"than {REQUEST_FIELDS} headers: answered by the HTTP server before the "
        "application. Send fewer or shorter headers.",
    }
    if reads_body:
        refused[413] = (
            f"The body is larger than {limits.max_body_bytes} bytes "
            "(ACCOUNTANT_MAX_BODY_BYTES), declared or chunked. Send less data."
        )
    return refused
