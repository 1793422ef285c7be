"""Receipts checked offline: an Ed25519 JWS against the service's published keys, and the
output's SHA-256 against the one the receipt names."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from accountant_client._errors import ReceiptInvalid


@dataclass(frozen=True)
class _Receipt:
    """A receipt's parts, read but not yet trusted."""

    kid: str
    claims: dict[str, Any]
    signature: bytes
    signed: bytes

    @classmethod
    def read(cls, receipt: str) -> _Receipt:
        parts = receipt.split(".")
        if len(parts) != 3:
            raise ReceiptInvalid({"detail": "not a JWS compact serialisation"})
        try:
            header = json.loads(_unb64(parts[0]))
            claims = json.loads(_unb64(parts[1]))
            signature = _unb64(parts[2])
        except ValueError:
            raise ReceiptInvalid({"detail": "the receipt's parts are not base64url JSON"}) from None
        if not isinstance(header, dict) or header.get("alg") != "EdDSA":
            raise ReceiptInvalid({"detail": "the receipt is not signed with EdDSA"})
        if not isinstance(claims, dict):
            raise ReceiptInvalid({"detail": "the receipt's claims are not a JSON object"})
        return cls(str(header.get("kid")), claims, signature, f"{parts[0]}.{parts[1]}".encode())

    @property
    def kind(self) -> str:
        """What the receipt attests: ``charge`` (a grant and its output), ``hold`` (budget
        reserved and charged at once) or ``settle`` (the cost a hold's job settled at, which
        it publishes with its output). Receipts signed before holds existed name no kind:
        they are a charge's."""
        return str(self.claims.get("kind", "charge"))

    def check(
        self, keys: Mapping[str, Ed25519PublicKey], output: Any, kind: str | None = None
    ) -> dict[str, Any]:
        """The claims, if a published key signed them, given ``kind``, if the receipt is of
        that kind, and, given ``output``, if it is the output they name (only a charge's
        receipt names one)."""
        key = keys.get(self.kid)
        if key is None:
            raise ReceiptInvalid({"detail": f"no published key has id {self.kid!r}"})
        try:
            key.verify(self.signature, self.signed)
        except InvalidSignature:
            raise ReceiptInvalid({"detail": "the receipt's signature does not match"}) from None
        if kind is not None and self.kind != kind:
            raise ReceiptInvalid({"detail": f"a {self.kind} receipt, not a {kind} receipt"})
        if output is not None and "output_sha256" not in self.claims:
            raise ReceiptInvalid(
                {
                    "detail": f"a {self.kind} receipt names no output; check an output "
                    "against the receipt of the charge that released it"
                }
            )
        if output is not None:
            digest = hashlib.sha256(
                json.dumps(output, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest()
            if digest != self.claims.get("output_sha256"):
                raise ReceiptInvalid({"detail": "the output is not the one the receipt names"})
        return dict(self.claims)


def _remember_keys(keys: dict[str, Ed25519PublicKey], jwks: Mapping[str, Any]) -> None:
    for jwk in jwks["keys"]:
        keys[jwk["kid"]] = Ed25519PublicKey.from_public_bytes(_unb64(jwk["x"]))


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
