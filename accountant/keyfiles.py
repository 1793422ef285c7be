"""Secret files created once: the first process to start writes them, every other reads them.

The content is written to a temporary file with mode 0600, synced, and
hard-linked into place; the link either succeeds once or fails because
another process won, whose file the losers then read. So every worker and
every process started at the same moment ends up with the same secret. A
folder made for it is 0700 whatever the umask (``private_directory``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


def create_once(
    path: Path, content: bytes, what: str, advice: str = "back it up and keep it secret"
) -> None:
    """Write ``content`` to ``path`` unless the file exists (or another process wins), and
    log that it did (the path and ``advice``, never the content)."""
    if path.exists():
        return
    private_directory(path.parent)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".secret-")
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, content)
        os.fsync(descriptor)
        os.close(descriptor)
        os.link(temporary, path)
        log.warning(f"created a new {what}; {advice}", extra={"path": str(path)})
    except FileExistsError:
        pass  # another process created it first; use theirs
    finally:
        os.unlink(temporary)


def private_directory(path: Path) -> None:
    """Create the folder ``path`` and each missing parent with mode 0700, whatever the umask
    (under umask 000, ``mkdir -p`` makes them 0777: anyone could list them, and replace a
    secret in them); a folder that exists is left as it is."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue  # another process made it first, and makes it 0700
        folder.chmod(0o700)  # mkdir's mode is narrowed by the umask: make it exactly 0700


class MissingKeyFile(RuntimeError):
    """A key or secret file the service reads does not exist yet."""


def require(path: Path, what: str) -> None:
    """Raise ``MissingKeyFile`` unless ``path`` exists: building the app never creates one."""
    if not path.exists():
        raise MissingKeyFile(
            f"the {what} file {path} does not exist: run 'accountant init', or start the "
            "service with 'accountant serve', which creates it (every host of one database "
            "must use the same file)"
        )


def require_registered(path: Path, what: str, setting: str, registered: str | None) -> None:
    """Raise ``MissingKeyFile`` when ``path`` is missing although the database is served with
    a secret (``registered``, its id): a new secret there would only make the host refuse
    to start, so none is created. The secret is found where it is, never replaced."""
    if registered is not None and not path.exists():
        raise MissingKeyFile(
            f"there is no {what} file at {path}, and this database is served with the {what} "
            f"id {registered}: set {setting} to the file that holds it, or copy that file "
            "here from a host that serves this database (it does not move when "
            "ACCOUNTANT_SIGNING_KEY_FILE does; docs/operations.md, 'Rotating the signing key')"
        )


def create_secret(path: Path, what: str) -> None:
    """Write 32 random bytes in hex to ``path`` unless it exists (``create_once``)."""
    create_once(path, os.urandom(32).hex().encode() + b"\n", what)


def load_secret(path: Path, what: str) -> bytes:
    """The secret in ``path`` (at least 32 bytes in hex), which must exist; a warning if
    other users may read it."""
    require(path, what)
    warn_if_readable_by_others(path, what)
    try:
        secret = bytes.fromhex(path.read_text().strip())
    except ValueError:
        secret = b""
    if len(secret) < 32:
        raise ValueError(f"{path} does not hold a {what} (64 or more hex digits)")
    return secret


def secret_id(secret: bytes, label: bytes) -> str:
    """A public id of a secret: a keyed hash that reveals nothing of it."""
    return hmac.new(secret, label, hashlib.sha256).hexdigest()[:32]


def warn_if_readable_by_others(path: Path, what: str) -> None:
    """Log a warning when the group or other users may read or write a secret file."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning(
            f"the {what} file is readable or writable by other users (mode "
            f"{mode:o}); run 'chmod 600 {path}'",
            extra={"path": str(path)},
        )
