"""The ``accountant`` command: migrations, first key, serving, keys, plugins, and populations
and change requests (over the HTTP API)."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, OperationalError

from accountant.config import ConfigError, Settings, load_settings
from accountant.key_hashing import KeyHasher

if TYPE_CHECKING:  # the client is imported when a command over the API runs, if installed
    from accountant_client import AccountantError as ClientError
    from accountant_client import ChangeRequest
    from accountant_client import Client as ApiClient


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as error:
        raise click.ClickException(str(error)) from None


def _now() -> int:
    return time.time_ns() // 1000


def _key_hasher(settings: Settings, engine: Engine) -> KeyHasher:
    """The secret API keys are hashed under: created (with the database's other secrets)
    only for a database that has none; else found where its file is, never made anew."""
    from pathlib import Path

    from accountant import key_hashing
    from accountant.keyfiles import MissingKeyFile

    with engine.connect() as connection:
        registered = key_hashing.registered_id(connection)
    try:
        return key_hashing.load_or_create(Path(settings.key_hash_secret_file), registered)
    except MissingKeyFile as error:
        raise click.ClickException(str(error)) from None


def _existing_key_hasher(settings: Settings) -> KeyHasher | None:
    """The key-hash secret if this host has it (never created here), else None."""
    from pathlib import Path

    from accountant import key_hashing

    path = Path(settings.key_hash_secret_file)
    return key_hashing.load_or_create(path) if path.exists() else None


def _database(settings: Settings) -> Engine:
    """The engine of a database that 'accountant init' has set up. Anything else is one
    line saying what to do, and nothing is created (no folder, no file)."""
    from pathlib import Path

    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from accountant.db import make_engine

    url = make_url(settings.database_url)
    shown = url.render_as_string(hide_password=True)
    if (
        url.get_backend_name() == "sqlite"
        and url.database not in (None, "", ":memory:")
        and not Path(url.database).exists()
    ):
        raise click.ClickException(
            f"no database at {url.database}; run 'accountant init' in this folder first, or "
            "point ACCOUNTANT_DATABASE_URL at the service's database"
        )
    engine = make_engine(settings, service=False)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except Exception as error:  # unreachable, or no schema
        engine.dispose()
        raise click.ClickException(
            f"the database {shown} is unreachable or has no schema "
            f"({type(error).__name__}); run 'accountant init' or 'accountant db upgrade'"
        ) from None
    return engine


class _Commands(click.Group):
    """The command line's group: a database that cannot be reached or is not one, and a
    schema revision that does not exist, are one line saying what to do, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        from alembic.util import CommandError
        from sqlalchemy.exc import DBAPIError

        try:
            return super().invoke(ctx)
        except DBAPIError as error:
            from accountant.db import schema_missing

            if schema_missing(error):
                raise click.ClickException(
                    "the database's schema is behind this release's migrations, or missing; "
                    "run 'accountant db upgrade', then this command again"
                ) from None
            first = next(iter(str(error.orig).strip().splitlines()), "")
            raise click.ClickException(
                f"the database could not be used ({type(error.orig).__name__}: {first[:200]}); "
                "check ACCOUNTANT_DATABASE_URL (a SQLite file the service made, or a "
                "PostgreSQL server that is up and lets this user in)"
            ) from None
        except CommandError as error:
            raise click.ClickException(
                f"{error}; 'accountant db upgrade' with no revision brings the schema to the newest"
            ) from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="privacy-accountant", prog_name="accountant")
def main() -> None:
    """The privacy-budget accountant.

    Settings come from ACCOUNTANT_* environment variables; the database is
    ACCOUNTANT_DATABASE_URL (default: a SQLite file under ./var/).
    """


@main.group()
def db() -> None:
    """Create or change the database schema (Alembic migrations)."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Upgrade the schema to REVISION (default: the newest)."""
    from accountant.migrate import current_revision, upgrade

    settings = _settings()
    click.echo(f"upgrading {_safe_url(settings.database_url)} to {revision} ...", err=True)
    before = _revision_before(settings.database_url)
    upgrade(settings.database_url, revision)
    after = current_revision(settings.database_url)
    if before == after and revision not in ("head", after):
        click.echo(
            f"schema is at {after}, past {revision}: nothing to do (going back is "
            "'accountant db downgrade')",
            err=True,
        )
    elif before == after:
        click.echo(f"schema is up to date (at {after}): nothing to do", err=True)
    else:
        click.echo(f"schema upgraded from {before or 'none'} to {after}", err=True)


