"""Receipts: JWS compact tokens signed with Ed25519 (RFC 7515, RFC 8037), verifiable offline.

The private key lives in ``ACCOUNTANT_SIGNING_KEY_FILE``. When the file is
missing, the first process to start creates it (``keyfiles.create_once``),
so every worker signs with the same key. Public keys are kept in the
database, so receipts signed before a rotation still verify. The signing key
is not the noise secret (``accountant.noise``): rotating it changes no
replayed output.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from accountant.keyfiles import create_once, require, warn_if_readable_by_others


class ReceiptError(ValueError):
    """A token that is not a valid receipt; the message says why."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    ).encode()


def load_or_create(path: Path) -> Ed25519PrivateKey:
    create_once(
        path,
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        "receipt-signing key",
    )
    return load(path)


def load(path: Path) -> Ed25519PrivateKey:
    """The receipt-signing key in ``path`` (PEM), which must exist."""
    require(path, "receipt-signing key")
    warn_if_readable_by_others(path, "receipt-signing key")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key


def derive_secret(private: Ed25519PrivateKey, purpose: bytes) -> bytes:
    """A secret for ``purpose`` derived from the signing key (HMAC-SHA256 as a PRF)."""
    raw = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return hmac.new(raw, purpose, hashlib.sha256).digest()


def public_jwk(public: Ed25519PublicKey) -> dict[str, str]:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": b64url(raw),
        "alg": "EdDSA",
        "use": "sig",
        "kid": b64url(hashlib.sha256(raw).digest()[:12]),
    }


@lru_cache(maxsize=8)
def _encoded_header(private: Ed25519PrivateKey) -> str:
    """The JWS header of ``private``'s signatures (computed once per key, not per receipt)."""
    header = {"alg": "EdDSA", "kid": public_jwk(private.public_key())["kid"], "typ": "JWT"}
    return b64url(canonical_json(header))


def sign(private: Ed25519PrivateKey, claims: dict[str, Any]) -> str:
    signing_input = f"{_encoded_header(private)}.{b64url(canonical_json(claims))}"
    return f"{signing_input}.{b64url(private.sign(signing_input.encode()))}"


def verify(token: str, jwks: list[dict[str, str]]) -> dict[str, Any]:
    """The claims of ``token`` if one of ``jwks`` signed it; else ``ReceiptError``."""
    parts = token.split(".") if isinstance(token, str) else []
    if len(parts) != 3:
        raise ReceiptError("not a JWS compact serialisation (three dot-separated parts)")
    try:
        header = json.loads(unb64url(parts[0]))
        claims = json.loads(unb64url(parts[1]))
        signature = unb64url(parts[2])
    except (ValueError, UnicodeDecodeError):
        raise ReceiptError("the token's parts are not base64url JSON") from None
    if not isinstance(header, dict) or header.get("alg") != "EdDSA":
        raise ReceiptError("the token is not signed with EdDSA")
    key = next((k for k in jwks if k["kid"] == header.get("kid")), None)
    if key is None:
        raise ReceiptError(f"unknown key id {header.get('kid')!r}")
    public = Ed25519PublicKey.from_public_bytes(unb64url(key["x"]))
    try:
        public.verify(signature, f"{parts[0]}.{parts[1]}".encode())
    except InvalidSignature:
        raise ReceiptError("the signature does not match the token") from None
    if not isinstance(claims, dict):
        raise ReceiptError("the claims are not a JSON object")
    return claims
