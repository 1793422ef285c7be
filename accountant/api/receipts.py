"""/v1/receipts: the public verification keys and an online verifier."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from accountant.api.auth import principal
from accountant.api.common import json_body
from accountant.services import receipts
from accountant.signing import ReceiptError, verify
from accountant.web import db, runtime

bp = Blueprint("receipts", __name__)

VERIFY: dict[str, Any] = {
    "type": "object",
    "properties": {"receipt": {"type": "string", "maxLength": 100_000}},
    "required": ["receipt"],
    "additionalProperties": False,
}


@bp.get("/v1/receipts/public-key")
def public_keys() -> Any:
    """The JWK set of every signing key, old ones included (no API key needed)."""
    return {"keys": receipts.jwks(db(), runtime().signer)}


@bp.post("/v1/receipts/verify")
def verify_receipt() -> Any:
    principal("admin", "service", "auditor")
    body = json_body(VERIFY)
    try:
        claims = verify(body["receipt"], receipts.jwks(db(), runtime().signer))
    except ReceiptError as error:
        return {"valid": False, "reason": str(error)}
    verdict: dict[str, Any] = {
        "valid": True,
        "charge_id": claims.get("charge_id"),
        "claims": claims,
    }
    present = receipts.in_ledger(db(), claims)
    if present is not None:
        verdict["in_ledger"] = present
        if not present:
            verdict["reason"] = (
                "the signature is valid, but the charge's ledger entry (seq "
                f"{claims['ledger'].get('seq')} of dataset "
                f"{claims.get('dataset')!r}) is not in the ledger as "
                "signed: the ledger was cut back or rewritten; run "
                "accountant ledger verify and compare with earlier exports"
            )
    return verdict