def _revision_before(database_url: str) -> str | None:
    """The schema's revision before an upgrade; None for a SQLite file not made yet (the
    upgrade makes it, as it does its folder)."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    from accountant.migrate import current_revision

    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and not Path(url.database or "").exists():
        return None
    return current_revision(database_url)


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Downgrade the schema to REVISION ('base' removes every table)."""
    from accountant.migrate import downgrade

    settings = _settings()
    click.echo(f"downgrading {_safe_url(settings.database_url)} to {revision} ...", err=True)
    downgrade(settings.database_url, revision)
    click.echo("done", err=True)


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@main.command()
def init() -> None:
    """Upgrade the schema, create the key and secret files, and print a first admin key if
    no admin exists yet."""
    from accountant.db import begin_write, make_engine, make_session_factory
    from accountant.migrate import upgrade
    from accountant.services.api_keys import KEY_PREFIX
    from accountant.services.consumers import ensure_first_admin

    settings = _settings()
    upgrade(settings.database_url)
    _prepare_host(settings)  # the key and secret files, registered; ACCOUNTANT_ADMIN_KEY's admin
    engine = make_engine(settings, service=False)
    sessions = make_session_factory(engine)
    hasher = _key_hasher(settings, engine)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with sessions() as session:
        begin_write(session)
        try:
            created = ensure_first_admin(session, key, _now(), hasher)
            session.commit()
        except IntegrityError:  # another process created the first admin at the same moment
            session.rollback()
            created = False
    if not created:
        click.echo(
            "an admin already exists; create more keys with "
            "'accountant keys create --name NAME --role admin'",
            err=True,
        )
        return
    click.echo("first admin key (shown once; store it now):", err=True)
    click.echo(key)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to bind (0: any free port).",
)
@click.option(
    "--workers", default=2, show_default=True, type=click.IntRange(1, 256), help="Worker processes."
)
@click.option(
    "--threads",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Threads per worker.",
)
def serve(host: str, port: int, workers: int, threads: int) -> None:
    """Serve the API with gunicorn in the foreground; SIGTERM stops every worker."""
    from gunicorn.app.base import BaseApplication

    from accountant import logging as structured_logging
    from accountant import serving

    settings = _settings()
    _require_schema(settings)
    structured_logging.configure(settings.log_level)  # every line on standard error is JSON
    master = os.getpid()
    _remove_stale_metrics_folders()
    # Latency metrics from every worker are summed through files in this folder; it must be
    # set before prometheus_client's metrics are created (accountant.app imports them), and
    # be empty at start. Its name carries the master's pid, so that a later start can remove
    # the folder of a crashed master.
    metrics_dir = tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{master}-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        _prepare_host(settings)  # no database connection stays open across the fork
    except click.ClickException:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # never point anyone at it again
        raise
    _say_if_no_admin(settings)

    class _Server(BaseApplication):  # type: ignore[misc]  # gunicorn ships no type hints
        def load_config(self) -> None:
            options: dict[str, Any] = {
                "bind": f"{host}:{port}",
                "workers": workers,
                "threads": threads,
                "worker_class": serving.Worker,
                "graceful_timeout": 10,
                "timeout": 60,
                "accesslog": None,
                "logger_class": serving.Logger,
                "errorlog": "-",
                "loglevel": "warning",
                "logconfig_dict": serving.LOGGING,
                "limit_request_line": serving.REQUEST_LINE_BYTES,
                "limit_request_field_size": serving.REQUEST_FIELD_BYTES,
                "limit_request_fields": serving.REQUEST_FIELDS,
            }
            for key, value in options.items():
                self.cfg.set(key, value)
            self.cfg.set("child_exit", _mark_dead)
            self.cfg.set("when_ready", _say_serving)

        def load(self) -> Any:
            from accountant.wsgi import app

            return app

    def _say_serving(server: Any) -> None:
        """Once the sockets are bound (a port in use never gets this far): where, with the
        port the system chose for ``--port 0``."""
        url = str(server.LISTENERS[0]) if server.LISTENERS else f"http://{host}:{port}"
        logging.getLogger("accountant.serve").info(
            f"serving on {url} with {workers} worker{'s' if workers != 1 else ''}",
            extra={"url": url, "workers": workers, "threads": threads},
        )

    serving.install()
    serving.Logger.access_log = settings.access_log
    try:
        _Server().run()
    finally:
        # Forked workers unwind through here too when they exit (SIGHUP, TTOU,
        # max-requests): only the master may remove the folder every worker writes to.
        if os.getpid() == master:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            logging.getLogger("accountant.serve").info(
                "stopped: every worker has exited", extra={"url": f"http://{host}:{port}"}
            )


def _require_schema(settings: Settings) -> None:
    """Refuse, in one line naming the command to run, a database without the schema or at
    another migration than this release's: served, every call would be a 503. Serving never
    migrates ('accountant db upgrade' and 'accountant init' do, once, before any host
    starts), and this creates nothing. A database that does not answer yet is served:
    /readyz says 503 until it answers."""
    from pathlib import Path

    from sqlalchemy import inspect, text
    from sqlalchemy.engine import make_url

    from accountant.db import make_engine
    from accountant.migrate import head_revision, is_revision

    url = make_url(settings.database_url)
    no_schema = click.ClickException(
        f"the database {url.render_as_string(hide_password=True)} has no schema; run "
        "'accountant init' first (it creates the schema and prints a first admin key)"
    )
    if url.get_backend_name() == "sqlite" and not Path(url.database or ":memory:").exists():
        raise no_schema
    engine = make_engine(settings, service=False)
    try:
        with engine.connect() as connection:
            revision = (
                connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
                if inspect(connection).has_table("alembic_version")
                else None
            )
    except OperationalError:
        return  # not answering (yet)
    finally:
        engine.dispose()
    head = head_revision()
    if revision is None:
        raise no_schema
    if revision != head and is_revision(revision):
        raise click.ClickException(
            f"the database is at migration {revision} and this release needs {head}; run "
            "'accountant db upgrade' first"
        )
    if revision != head:
        raise click.ClickException(
            f"the database is at migration {revision}, which this release does not know (a "
            "newer release migrated it); serve it with that release"
        )


def _say_if_no_admin(settings: Settings) -> None:
    """Log how to make the first admin when there is none and ACCOUNTANT_ADMIN_KEY is unset
    (after 'accountant db upgrade' alone): every API call would otherwise be a 401."""
    from sqlalchemy.exc import ProgrammingError

    from accountant.db import make_engine
    from accountant.models import Consumer

    if settings.admin_key:
        return
    engine = make_engine(settings, service=False)
    try:
        with engine.connect() as connection:
            admin = connection.execute(
                select(Consumer.id).where(Consumer.role == "admin").limit(1)
            ).first()
    except (OperationalError, ProgrammingError):
        return  # not answering (yet): /readyz says so
    finally:
        engine.dispose()
    if admin is None:
        logging.getLogger("accountant.serve").warning(
            "no admin yet: set ACCOUNTANT_ADMIN_KEY and restart, or run 'accountant keys "
            "create --name NAME --role admin'"
        )


