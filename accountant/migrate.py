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


def upgrade(database_url: str, revision: str = "head") -> None:
    ensure_sqlite_directory(database_url)
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)
