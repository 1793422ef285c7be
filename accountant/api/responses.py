"""JSON Schemas of the answers (API.md), for /openapi.json: what a generated client parses.
Objects list the fields API.md fixes and allow more (the contract adds fields freely)."""

from __future__ import annotations

from typing import Any


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(required: list[str], doc: str = "", /, **properties: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if doc:
        schema["description"] = doc
    return schema


def _list(item: Any) -> dict[str, Any]:
    return {"type": "array", "items": item}


STRING: dict[str, Any] = {"type": "string"}
INTEGER: dict[str, Any] = {"type": "integer"}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
OPTIONAL_STRING: dict[str, Any] = {"type": ["string", "null"]}
OPTIONAL_AMOUNT: dict[str, Any] = {"anyOf": [_ref("Amount"), {"type": "null"}]}
TIME: dict[str, Any] = {"type": "string", "format": "date-time"}
STRINGS = _list(STRING)

SCHEMAS: dict[str, dict[str, Any]] = {
    "Amount": {
        "type": "object",
        "properties": {
            "measure": {
                "enum": ["epsilon", "rho", "rdp", "mu2"],
                "description": "the field that adds up and that limits bind: the figure to "
                "plan with (docs/accounting.md, 'Which figures add up')",
            },
            "additive": {
                "type": "array",
                "items": {"enum": ["epsilon", "delta", "rho", "rdp", "mu2"]},
                "description": "every field of this amount that adds up: loss + remaining = "
                "limit in each, and costs sum in each",
            },
            "epsilon_alone": {
                "type": "number",
                "description": "where epsilon does not add (every mode but pure and approx "
                "with basic composition): the epsilon of this amount by itself, the same "
                "figure as epsilon; never add or subtract it",
            },
            "mu2": {"type": "number", "description": "gdp: mu^2, which adds (mu does not)"},
        },
        "additionalProperties": {"type": "number"},
        "description": "epsilon and delta; rho on zcdp and on approx datasets with "
        "advanced composition, rdp and order on rdp, mu and mu2 on gdp datasets "
        "(DESIGN.md); a reported amount (not a limit as stated) also names its measure, "
        "the fields that add up, and an epsilon that does not as epsilon_alone",
    },
    "FieldError": _object(["field", "message"], field=STRING, message=STRING),
    "Problem": _object(
        ["type", "title", "status", "detail"],
        "application/problem+json (RFC 9457); a denial "
        "adds scope, limit, spent and requested, with partition or resets_at",
        type=STRING,
        title=STRING,
        status=INTEGER,
        detail=STRING,
        errors=_list(_ref("FieldError")),
        scope=STRING,
        partition=OPTIONAL_STRING,
        limit=_ref("Amount"),
        spent=_ref("Amount"),
        requested=_ref("Amount"),
        multiplicity=INTEGER,
        resets_at=STRING,
        batch_id=STRING,
        denials=_list(
            _object(
                ["item", "dataset", "scope", "limit", "spent", "requested"],
                "a scope the refused batch would take over its limit: spent is its loss "
                "before the batch, requested what the whole batch adds to it, item the "
                "first item that takes it over",
                item=INTEGER,
                dataset=STRING,
                scope=STRING,
                partition=OPTIONAL_STRING,
                population=OPTIONAL_STRING,
                limit=_ref("Amount"),
                spent=_ref("Amount"),
                requested=_ref("Amount"),
                resets_at=STRING,
            )
        ),
    ),
    "Health": _object(["status"], status=STRING, schema=STRING),
    "Charge": _object(
        [
            "charge_id",
            "dataset",
            "mechanism",
            "partitions",
            "cost",
            "output",
            "remaining",
            "receipt",
            "created_at",
        ],
        "a granted charge: the noisy output and its receipt",
        charge_id=STRING,
        dataset=STRING,
        mechanism=STRING,
        release=STRING,
        partitions=STRINGS,
        cost=_ref("Amount"),
        multiplicity=INTEGER,
        charged=_ref("Amount"),
        output=ANY_OBJECT,
        remaining=_ref("Amount"),
        receipt=STRING,
        created_at=TIME,
        ledger=_object(["seq", "hash"], seq=INTEGER, hash=STRING),
        batch_id=STRING,
        group=INTEGER,
    ),
    "Batch": _object(
        ["batch_id", "items", "cost"],
        "a granted batch: each item's own charge (output, receipt, ledger entry), and what "
        "the batch charged each dataset",
        batch_id=STRING,
        items=_list(_ref("Charge")),
        cost={"type": "object", "additionalProperties": _ref("Amount")},
    ),
    "Hold": _object(
        ["hold_id", "dataset", "partitions", "release", "amount", "drawn", "state", "expires_at"],
        "budget reserved for a job that runs elsewhere, charged in full when granted; "
        "an open hold reads expired from its expires_at on",
        hold_id=STRING,
        dataset=STRING,
        consumer=OPTIONAL_STRING,
        partitions=STRINGS,
        release=STRING,
        mechanism=OPTIONAL_STRING,
        params=ANY_OBJECT,
        amount=_ref("Amount"),
        multiplicity=INTEGER,
        charged=_ref("Amount"),
        drawn=_ref("Amount"),
        state={"enum": ["open", "settled", "expired"]},
        purpose=OPTIONAL_STRING,
        remaining=_ref("Amount"),
        receipt=STRING,
        created_at=TIME,
        expires_at=TIME,
        settled_at={"anyOf": [TIME, {"type": "null"}]},
        settled_by=OPTIONAL_STRING,
        used={"anyOf": [_ref("Amount"), {"type": "null"}]},
        returned={"anyOf": [_ref("Amount"), {"type": "null"}]},
        ledger=_object(["seq", "hash"], seq=INTEGER, hash=STRING),
    ),
    "HoldList": _object(["holds"], holds=_list(_ref("Hold"))),
    "Settlement": _object(
        ["hold_id", "state", "amount", "drawn", "used", "returned", "receipt"],
        "a hold settled: what its job used in all and what went back to its scopes, with "
        "a receipt of kind settle",
        hold_id=STRING,
        dataset=STRING,
        partitions=STRINGS,
        release=STRING,
        state={"enum": ["settled"]},
        amount=_ref("Amount"),
        drawn=_ref("Amount"),
        used=_ref("Amount"),
        returned=_ref("Amount"),
        multiplicity=INTEGER,
        remaining=_ref("Amount"),
        settled_at=TIME,
        receipt=STRING,
        ledger=_object(["seq", "hash"], seq=INTEGER, hash=STRING),
    ),
    "ChargeRecord": _object(
        ["charge_id", "dataset", "status", "cost"],
        "a charge as the ledger recorded it",
        charge_id=STRING,
        dataset=STRING,
        consumer=OPTIONAL_STRING,
        status=STRING,
        mechanism=OPTIONAL_STRING,
        release=OPTIONAL_STRING,
        partitions=STRINGS,
        params=ANY_OBJECT,
        cost=_ref("Amount"),
        multiplicity=INTEGER,
        charged=_ref("Amount"),
        hold_id=OPTIONAL_STRING,
        denial={"anyOf": [ANY_OBJECT, {"type": "null"}]},
        created_at=TIME,
        batch_id=STRING,
        group=INTEGER,
        group_cost=_ref("Amount"),
        batch_delta={"type": "number"},
    ),
    "Preview": _object(
        ["granted", "cost"],
        granted=BOOLEAN,
        cost=_ref("Amount"),
        remaining_after=_ref("Amount"),
        scope=OPTIONAL_STRING,
        reason=OPTIONAL_STRING,
    ),
    "Plan": _object(
        [],
        "fits and limited_by, or, asked with a count, params; the cost of one charge",
        fits=INTEGER,
        limited_by={"anyOf": [ANY_OBJECT, {"type": "null"}]},
        params=ANY_OBJECT,
        cost=_ref("Amount"),
    ),
    "Dataset": _object(
        ["name", "privacy_unit", "accounting", "budget"],
        name=STRING,
        privacy_unit=STRING,
        accounting=STRING,
        max_partitions_per_user={"type": ["integer", "null"]},
        max_records_per_user={"type": ["integer", "null"]},
        composition={"enum": ["basic", "advanced"]},
        composition_delta={"type": "number"},
        budget=_ref("Amount"),
        partition_budget=OPTIONAL_AMOUNT,
        windows=_list(ANY_OBJECT),
        created_at=TIME,
        population={
            "type": "string",
            "description": "the population the dataset belongs to, for life (absent: none)",
        },
        description={
            "type": "string",
            "description": "what the dataset is, as given on creation (absent: none given)",
        },
    ),
    "DatasetList": _object(["datasets"], datasets=_list(_ref("Dataset"))),
    "Budget": _object(
        ["dataset", "loss", "limit", "remaining"],
        "the loss, limit and remaining of every "
        "scope; a service also sees its own quota (consumer)",
        dataset=STRING,
        privacy_unit=STRING,
        accounting=STRING,
        loss=_ref("Amount"),
        limit=_ref("Amount"),
        remaining=_ref("Amount"),
        windows=_list(ANY_OBJECT),
        partitions=ANY_OBJECT,
        partition_limit=_ref("Amount"),
        limit_history=_list(ANY_OBJECT),
        held=_ref("Amount"),
        spent=_ref("Amount"),
        consumer=ANY_OBJECT,
        composition={"enum": ["basic", "advanced"]},
        composition_delta={"type": "number"},
    ),
    "Population": _object(
        ["name", "privacy_unit", "accounting", "budget", "datasets"],
        "a budget over several datasets of the same people (identity: what its datasets "
        "must share)",
        name=STRING,
        privacy_unit=STRING,
        accounting=STRING,
        rdp_order={"type": "number"},
        budget=_ref("Amount"),
        datasets=STRINGS,
        created_at=TIME,
        identity=STRING,
    ),
    "PopulationList": _object(["populations"], populations=_list(_ref("Population"))),
    "PopulationBudget": _object(
        ["population", "loss", "limit", "remaining", "datasets"],
        "the population's loss (the sum of its datasets' lifetime losses), limit and "
        "remaining, and each dataset's own loss",
        population=STRING,
        privacy_unit=STRING,
        accounting=STRING,
        loss=_ref("Amount"),
        limit=_ref("Amount"),
        remaining=_ref("Amount"),
        at_limit=BOOLEAN,
        datasets={"type": "object", "additionalProperties": _ref("Amount")},
        limit_history=_list(ANY_OBJECT),
    ),
    "ChangeRequest": _object(
        ["request_id", "state", "kind", "requested_by", "change", "reason", "expires_at"],
        "a change waiting for another admin's approval (DESIGN.md, Approvals)",
        request_id=STRING,
        state={"enum": ["pending", "approved", "denied", "expired"]},
        kind={
            "enum": ["dataset_limits", "population_limit", "admin_consumer", "admin_key", "quota"]
        },
        target=STRING,
        requested_by=STRING,
        change=ANY_OBJECT,
        reason=STRING,
        created_at=TIME,
        expires_at=TIME,
        decided_by=OPTIONAL_STRING,
        decision_reason=OPTIONAL_STRING,
        decided_at={"type": ["string", "null"], "format": "date-time"},
    ),
    "ChangeRequestList": _object(
        ["requests", "next_cursor"],
        requests=_list(_ref("ChangeRequest")),
        next_cursor=OPTIONAL_STRING,
    ),
    "PartitionsDeclared": _object(
        ["dataset", "created", "existing"], dataset=STRING, created=STRINGS, existing=STRINGS
    ),
    "PartitionPage": _object(
        ["partitions", "next_cursor"],
        partitions=_list(
            _object(
                ["key", "spent"],
                "remaining and at_limit: under a partition budget only",
                key=STRING,
                spent=_ref("Amount"),
                remaining=_ref("Amount"),
                at_limit=BOOLEAN,
            )
        ),
        next_cursor=OPTIONAL_STRING,
    ),
    "Consumer": _object(
        ["name", "role", "datasets"],
        "a consumer; never its keys' secrets",
        name=STRING,
        role=STRING,
        datasets=STRINGS,
        quotas={"type": "object", "additionalProperties": _ref("Amount")},
        keys=_list(_object(["id"], id=STRING, prefix=STRING, revoked=BOOLEAN)),
        use={"type": "object", "additionalProperties": ANY_OBJECT},
    ),
    "ConsumerList": _object(["consumers"], consumers=_list(_ref("Consumer"))),
    "NewConsumer": _object(
        ["name", "role", "api_key"],
        "the key is shown this once",
        name=STRING,
        role=STRING,
        datasets=STRINGS,
        api_key=STRING,
        key_id=STRING,
    ),
    "NewKey": _object(
        ["id", "consumer", "api_key"],
        "the key is shown this once",
        id=STRING,
        prefix=STRING,
        consumer=STRING,
        api_key=STRING,
        created_at=TIME,
    ),
    "Mechanism": _object(
        ["name", "accounting"],
        name=STRING,
        description=STRING,
        params_schema=ANY_OBJECT,
        input_schema=ANY_OBJECT,
        accounting=STRINGS,
        plugin=STRING,
        runs={
            **BOOLEAN,
            "description": "false for an accounting-only mechanism: it prices holds for jobs "
            "that run elsewhere, never a charge",
        },
    ),
    "MechanismList": _object(["mechanisms"], mechanisms=_list(_ref("Mechanism"))),
    "LedgerEntry": _object(
        ["id", "seq", "kind", "dataset", "status", "created_at", "prev_hash", "hash"],
        "docs/ledger.md: the canonical form and what each hash covers",
        id=INTEGER,
        seq=INTEGER,
        kind=STRING,
        charge_id=OPTIONAL_STRING,
        dataset=STRING,
        consumer=OPTIONAL_STRING,
        status=STRING,
        mechanism=OPTIONAL_STRING,
        release=OPTIONAL_STRING,
        partitions=STRINGS,
        cost=_ref("Amount"),
        multiplicity=INTEGER,
        charged=OPTIONAL_AMOUNT,
        loss_after=OPTIONAL_AMOUNT,
        detail={"anyOf": [ANY_OBJECT, {"type": "null"}]},
        created_at=TIME,
        noise_secret=OPTIONAL_STRING,
        implementation=OPTIONAL_STRING,
        batch_id={**OPTIONAL_STRING, "description": "the batch of a batch item or refusal"},
        group={
            "type": ["integer", "null"],
            "description": "the group a batch item was priced with (approx, a batch with delta)",
        },
        prev_hash=STRING,
        hash=STRING,
        params=ANY_OBJECT,
        cost_units=_list(INTEGER),
        created_at_us=INTEGER,
        reason={
            **OPTIONAL_STRING,
            "description": 'a limit change\'s reason, or "no reason given"; null on a charge',
        },
    ),
    "LedgerPage": _object(
        ["entries", "next_cursor"], entries=_list(_ref("LedgerEntry")), next_cursor=OPTIONAL_STRING
    ),
    "LedgerVerification": _object(
        ["ok", "entries"],
        ok=BOOLEAN,
        entries=INTEGER,
        heads={"type": "object", "additionalProperties": STRING},
        dataset=OPTIONAL_STRING,
        reason=OPTIONAL_STRING,
        first_bad_entry={"anyOf": [_ref("LedgerEntry"), {"type": "null"}]},
        seals_checked=BOOLEAN,
    ),
    "JWKSet": _object(
        ["keys"],
        keys=_list(
            _object(
                ["kty", "crv", "x", "kid"],
                kty=STRING,
                crv=STRING,
                x=STRING,
                kid=STRING,
                alg=STRING,
                use=STRING,
            )
        ),
    ),
    "ReceiptVerification": _object(
        ["valid"],
        valid=BOOLEAN,
        charge_id=OPTIONAL_STRING,
        claims=ANY_OBJECT,
        in_ledger=BOOLEAN,
        reason=STRING,
    ),
}


def _changed(name: str, what: str) -> dict[str, Any]:
    """The answer to a PATCH of limits: ``name``'s object as it now stands, whether any
    limit changed (and was ledgered), and plain-English notes on the change."""
    schema = SCHEMAS[name]
    return {
        **schema,
        "required": [*schema["required"], "changed", "notes"],
        "description": f"{what} as it now stands; changed: whether any limit changed (only "
        "changes are ledgered); notes: what the change means, in plain English",
        "properties": {**schema["properties"], "changed": BOOLEAN, "notes": STRINGS},
    }


SCHEMAS["DatasetUpdate"] = _changed("Dataset", "the dataset")
SCHEMAS["ConsumerUpdate"] = _changed("Consumer", "the consumer")
SCHEMAS["PopulationUpdate"] = _changed("Population", "the population")
SCHEMAS["ChangeRequestDecided"] = {
    **SCHEMAS["ChangeRequest"],
    "description": "the request as decided; an approved new admin or admin key comes with "
    "result: its api_key, shown this once",
    "properties": {**SCHEMAS["ChangeRequest"]["properties"], "result": ANY_OBJECT},
}


NUMBER: dict[str, Any] = {"type": "number"}
OPTIONAL_NUMBER: dict[str, Any] = {"type": ["number", "null"]}
SCHEMAS["Accuracy"] = _object(
    ["kind", "scale", "half_width_95", "confidence", "exact"],
    "how far a released value may be from the true one (docs/mechanisms.md, Accuracy): "
    "additive_noise: noise of the law distribution with parameter scale (a Laplace's b, a "
    "Gaussian's sigma, in output units) is added to each value rounded to grid, and "
    "P(|noise| <= half_width_95) >= confidence for each value, half_width_95 the smallest "
    "such when exact; utility_gap: the chosen candidate's utility is within half_width_95 of "
    "the best with at least that probability; randomized_response: each reported value of a "
    "member with a record is the truth with probability_true. A null figure depends on the "
    "input's shape and no input was sent",
    kind={**STRING, "examples": ["additive_noise", "utility_gap", "randomized_response"]},
    distribution=STRING,
    scale=OPTIONAL_NUMBER,
    half_width_95=OPTIONAL_NUMBER,
    confidence=NUMBER,
    exact=BOOLEAN,
    grid=NUMBER,
    candidates=INTEGER,
    categories=INTEGER,
    probability_true=OPTIONAL_NUMBER,
)
for _answer in ("Charge", "Preview", "Plan"):
    SCHEMAS[_answer]["properties"]["accuracy"] = {
        "anyOf": [_ref("Accuracy"), {"type": "null"}],
        "description": "the mechanism's accuracy at the parameters it runs with; null when "
        "the mechanism states none",
    }