def _prepare_host(settings: Settings) -> None:
    """``app.prepare_host``; a host or database it refuses is one line saying what to do."""
    from accountant.app import prepare_host
    from accountant.key_hashing import KeyHashSecretMismatch
    from accountant.keyfiles import MissingKeyFile
    from accountant.noise import NoiseSecretMismatch
    from accountant.seals import NotSealed

    try:
        prepare_host(settings)
    except (
        NoiseSecretMismatch,
        KeyHashSecretMismatch,
        MissingKeyFile,
        NotSealed,
        ConfigError,  # a webhook secret file that holds no secret
    ) as error:
        raise click.ClickException(str(error)) from None


_METRICS_PREFIX = "accountant-metrics-"


def _remove_stale_metrics_folders() -> None:
    """Remove the metrics folders of masters that are no longer running (killed, crashed)."""
    from pathlib import Path

    for folder in Path(tempfile.gettempdir()).glob(f"{_METRICS_PREFIX}*"):
        pid = folder.name[len(_METRICS_PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


@main.group("noise-secret")
def noise_secret() -> None:
    """The secret that keys every charge's noise (ACCOUNTANT_NOISE_SECRET_FILE)."""


@noise_secret.command("show")
def noise_secret_show() -> None:
    """Print the id of this host's noise secret and of the database's (creating none)."""
    from pathlib import Path

    from accountant import noise

    settings = _settings()
    engine = _database(settings)
    path = Path(settings.noise_secret_file)
    mine = noise.load(path).id if path.exists() else "no file"
    try:
        with engine.connect() as connection:
            known = noise.registered_id(connection)
    finally:
        engine.dispose()
    click.echo(f"this host: {mine} ({path})")
    click.echo(f"database:  {known or 'none registered yet'}")


@noise_secret.command("adopt")
@click.option(
    "--yes",
    is_flag=True,
    required=True,
    help="Confirm: replays of charges made under the old secret will be refused.",
)
def noise_secret_adopt(yes: bool) -> None:
    """Make this host's noise secret the database's, retiring the old one.

    Only for a secret that is lost for good: every retry of a charge made under
    the retired secret is then refused with a 409 (never answered with new noise),
    and every host must use the new secret file.
    """
    from pathlib import Path

    from accountant import noise

    settings = _settings()
    engine = _database(settings)
    secret = noise.load_or_create(Path(settings.noise_secret_file))
    try:
        with engine.connect() as connection:
            retired = noise.adopt(connection, secret)
    finally:
        engine.dispose()
    if retired is None:
        click.echo(f"the database already uses this host's noise secret ({secret.id})")
    else:
        click.echo(f"retired noise secret {retired}; the database now uses {secret.id}")


@main.group("webhook-secret")
def webhook_secret() -> None:
    """The secret budget alerts are signed with (ACCOUNTANT_ALERT_WEBHOOK_SECRET_FILE).

    The webhook's receiver verifies each alert with it (docs/operations.md,
    "Budget alert webhooks"); 'accountant serve' creates it when
    ACCOUNTANT_ALERT_WEBHOOK_URL is set and there is none.
    """


@webhook_secret.command("show")
@click.option("--reveal", is_flag=True, help="Also print the secrets, for the receiver.")
def webhook_secret_show(reveal: bool) -> None:
    """Print where the secret file is and the public ids of its secrets (creating none);
    with --reveal, then each secret on standard output, the newest first."""
    from pathlib import Path

    from accountant import webhook_signing

    path = Path(_settings().alert_webhook_secret_file)
    if not path.exists():
        raise click.ClickException(
            f"there is no webhook secret at {path} yet: 'accountant serve' creates one when "
            "ACCOUNTANT_ALERT_WEBHOOK_URL is set, or create it now with "
            "'accountant webhook-secret add'"
        )
    try:
        signer = webhook_signing.load(path)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"file: {path}", err=True)
    click.echo(f"ids:  {' '.join(signer.ids)} (the newest first)", err=True)
    if reveal:
        click.echo(path.read_text(), nl=False)


@webhook_secret.command("add")
def webhook_secret_add() -> None:
    """Put a new secret in front of the file's (creating the file when missing) and print it.

    Alerts are then signed with every secret in the file, so that a receiver
    that knows an older one still verifies them: give the receiver the new
    secret, then delete the older lines from the file.
    """
    from pathlib import Path

    from accountant import webhook_signing

    path = Path(_settings().alert_webhook_secret_file)
    try:
        secret = webhook_signing.add(path)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"added a new webhook secret in front of the others in {path}:", err=True)
    click.echo(secret)


