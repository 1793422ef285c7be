"""Webhook signatures as the Standard Webhooks specification 1.0.0 defines them
(https://www.standardwebhooks.com, "Signature scheme" and "Webhook headers").

A message is signed, under each secret, with HMAC-SHA256 (RFC 2104) over
``{id}.{timestamp}.{body}``: the message id, the attempt's Unix time in whole
seconds and the exact bytes of the body, joined by full stops. Each signature
is ``v1,`` and its base64; the ``webhook-signature`` header lists them,
space-separated, so that a receiver that knows any one of the secrets verifies
the message, which is how a secret is replaced without losing one. A secret is
written as ``whsec_`` and the base64 of 24 to 64 random bytes; a secret file
holds one or more, one a line, the newest first.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from accountant.config import ConfigError
from accountant.keyfiles import (
    create_once,
    private_directory,
    require,
    secret_id,
    warn_if_readable_by_others,
)

PREFIX = "whsec_"
WHAT = "webhook signing secret"
_ID_LABEL = b"accountant webhook secret id v1"


@dataclass(frozen=True)
class WebhookSigner:
    """The secrets a message is signed with, newest first (never shown by ``repr``)."""

    secrets: tuple[bytes, ...] = field(repr=False)

    def headers(self, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
        """The ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` headers of
        ``body`` sent as message ``message_id`` at ``timestamp`` (Unix seconds)."""
        signed = f"{message_id}.{timestamp}.".encode() + body
        signatures = (hmac.new(key, signed, hashlib.sha256).digest() for key in self.secrets)
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(f"v1,{base64.b64encode(s).decode()}" for s in signatures),
        }

    @property
    def ids(self) -> tuple[str, ...]:
        """Public ids of the secrets, newest first: keyed hashes that reveal nothing of them,
        for comparing the files of several hosts."""
        return tuple(secret_id(key, _ID_LABEL) for key in self.secrets)


def new_secret() -> str:
    """A fresh secret, ``whsec_`` and the base64 of 32 random bytes."""
    return PREFIX + base64.b64encode(os.urandom(32)).decode()


def load(path: Path) -> WebhookSigner:
    """The secrets in ``path``, which must exist; ``ConfigError`` if it holds anything else
    (the message never repeats the file's content)."""
    require(path, WHAT)
    warn_if_readable_by_others(path, WHAT)
    lines = path.read_text().split()
    secrets = tuple(_decode(line) for line in lines)
    if not secrets or not all(secrets):
        raise ConfigError(
            f"{path} (ACCOUNTANT_ALERT_WEBHOOK_SECRET_FILE) does not hold a {WHAT}: expected "
            f"one or more lines of {PREFIX} followed by the base64 of 24 to 64 random bytes; "
            f"got {len(lines)} line(s), {sum(map(bool, secrets))} of them such a secret. Write "
            "the receiver's secret there, or remove the file: the next start creates a new one"
        )
    return WebhookSigner(secrets)


def _decode(line: str) -> bytes:
    """The bytes of one serialized secret, or b"" when ``line`` is not one."""
    if not line.startswith(PREFIX):
        return b""
    try:
        secret = base64.b64decode(line.removeprefix(PREFIX), validate=True)
    except (binascii.Error, ValueError):
        return b""
    return secret if 24 <= len(secret) <= 64 else b""


def create(path: Path) -> None:
    """Write a new secret to ``path`` unless it exists (``keyfiles.create_once``: mode 0600,
    the same file for every process that starts at once; the path is logged, never the
    secret)."""
    create_once(
        path,
        (new_secret() + "\n").encode(),
        WHAT,
        "give it to the receiver of ACCOUNTANT_ALERT_WEBHOOK_URL to verify the alerts "
        "('accountant webhook-secret show --reveal' prints it) and keep it secret",
    )


def add(path: Path) -> str:
    """Put a new secret in front of those in ``path`` (created when missing; the file is
    replaced at once, mode 0600) and return it: every message is then signed with each."""
    older = [] if not path.exists() else path.read_text().split()
    if older:
        load(path)  # never keep, nor add to, a file that holds something else
    secret = new_secret()
    private_directory(path.parent)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # mode 0600
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write("".join(f"{line}\n" for line in [secret, *older]))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return secret
