"""Settings: defaults, then ``ACCOUNTANT_*`` environment variables, then an explicit mapping.

This is the only module that reads ``os.environ``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PREFIX = "ACCOUNTANT_"


class ConfigError(ValueError):
    """A setting has a value the service cannot use."""


@dataclass(frozen=True)
class Settings:
    #: SQLAlchemy URL; default a SQLite file under ./var/ of the working directory.
    database_url: str = ""
    #: If set and no admin exists yet, an admin named "admin" is created with this key.
    admin_key: str | None = None
    #: The receipt-signing private key (PEM); created with mode 0600 when missing.
    signing_key_file: str = ""
    #: The secret that keys every charge's noise (replays regenerate it); created when missing.
    noise_secret_file: str = ""
    #: The secret API keys are hashed under (HMAC); created when missing, shared by every host.
    key_hash_secret_file: str = ""
    #: Largest request body in bytes (413 above it).
    max_body_bytes: int = 4 * 1024 * 1024
    #: Largest input or output vector (400 above it).
    max_vector_length: int = 100_000
    #: Largest explicit partition list of one charge; "*" has no such limit.
    max_partitions_per_charge: int = 10_000
    #: Entry-point names of plugins not to load, comma-separated in the environment.
    disabled_plugins: tuple[str, ...] = ()
    #: SQLite's synchronous pragma. FULL is the durable default; NORMAL is an explicit opt-in
    #: that may lose the last charges on power loss (never on a process crash).
    sqlite_synchronous: str = "FULL"
    #: How long a transaction waits for a lock before giving up, in milliseconds.
    lock_timeout_ms: int = 5_000
    #: How much longer than a lock wait one database step (connect, statement, commit) may
    #: take before the request is answered with a 503: a stalled database never hangs it.
    database_timeout_ms: int = 3_000
    #: "pgbouncer" when PostgreSQL is reached through PgBouncer in transaction pooling mode:
    #: no startup options (the role carries the timeouts) and no server-side prepared
    #: statements, neither of which survives a pooler that changes servers per transaction.
    database_pooler: str = ""
    #: Connection pool size per process on PostgreSQL.
    pool_size: int = 5
    #: Log level of the service's structured logs.
    log_level: str = "INFO"
    #: Utilisation thresholds, in percent, whose crossing raises a budget alert.
    alert_thresholds: tuple[int, ...] = (50, 80, 100)
    #: Where the built-in webhook alert plugin POSTs alerts, an http or https URL (unset: no
    #: webhook).
    alert_webhook_url: str | None = None
    #: The webhook's timeout per attempt, in milliseconds (5 attempts with backoff).
    alert_webhook_timeout_ms: int = 2000
    #: The secret(s) alerts are signed with (Standard Webhooks, ``whsec_...``), one a line;
    #: created when missing and a webhook URL is set. Default: next to the noise secret.
    alert_webhook_secret_file: str = ""
    #: If set (32+ printable characters), GET /metrics answers only requests that send it as
    #: "Authorization: Bearer <key>"; unset, /metrics is open like /healthz.
    metrics_key: str | None = None
    #: The dashboard cookie's Secure flag: "auto" sets it when the request came over HTTPS
    #: (directly, or through a proxy that says so in X-Forwarded-Proto); "true" or "false".
    cookie_secure: str = "auto"
    #: "on": a change that raises a privacy limit or makes a new admin waits, as a pending
    #: request, for another admin's approval (DESIGN.md, "Approvals"); "off": it applies.
    approvals: str = "off"
    #: How long a pending request waits for a decision before it expires, in seconds.
    approval_expiry_s: int = 7 * 24 * 3600
    #: Requests per second each API key may make of each worker process, after a burst of
    #: as many (a 429 with scope "rate" beyond it); unset: no limit (``accountant.rate_limit``).
    rate_limit: int | None = None
    #: One JSON line per request on standard error (method, path, status, bytes, duration;
    #: never a header, so never a key): "true" or "false".
    access_log: bool = False

    @property
    def database_deadline_s(self) -> float:
        """How long a request may wait for the database in all (pool checkout, connecting,
        every statement and commit together): a lock wait, the database timeout and 1 s
        more, so that a server that runs ends a slow statement itself, first."""
        return (self.lock_timeout_ms + self.database_timeout_ms) / 1000 + 1


_INT_FIELDS = {
    "max_body_bytes",
    "max_vector_length",
    "max_partitions_per_charge",
    "lock_timeout_ms",
    "database_timeout_ms",
    "pool_size",
    "alert_webhook_timeout_ms",
    "approval_expiry_s",
}


def default_database_url() -> str:
    return f"sqlite:///{Path.cwd() / 'var' / 'accountant.db'}"


def load_settings(overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build the settings once; raise ``ConfigError`` naming the variable at fault."""
    values: dict[str, Any] = {}
    for field in fields(Settings):
        raw = os.environ.get(PREFIX + field.name.upper())
        if raw is not None and raw != "":
            values[field.name] = _parse(field.name, raw)
    values.update(overrides or {})
    if not values.get("database_url"):
        values["database_url"] = default_database_url()
    if not values.get("signing_key_file"):
        values["signing_key_file"] = str(Path.cwd() / "var" / "signing-key.pem")
    if not values.get("noise_secret_file"):
        values["noise_secret_file"] = str(Path(values["signing_key_file"]).parent / "noise-secret")
    if not values.get("key_hash_secret_file"):
        values["key_hash_secret_file"] = str(
            Path(values["signing_key_file"]).parent / "key-hash-secret"
        )
    if not values.get("alert_webhook_secret_file"):  # it stays when the signing key moves
        values["alert_webhook_secret_file"] = str(
            Path(values["noise_secret_file"]).parent / "webhook-secret"
        )
    settings = Settings(**values)
    _validate(settings)
    return settings