def _mark_dead(_server: Any, worker: Any) -> None:
    """gunicorn hook: drop a dead worker's live gauges from the multiprocess metrics."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]  # prometheus_client's multiprocess module is untyped


@main.group()
def keys() -> None:
    """Create API keys."""


def _slug(_context: click.Context, parameter: click.Parameter, value: str) -> str:
    """A name as the HTTP API accepts it (lowercase letters, digits, - and _; at most 63)."""
    import re

    from accountant.api.schemas import SLUG

    if not re.fullmatch(SLUG, value):
        raise click.BadParameter(
            f"{value!r} is not a valid name: use 1 to 63 lowercase letters, "
            "digits, '-' and '_', starting with a letter or digit",
            param=parameter,
        )
    return value


@keys.command("create")
@click.option(
    "--name", required=True, callback=_slug, help="Consumer name; created if it does not exist."
)
@click.option("--role", required=True, type=click.Choice(["admin", "service", "auditor"]))
@click.option(
    "--dataset",
    "datasets",
    multiple=True,
    help="Dataset to grant (service role; repeat for several).",
)
def keys_create(name: str, role: str, datasets: tuple[str, ...]) -> None:
    """Print a new key for consumer NAME, once; the database keeps only its hash."""
    from accountant.db import begin_write, make_session_factory
    from accountant.errors import AccountantError
    from accountant.models import Consumer
    from accountant.seals import NotSealed, require_sealed
    from accountant.services.api_keys import issue_key
    from accountant.services.consumers import create_consumer

    settings = _settings()
    engine = _database(settings)
    sessions = make_session_factory(engine)
    hasher = _key_hasher(settings, engine)
    try:
        with sessions() as session:
            begin_write(session)
            require_sealed(session)  # a key issued here would seal its consumer
            consumer = session.execute(select(Consumer).where(Consumer.name == name)).scalar()
            if consumer is None:
                _, key = create_consumer(
                    session,
                    {"name": name, "role": role, "datasets": list(datasets)},
                    _now(),
                    hasher,
                )
            elif consumer.role != role:
                raise click.ClickException(
                    f"consumer {name!r} exists with role {consumer.role}: run again with "
                    f"--role {consumer.role} for another key of it, or choose a new --name for "
                    f"a {role}"
                )
            elif datasets:
                raise click.ClickException(
                    f"consumer {name!r} exists; --dataset applies only when creating one. "
                    f"Change its grants with PATCH /v1/consumers/{name}, or run again "
                    "without --dataset for a new key"
                )
            else:
                _, key = issue_key(session, consumer, _now(), hasher)
            session.commit()
    except AccountantError as error:
        raise click.ClickException(error.detail) from None
    except NotSealed as error:
        raise click.ClickException(str(error)) from None
    except (OperationalError, IntegrityError) as error:
        raise click.ClickException(
            f"database error: {error.orig}; did you run 'accountant db upgrade'?"
        ) from None
    click.echo(key)


@main.group()
def populations() -> None:
    """Populations: lifetime budgets over several user datasets of the same people.

    A population's loss is the sum of its member datasets' lifetime losses; a
    charge on a member is granted only if that sum stays within the
    population's limit. A dataset joins one when it is created (POST
    /v1/datasets with "population": NAME), for good.

    These commands call the service's HTTP API at --url (ACCOUNTANT_URL) with the
    key --key (ACCOUNTANT_KEY, else ACCOUNTANT_ADMIN_KEY): an admin's to create
    or change, an admin's or auditor's to read. Each prints the service's JSON
    answer. They need the Python client: pip install ./client.
    """


def _service_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--url`` and ``--key``, for a command that calls the service's HTTP API."""
    command = click.option(
        "--key",
        envvar=["ACCOUNTANT_KEY", "ACCOUNTANT_ADMIN_KEY"],
        show_envvar=True,
        help="The API key to call with. Prefer the environment: other users of this host "
        "can read a command line.",
    )(command)
    return click.option(
        "--url",
        envvar="ACCOUNTANT_URL",
        default="http://127.0.0.1:8000",
        show_default=True,
        show_envvar=True,
        help="The service's base URL.",
    )(command)


@dataclass(frozen=True)
class _Hints:
    """What a command over the HTTP API says, besides the service's own detail, when it
    cannot go on: which key it needs (``key``), which API it calls (``path``), who may
    (``allowed``, after a 403) and where to look (``listing``, after a 404)."""

    key: str
    path: str
    allowed: str
    listing: str


_POPULATIONS = _Hints(
    key="an admin's to create or change a population",
    path="/v1/populations",
    allowed="creating or changing a population needs an admin's key, reading one an admin's "
    "or an auditor's",
    listing="'accountant populations list' shows the populations",
)
_REQUESTS = _Hints(
    key="an admin's to approve or deny, a service's to ask for a quota",
    path="/v1/requests",
    allowed="approving or denying takes the key of an admin other than the requester; "
    "reading every request an admin's or an auditor's (a service reads its own)",
    listing="'accountant requests list' shows the requests",
)
_QUOTA_REQUEST = _Hints(
    key=_REQUESTS.key,
    path=_REQUESTS.path,
    allowed="asking for a quota takes the key of a service granted the dataset",
    listing="the service's key reads the datasets granted to it with GET /v1/datasets",
)


@contextmanager
def _service(url: str, key: str | None, hints: _Hints = _POPULATIONS) -> Iterator[ApiClient]:
    """A client of the service at ``url`` calling with ``key``, retrying for 10 s; a
    refusal or no answer is one line saying what to do next (``hints``)."""
    if not key:
        raise click.UsageError(f"no API key: set ACCOUNTANT_KEY ({hints.key}) or pass --key")
    try:
        from accountant_client import AccountantError, Client
    except ImportError as missing:
        raise click.ClickException(
            "these commands call the service through its Python client, which is not "
            f"installed here ({missing.name} is missing): pip install ./client from the "
            f"repository, or call the HTTP API ({hints.path}) directly"
        ) from None
    try:
        with Client(url, key, deadline=10) as client:
            yield client
    except AccountantError as error:
        raise click.ClickException(_next_step(error, url, hints)) from None


def _next_step(error: ClientError, url: str, hints: _Hints) -> str:
    """The service's refusal (whose detail says what to do), and what to do here."""
    from accountant_client import Forbidden, InvalidRequest, NotFound, Unauthorized, Unavailable

    detail = error.detail.rstrip(".")
    if isinstance(error, Unavailable):
        return (
            f"no answer from {url} ({detail}); is the service running there? Set "
            "ACCOUNTANT_URL or pass --url"
        )
    if isinstance(error, Unauthorized):
        return (
            f"{url} refused the key ({error.status}: {detail}); set ACCOUNTANT_KEY to a key of "
            "this service ('accountant keys create --name NAME --role admin' prints one)"
        )
    if isinstance(error, Forbidden):
        return f"{detail} ({error.status}); {hints.allowed}"
    if isinstance(error, NotFound):
        return f"{detail} ({error.status}); {hints.listing}"
    if isinstance(error, InvalidRequest):  # each field at fault the detail does not name
        unsaid = [
            f"{e.get('field')}: {e.get('message')}"
            for e in error.errors
            if str(e.get("message")) not in detail
        ]
        return "; ".join([detail, *unsaid]) + f" ({error.status})"
    return f"{detail} ({error.status})"


