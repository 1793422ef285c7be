"""Alembic, driven from the package: migrations ship inside it, so any working directory works."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from accountant.db import ensure_sqlite_directory


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("accountant_migrations")))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def is_revision(revision: str) -> bool:
    """Whether ``revision`` is one of this release's migrations (else a newer release's)."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return any(step.revision == revision for step in script.walk_revisions())


def current_revision(database_url: str) -> str | None:
    """The schema revision of the database at ``database_url`` (None: no schema yet)."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrate the schema, then (at the head) the data that a migration cannot derive in
    SQL: the rho limits of zcdp datasets (``services.conversions``)."""
    ensure_sqlite_directory(database_url)
    command.upgrade(alembic_config(database_url), revision)
    if revision == "head":
        _upgrade_data(database_url)


def _upgrade_data(database_url: str) -> None:
    import time
    from pathlib import Path

    from accountant import key_hashing
    from accountant.config import load_settings
    from accountant.db import make_engine, make_session_factory
    from accountant.services.conversions import upgrade_zcdp_limits

    settings = load_settings({"database_url": database_url})
    secret = Path(settings.key_hash_secret_file)
    hasher = key_hashing.load_or_create(secret) if secret.exists() else None
    engine = make_engine(settings, service=False)
    try:
        with make_session_factory(engine)() as session:
            upgrade_zcdp_limits(session, time.time_ns() // 1000, hasher)
    finally:
        engine.dispose()


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)