def _validate_database_url(url: str) -> None:
    """A URL of a SQLite file or a PostgreSQL database whose driver is installed."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    usage = (
        "use sqlite:////absolute/path/accountant.db or "
        "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"
    )
    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):
        raise ConfigError(
            f"{PREFIX}DATABASE_URL is not a database URL the service can use; {usage}"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"{PREFIX}DATABASE_URL names {backend}: the service runs on SQLite or "
            f"PostgreSQL; {usage}"
        )
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ConfigError(f"{PREFIX}DATABASE_URL names no SQLite file; {usage}")
    try:
        dialect.import_dbapi()
    except ImportError:
        hint = (
            "install it with the service's postgres extra: pip install -e '.[postgres]' in "
            "a clone of the repository (or 'privacy-accountant[postgres]')"
            if backend == "postgresql"
            else usage
        )
        raise ConfigError(
            f"{PREFIX}DATABASE_URL needs the {parsed.get_driver_name()} driver, which is not "
            f"installed; {hint}"
        ) from None


def _parse(name: str, raw: str) -> Any:
    if name in _INT_FIELDS or name == "rate_limit":
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name.upper()} must be an integer, got {raw!r}") from None
    if name == "access_log":
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"{PREFIX}ACCESS_LOG must be true or false, got {raw!r}")
        return raw.lower() == "true"
    if name == "disabled_plugins":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if name == "alert_thresholds":
        try:
            return tuple(sorted(int(part) for part in raw.split(",") if part.strip()))
        except ValueError:
            raise ConfigError(
                f"{PREFIX}ALERT_THRESHOLDS must be percents like 50,80,100, got {raw!r}"
            ) from None
    return raw


def _validate(settings: Settings) -> None:
    # ASCII: a header carries no other text the same way from every client; and a space at
    # either end is trimmed from a header's value, so that such a key never matches
    for name, key in (("ADMIN_KEY", settings.admin_key), ("METRICS_KEY", settings.metrics_key)):
        if key is not None and (
            len(key) < 32 or not (key.isprintable() and key.isascii()) or key != key.strip()
        ):
            raise ConfigError(
                f"{PREFIX}{name} must be at least 32 printable ASCII characters, with no "
                "space at either end, as sent in an Authorization header ('openssl rand -hex "
                "32' makes one)"
            )
    if settings.cookie_secure not in {"auto", "true", "false"}:
        raise ConfigError(f"{PREFIX}COOKIE_SECURE must be auto, true or false")
    if settings.approvals not in {"on", "off"}:
        raise ConfigError(f"{PREFIX}APPROVALS must be on or off, got {settings.approvals!r}")
    if settings.database_pooler not in {"", "pgbouncer"}:
        raise ConfigError(f"{PREFIX}DATABASE_POOLER must be empty or pgbouncer")
    if settings.sqlite_synchronous.upper() not in {"FULL", "NORMAL", "EXTRA"}:
        raise ConfigError(f"{PREFIX}SQLITE_SYNCHRONOUS must be FULL, EXTRA or NORMAL")
    for name in _INT_FIELDS:
        if getattr(settings, name) <= 0:
            raise ConfigError(f"{PREFIX}{name.upper()} must be positive")
    if settings.rate_limit is not None and settings.rate_limit <= 0:
        raise ConfigError(f"{PREFIX}RATE_LIMIT must be a positive number of requests a second")
    _validate_database_url(settings.database_url)
    if settings.alert_webhook_url is not None:
        _validate_webhook_url(settings.alert_webhook_url)
    if any(not 0 < t <= 1000 for t in settings.alert_thresholds):
        raise ConfigError(f"{PREFIX}ALERT_THRESHOLDS must be percents between 1 and 1000")


def _validate_webhook_url(url: str) -> None:
    """Refuse a webhook URL that could never be delivered to, without repeating it (its path
    or query may carry the receiver's token)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        parts, host = urlsplit(""), None
    if parts.scheme not in {"http", "https"} or not host:
        came = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise ConfigError(
            f"{PREFIX}ALERT_WEBHOOK_URL must be an http:// or https:// URL with a host name, "
            f"such as https://alerts.example.com/budget; got one with {came} and "
            f"{'host ' + repr(host) if host else 'no host'}: set it to the receiver's URL, or "
            "unset it to send no webhook"
        )