def _print_json(answer: Any) -> None:
    import json

    click.echo(json.dumps(answer, indent=2))


def _budget(epsilon: float, delta: float | None) -> dict[str, float]:
    return {"epsilon": epsilon} if delta is None else {"epsilon": epsilon, "delta": delta}


@populations.command("create")
@click.argument("name", callback=_slug)
@click.option(
    "--accounting",
    required=True,
    metavar="MODE",
    help="The accounting mode (pure, approx, zcdp, rdp or gdp; docs/accounting.md), which "
    "every member dataset must have.",
)
@click.option("--epsilon", required=True, type=float, help="The lifetime limit's epsilon.")
@click.option(
    "--delta",
    type=float,
    help="The lifetime limit's delta (required on zcdp; none on pure).",
)
@click.option(
    "--rdp-order",
    type=float,
    help="rdp only: the Renyi order (above 1) of the population and of every member, fixed "
    "at creation.",
)
@_service_options
def populations_create(
    name: str,
    accounting: str,
    epsilon: float,
    delta: float | None,
    rdp_order: float | None,
    url: str,
    key: str | None,
) -> None:
    """Create population NAME (privacy unit user), with a lifetime limit of EPSILON (and
    DELTA) over the datasets that will join it; print it.

    Its loss is the sum of its members' lifetime losses, which bounds what they reveal
    about one person only if every member identifies the same people by the same
    person-level id: make sure of that before a dataset joins. Populations and datasets
    share one namespace of names."""
    with _service(url, key) as service:
        created = service.create_population(
            name, accounting=accounting, budget=_budget(epsilon, delta), rdp_order=rdp_order
        )
    _print_json(created)
    if created.get("identity"):
        click.echo(f"note: {created['identity']}", err=True)


@populations.command("list")
@_service_options
def populations_list(url: str, key: str | None) -> None:
    """Print every population, with its member datasets."""
    with _service(url, key) as service:
        listed = service.populations()
    _print_json({"populations": listed})


@populations.command("show")
@click.argument("name", callback=_slug)
@_service_options
def populations_show(name: str, url: str, key: str | None) -> None:
    """Print population NAME: its mode, limit and member datasets."""
    with _service(url, key) as service:
        _print_json(service.population(name))


@populations.command("budget")
@click.argument("name", callback=_slug)
@_service_options
def populations_budget(name: str, url: str, key: str | None) -> None:
    """Print population NAME's budget: its loss (the sum of its members' lifetime losses),
    limit and remaining, each member's loss, and the history of its limit."""
    with _service(url, key) as service:
        _print_json(service.population_budget(name))


@populations.command("set-limit")
@click.argument("name", callback=_slug)
@click.option("--epsilon", required=True, type=float, help="The new lifetime limit's epsilon.")
@click.option("--delta", type=float, help="The new lifetime limit's delta.")
@click.option(
    "--reason", required=True, help="Why, for the ledger (the population's own hash chain)."
)
@_service_options
def populations_set_limit(
    name: str, epsilon: float, delta: float | None, reason: str, url: str, key: str | None
) -> None:
    """Change population NAME's lifetime limit, ledgered with REASON; print the population.

    A limit lowered below the population's loss blocks further charges on its members;
    nothing is refunded. With approvals on (ACCOUNTANT_APPROVALS), a raise prints a pending
    request instead and changes nothing until another admin approves it ('accountant
    requests approve')."""
    with _service(url, key) as service:
        from accountant_client import PendingApproval

        try:
            changed = service.update_population(name, budget=_budget(epsilon, delta), reason=reason)
        except PendingApproval as pending:
            _print_pending(pending.request)
            return
    _print_json(changed)


def _print_pending(request: ChangeRequest) -> None:
    """A change that became a pending request: the request, and what happens next."""
    _print_json(request.raw)
    click.echo(
        f"pending: nothing changed yet; an admin other than the requester approves request "
        f"{request.request_id} with 'accountant requests approve {request.request_id} "
        "--reason TEXT' (or denies it with 'accountant requests deny')",
        err=True,
    )


@main.group()
def requests() -> None:
    """Change requests: changes that wait for a second admin (approvals).

    With ACCOUNTANT_APPROVALS=on, a change that weakens a promise (a dataset's
    or a population's limit raised, a new admin or admin key) is not made but
    kept as a pending request; an admin other than the requester approves it
    (the change is made then, ledgered with both names and both reasons) or
    denies it. A service asks for a larger quota the same way, approvals on
    or off. Pending requests expire (ACCOUNTANT_APPROVAL_EXPIRY_S, 7 days by
    default).

    These commands call the service's HTTP API at --url (ACCOUNTANT_URL) with the
    key --key (ACCOUNTANT_KEY, else ACCOUNTANT_ADMIN_KEY): an admin's to approve
    or deny, a service's to ask for a quota, an admin's, an auditor's or (its
    own requests) a service's to read. Each prints the service's JSON answer.
    They need the Python client: pip install ./client.
    """


_STATES = ("pending", "approved", "denied", "expired")


def _request_id(_context: click.Context, parameter: click.Parameter, value: str) -> str:
    """A request's id as the service makes them (a UUID): never a path of its own."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}", value):
        raise click.BadParameter(
            f"{value!r} is not a request id; 'accountant requests list' shows them",
            param=parameter,
        )
    return value


@requests.command("list")
@click.option(
    "--state", type=click.Choice(_STATES), help="Only the requests in this state (as of now)."
)
@_service_options
def requests_list(state: str | None, url: str, key: str | None) -> None:
    """Print the change requests, newest first: every one for an admin's or an auditor's
    key, its own for a service's."""
    with _service(url, key, _REQUESTS) as service:
        listed = service.requests(state)
    _print_json({"requests": [request.raw for request in listed]})


@requests.command("show")
@click.argument("request_id", metavar="ID", callback=_request_id)
@_service_options
def requests_show(request_id: str, url: str, key: str | None) -> None:
    """Print change request ID: what it changes, who asked and why, and its state."""
    with _service(url, key, _REQUESTS) as service:
        _print_json(service.get_request(request_id).raw)


_DECISION_REASON = "Why, for the ledger (and the requester)."


@requests.command("approve")
@click.argument("request_id", metavar="ID", callback=_request_id)
@click.option("--reason", required=True, help=_DECISION_REASON)
@_service_options
def requests_approve(request_id: str, reason: str, url: str, key: str | None) -> None:
    """Approve change request ID with REASON (an admin other than the requester): the change
    is made now, ledgered with both names and both reasons; print the request.

    A new admin's or admin key's api_key is printed this once, in "result": hand it to
    the requester. A request already decided or expired, or whose target changed since it
    was made, is refused: deny it, and ask again on what stands now."""
    with _service(url, key, _REQUESTS) as service:
        approved = service.approve(request_id, reason=reason)
    _print_json(approved.raw)
    if approved.result is not None:
        click.echo(
            f"note: the new key of {approved.result.consumer!r} (result.api_key) is shown "
            f"this once: hand it to {approved.requested_by!r} (revoke it with DELETE "
            f"/v1/keys/{approved.result.key_id})",
            err=True,
        )


@requests.command("deny")
@click.argument("request_id", metavar="ID", callback=_request_id)
@click.option("--reason", required=True, help=_DECISION_REASON)
@_service_options
def requests_deny(request_id: str, reason: str, url: str, key: str | None) -> None:
    """Deny change request ID with REASON (an admin other than the requester): the change
    is never made; print the request."""
    with _service(url, key, _REQUESTS) as service:
        _print_json(service.deny(request_id, reason=reason).raw)


@requests.command("ask-quota")
@click.option(
    "--dataset", required=True, callback=_slug, help="The dataset, granted to the key's service."
)
@click.option("--epsilon", required=True, type=float, help="The quota's epsilon.")
@click.option("--delta", type=float, help="The quota's delta (none: no tighter delta limit).")
@click.option("--reason", required=True, help="Why, for the admin who decides.")
@_service_options
def requests_ask_quota(
    dataset: str, epsilon: float, delta: float | None, reason: str, url: str, key: str | None
) -> None:
    """Ask, with a service's key, for a quota of EPSILON (and DELTA) on DATASET, for REASON;
    print the pending request, which an admin approves (the quota is set then) or denies."""
    with _service(url, key, _QUOTA_REQUEST) as service:
        asked = service.ask_quota(dataset, _budget(epsilon, delta), reason=reason)
    _print_pending(asked)


@main.group()
def ledger() -> None:
    """Check the ledger."""


@ledger.command("verify")
@click.option(
    "--against",
    "copies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="An earlier export (JSON Lines or CSV from GET /v1/ledger/export) that the "
    "ledger must still contain; repeat for several.",
)
@click.option(
    "--file",
    "export_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Verify this JSON Lines export alone, offline: no database, no settings.",
)
@click.option(
    "--jwks",
    "jwks_file",
    type=click.Path(exists=True, dir_okay=False),
    help="With --file: the service's public keys (the JSON of GET /v1/receipts/public-key, "
    "or one JWK), to check that the service signed the export.",
)
def ledger_verify(copies: tuple[str, ...], export_file: str | None, jwks_file: str | None) -> None:
    """Recompute every dataset's hash chain; exit 1 naming the first bad entry.

    With --against, also check that nothing an earlier export shows was truncated or
    rewritten since (the chain alone cannot tell a truncated chain whose recorded head was
    rewound, or a deleted dataset, from one that never had more). With --file, verify an
    export instead of the database: its chains, and the signature on its last line, which
    says how many entries of each dataset it holds and where each ends (a line deleted at
    the end is caught); with --jwks, also that the service made that signature
    (docs/ledger.md)."""
    if export_file is not None:
        _verify_export(export_file, jwks_file)
        return
    if jwks_file is not None:
        raise click.UsageError("--jwks applies to --file only")
    from accountant.db import begin_snapshot, make_session_factory
    from accountant.key_hashing import foreign
    from accountant.services import ledger as ledger_service
    from accountant.services.verification import verify

    anchors = _anchors(copies)
    settings = _settings()
    sessions = make_session_factory(_database(settings))
    hasher = _existing_key_hasher(settings)
    with sessions() as session:
        other = None if hasher is None else foreign(session, hasher)
        begin_snapshot(session)
        result = verify(
            session,
            progress=lambda n: click.echo(f"  {n} entries checked ...", err=True),
            hasher=None if other else hasher,
        )
        missing = ledger_service.anchors_missing(session, anchors) if result.ok else []
    for problem in missing:
        click.echo(f"DAMAGED: {problem}", err=True)
    if missing:
        sys.exit(1)
    if not result.ok:
        where = (
            ""
            if result.first_bad is None
            else f" at entry id {result.first_bad.id} (seq {result.first_bad.seq})"
        )
        subject = "" if result.dataset is None else f"dataset {result.dataset!r}{where}: "
        click.echo(f"DAMAGED: {subject}{result.reason}", err=True)
        sys.exit(1)
    click.echo(f"ok: {result.entries} entries in {len(result.heads)} chains")
    for name, head in sorted(result.heads.items()):
        click.echo(f"  {name} {head}")
    if other:  # a secret is configured here, but its seals cannot be checked
        click.echo(f"NOT VERIFIED: seals not checked: {other}", err=True)
        sys.exit(1)
    if not result.seals_checked:
        click.echo(
            "note: seals not checked: this host has no key-hash secret "
            f"({settings.key_hash_secret_file}); run this where the service runs, with its "
            "ACCOUNTANT_KEY_HASH_SECRET_FILE, to check them",
            err=True,
        )


def _verify_export(path: str, jwks_file: str | None) -> None:
    from accountant import ledger_file, ledger_readable
    from accountant.signing import ReceiptError, verify

    with open(path, encoding="utf-8") as file:
        result = ledger_file.verify_lines(file)
    if not result.ok:
        click.echo(f"DAMAGED: {result.problem}", err=True)
        sys.exit(1)
    if result.signature is None:
        click.echo(
            "NOT VERIFIED: the export carries no signature (its last line has no "
            "export_signature: deleted, or an export made before exports carried one), so "
            "nothing shows whether lines were deleted at its end",
            err=True,
        )
        sys.exit(1)
    try:
        claims = (
            ledger_file.claims_of(result.signature)
            if jwks_file is None
            else verify(result.signature, _public_keys(jwks_file))
        )
    except (ReceiptError, ValueError) as error:
        click.echo(f"DAMAGED: the export's signature: {error}", err=True)
        sys.exit(1)
    problem = ledger_file.check_claims(result, claims)
    terms = ledger_readable.signed_terms(claims)
    if problem is None and terms is not None:
        with open(path, encoding="utf-8") as file:
            problem = ledger_readable.first_difference(file, terms)
    if problem is not None:
        click.echo(f"DAMAGED: {problem}", err=True)
        sys.exit(1)
    heads = claims.get("heads")
    click.echo(f"ok: {result.lines} entries in {len(result.segments)} chains")
    for name, segment in sorted(result.segments.items()):
        signed = heads.get(name) if isinstance(heads, dict) else None
        head = signed.get("seq") if isinstance(signed, dict) else None
        whole = "whole chain" if (segment.first, segment.last) == (1, head) else "a segment"
        click.echo(f"  {name} seq {segment.first}..{segment.last} ({whole}) {segment.hash}")
    if jwks_file is None:
        click.echo(
            "note: the signature's claims were checked, not who made it: pass --jwks FILE "
            "(GET /v1/receipts/public-key) to check that the service signed the export",
            err=True,
        )
    if terms is None:
        click.echo(
            "note: the readable figures (cost, charged, created_at, reason) were not checked: "
            "the signature states no chain's terms (an export made before it did); read "
            "cost_units and created_at_us, which the hashes cover",
            err=True,
        )


def _public_keys(path: str) -> list[dict[str, str]]:
    """The JWKs in ``path``: a JWK set ({"keys": [...]}), a list of JWKs, or one JWK."""
    import json

    try:
        with open(path, encoding="utf-8") as file:
            loaded = json.load(file)
    except ValueError as error:
        raise click.BadParameter(f"{path} is not JSON: {error}", param_hint="--jwks") from None
    keys = loaded.get("keys", [loaded]) if isinstance(loaded, dict) else loaded
    if not (
        isinstance(keys, list)
        and keys
        and all(isinstance(k, dict) and {"kid", "x"} <= set(k) for k in keys)
    ):
        raise click.BadParameter(
            f"{path} holds no JWK with 'kid' and 'x': save the JSON of GET /v1/receipts/public-key",
            param_hint="--jwks",
        )
    return keys


def _anchors(paths: tuple[str, ...]) -> dict[str, tuple[int, str]]:
    """The last (seq, hash) of each dataset in the earlier exports at ``paths``."""
    import csv
    import json

    last: dict[str, tuple[int, str]] = {}
    for path in paths:
        with open(path, newline="", encoding="utf-8") as file:
            first = file.read(1)
            file.seek(0)
            rows = (
                (json.loads(line) for line in file if line.strip())
                if first == "{"
                else csv.DictReader(file)
            )
            try:
                for row in rows:
                    name, seq = _plain_cell(row["dataset"]), int(row["seq"])
                    if seq > last.get(name, (0, ""))[0]:
                        last[name] = (seq, row["hash"])
            except (KeyError, ValueError) as error:
                raise click.ClickException(
                    f"{path} is not a ledger export (JSON Lines or CSV with dataset, seq and "
                    f"hash): {error}"
                ) from None
    return last


def _plain_cell(value: str) -> str:
    """A CSV cell as it was before the export escaped a leading formula character."""
    return (
        value[1:] if value[:1] == "'" and value[1:2] in ("=", "+", "-", "@", "\t", "\r") else value
    )


@main.group("seals")
def seals_group() -> None:
    """Seals: keyed digests that tell the service's writes from edits in the database."""


@seals_group.command("init")
def seals_init() -> None:
    """Seal a database from before seals, or its chain heads, once, as it stands, and
    ledger who did it.

    The service seals each dataset's terms and chain head and each consumer's role,
    grants, quotas and keys as it writes them, and never seals rows that exist: on a
    database from before seals it does not start, and 'accountant ledger verify' reports
    it DAMAGED, until this command is run; on a database sealed before chain heads were
    (migration 0016), verify reports the unsealed heads until this command seals them.
    Check the database first ('accountant ledger verify --against' earlier exports, the
    consumers' roles and the datasets' limits): sealing vouches for the rows as they
    stand. Refused when what it would seal is sealed already or the ledger does not
    verify. Each dataset's chain records who ran it (a limit_change entry of scope
    'seals'); it prints what it sealed. Run it on a host with the key-hash secret
    (ACCOUNTANT_KEY_HASH_SECRET_FILE)."""
    from datetime import UTC, datetime

    from accountant.db import begin_write, make_session_factory
    from accountant.errors import AccountantError
    from accountant.key_hashing import KeyHashSecretMismatch
    from accountant.services import sealing

    settings = _settings()
    engine = _database(settings)
    sessions = make_session_factory(engine)
    hasher = _key_hasher(settings, engine)
    now, by = _now(), _operator()
    try:
        with sessions() as session:
            begin_write(session)
            sealed = sealing.init(session, hasher, now, by)
            session.commit()
    except AccountantError as error:
        raise click.ClickException(error.detail) from None
    except KeyHashSecretMismatch as error:
        raise click.ClickException(str(error)) from None
    at = datetime.fromtimestamp(now / 1e6, UTC).isoformat(timespec="seconds")
    what = (
        f"the chain heads of {len(sealed.datasets)} datasets"
        if sealed.heads_only
        else f"{len(sealed.datasets)} datasets and {len(sealed.consumers)} consumers"
    )
    click.echo(f"sealed {what} as they stood, by {by} at {at}:")
    for dataset in sealed.datasets:
        click.echo(
            f"  dataset {dataset.name}: terms_sha256 {dataset.terms_sha256}, head seq "
            f"{dataset.head.seq} {dataset.head.hash}"
        )
    for consumer in sealed.consumers:
        granted = f" on {', '.join(consumer.datasets)}" if consumer.datasets else ""
        click.echo(
            f"  consumer {consumer.name}: {consumer.role}{granted}, {consumer.keys} live keys"
        )
    click.echo(
        "each dataset's chain records it (a limit_change entry of scope 'seals'); from now "
        "on 'accountant ledger verify' checks every seal",
        err=True,
    )


def _operator() -> str:
    """Who runs this command: the user and host, for the ledger."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container, say)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


@ledger.command("rebuild-totals")
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    required=True,
    help="Only compare the rebuilt totals with the stored ones (required).",
)
def ledger_rebuild_totals(check_only: bool) -> None:
    """Recompute every scope's totals from the ledger; exit 1 on any difference."""
    from accountant.db import make_session_factory
    from accountant.services import totals

    sessions = make_session_factory(_database(_settings()))
    with sessions() as session:
        replayed, differences = totals.check(session)
    for diff in differences:
        click.echo(
            f"DIFFERENT {diff.dataset} {diff.scope} {diff.what}: stored {diff.stored}, "
            f"ledger says {diff.rebuilt}",
            err=True,
        )
    if differences:
        sys.exit(1)
    click.echo(f"ok: the totals equal the {replayed} granted ledger entries")


@main.group()
def plugins() -> None:
    """Inspect mechanism plugins."""


@plugins.command("list")
def plugins_list() -> None:
    """List registered mechanisms and refused plugins."""
    from accountant.plugins import MechanismRegistry, make_plugin_manager

    settings = _settings()
    registry = MechanismRegistry(*make_plugin_manager(settings.disabled_plugins))
    for mechanism in registry.all():
        runs = "" if mechanism.runs else " (accounting-only)"
        click.echo(
            f"{mechanism.name:24} {mechanism.plugin:20} {','.join(mechanism.accounting)}{runs}"
        )
    for refusal in registry.refusals:
        click.echo(f"REFUSED {refusal.plugin} {refusal.mechanism or ''}: {refusal.reason}")
    if registry.refusals:
        sys.exit(1)


@plugins.command("audit")
@click.argument("name")
@click.option(
    "--samples",
    default=1_000_000,
    show_default=True,
    type=click.IntRange(1000),
    help="Outputs drawn per neighbouring input (selections use at most 20000).",
)
@click.option(
    "--alpha",
    default=1e-3,
    show_default=True,
    type=click.FloatRange(1e-12, 0.5),
    help="False-alarm probability for an honest mechanism.",
)
def plugins_audit(name: str, samples: int, alpha: float) -> None:
    """Empirically test mechanism NAME on neighbouring inputs; exit 1 if its epsilon is
    provably larger than it declares. Needs the audit extra (scipy)."""
    try:
        from accountant.audit import audit
    except ModuleNotFoundError as missing:
        raise click.ClickException(
            f"the audit needs {missing.name}: pip install 'privacy-accountant[audit]'"
        ) from None
    from accountant.plugins import MechanismRegistry, make_plugin_manager

    registry = MechanismRegistry(*make_plugin_manager(_settings().disabled_plugins))
    mechanism = registry.get(name)
    if mechanism is None:
        known = ", ".join(m.name for m in registry.all())
        raise click.ClickException(f"no mechanism {name!r}; registered: {known}")
    if not mechanism.runs:
        raise click.ClickException(
            f"{name!r} is accounting-only: it has no run to draw outputs from; its cost is "
            "tested against reference computations instead (docs/mechanisms.md)"
        )
    started = time.monotonic()
    findings = audit(
        mechanism,
        samples=samples,
        alpha=alpha,
        progress=lambda message: click.echo(message, err=True),
    )
    for finding in findings:
        verdict = "pass" if finding.passed else "FAIL"
        click.echo(
            f"{verdict} {name} {finding.label}: epsilon >= "
            f"{finding.epsilon_lower_bound:.4f} with confidence {1 - alpha:g} "
            f"(declared {finding.declared_epsilon:g}, delta {finding.declared_delta:g}, "
            f"{finding.samples} samples per side, event {finding.event})"
        )
    click.echo(f"audited in {time.monotonic() - started:.1f} s", err=True)
    if not all(finding.passed for finding in findings):
        sys.exit(1)
