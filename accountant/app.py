"""The Flask application factory."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flask import Flask, Response, g, request
from gunicorn.http.errors import ParseException
from sqlalchemy.exc import (
    DataError,
    IntegrityError,
    OperationalError,
    ProgrammingError,
)
from werkzeug.exceptions import HTTPException

from accountant import key_hashing, noise, problems, seals, signing, webhook_signing
from accountant import logging as structured_logging
from accountant.alerts import AlertDispatcher, AlertSettings
from accountant.api import (
    batches,
    charges,
    consumers,
    datasets,
    holds,
    ledger,
    meta,
    openapi,
    populations,
    receipts,
    requests,
)
from accountant.clock import Clock, SystemClock
from accountant.config import ConfigError, Settings, load_settings
from accountant.dashboard import views as dashboard
from accountant.dashboard.session import CookieSessions
from accountant.db import begin_write, make_engine, make_session_factory, schema_missing
from accountant.deadline import request_deadline
from accountant.errors import AccountantError, Conflict, InvalidRequest, Unavailable
from accountant.group_commit import GroupCommit
from accountant.jsonio import DecimalJSONProvider
from accountant.metrics import (
    CHARGE_SECONDS,
    DATABASE_ERRORS,
    observe_transaction,
    outcome_of,
    record_metric,
)
from accountant.migrate import head_revision
from accountant.plugins import MechanismRegistry, make_plugin_manager
from accountant.rate_limit import RateLimiter
from accountant.services.api_keys import KnownKeys
from accountant.services.charges import ChargeContext
from accountant.services.consumers import ensure_first_admin
from accountant.services.receipts import register as register_key
from accountant.web import Runtime, close_db

log = logging.getLogger(__name__)


def _with_database_deadline(wsgi_app: Any, seconds: float) -> Any:
    """``wsgi_app`` with one deadline for all of a request's waits for the database
    (``pg_deadline.request_deadline``), up to its response's first byte; a streamed body
    (the ledger export) runs each of its transactions under their own bounds."""

    def within_deadline(environ: Any, start_response: Any) -> Any:
        with request_deadline(seconds):
            return wsgi_app(environ, start_response)

    return within_deadline


def create_app(
    config: Mapping[str, Any] | Settings | None = None,
    *,
    clock: Clock | None = None,
    extra_plugins: Iterable[tuple[str, object]] = (),
) -> Flask:
    """Build the service, and nothing else: it reads the key and secret files, which must
    exist, and opens no database connection. ``prepare_host`` (run by ``accountant init``
    and ``accountant serve``) creates those files, registers them with the database and
    creates the first admin. ``config`` overrides environment settings (tests pass a
    mapping)."""
    settings = config if isinstance(config, Settings) else load_settings(config)
    structured_logging.configure(settings.log_level)
    app = Flask(__name__)
    # a path with a double slash is a 404 problem+json, not an HTML redirect to another path
    app.url_map.merge_slashes = False
    app.json = DecimalJSONProvider(app)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    engine = make_engine(settings)
    pm, refusals = make_plugin_manager(settings.disabled_plugins, extra_plugins)
    signer = signing.load(Path(settings.signing_key_file))
    clock = clock or SystemClock()
    hasher = key_hashing.load(Path(settings.key_hash_secret_file))
    if settings.alert_webhook_url is not None:  # never an alert that cannot be signed
        webhook_signing.load(Path(settings.alert_webhook_secret_file))
    app.extensions["accountant"] = Runtime(
        settings=settings,
        engine=engine,
        sessions=make_session_factory(engine),
        registry=MechanismRegistry(pm, refusals),
        head_revision=head_revision(),
        signer=signer,
        clock=clock,
        charging=ChargeContext(
            noise=noise.load(Path(settings.noise_secret_file)),
            signer=signer,
            clock=clock,
            alerts=AlertDispatcher(pm, AlertSettings.of(settings)),
            signer_published=[False],
            group=GroupCommit(settings.lock_timeout_ms / 1000, observe=observe_transaction),
            hasher=hasher,
        ),
        key_hasher=hasher,
        known_keys=KnownKeys(),
        rate_limiter=None if settings.rate_limit is None else RateLimiter(settings.rate_limit),
    )
    app.extensions["accountant_engine"] = engine
    for blueprint in (
        meta.bp,
        openapi.bp,
        datasets.bp,
        populations.bp,
        requests.bp,
        consumers.bp,
        charges.bp,
        batches.bp,
        holds.bp,
        ledger.bp,
        receipts.bp,
        dashboard.bp,
    ):
        app.register_blueprint(blueprint)
    app.secret_key = signing.derive_secret(signer, b"accountant dashboard session v1")
    app.session_interface = CookieSessions()
    app.config.update(
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_NAME="accountant_session",
        PERMANENT_SESSION_LIFETIME=8 * 3600,
    )
    app.teardown_appcontext(close_db)
    app.wsgi_app = _with_database_deadline(app.wsgi_app, settings.database_deadline_s)  # type: ignore[method-assign]  # WSGI middleware, as Flask documents

    @app.before_request
    def _start_clock() -> None:
        g.started = time.perf_counter()

    @app.after_request
    def _observe(response: Response) -> Response:
        if request.endpoint == "charges.create" and "started" in g:
            record_metric(
                lambda: CHARGE_SECONDS.labels(outcome_of(response.status_code)).observe(
                    time.perf_counter() - g.started
                )
            )
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    _register_error_handlers(app)
    return app


def prepared_app(config: Mapping[str, Any] | Settings | None = None, **options: Any) -> Flask:
    """``prepare_host`` then ``create_app``: what ``accountant serve`` does, in one process
    (tests, benchmarks)."""
    settings = config if isinstance(config, Settings) else load_settings(config)
    prepare_host(settings)
    return create_app(settings, **options)


def prepare_host(settings: Settings) -> None:
    """What ``accountant init`` and ``accountant serve`` do once before any worker starts:
    create the signing key, noise secret and key-hash secret files (and, with a webhook URL,
    the webhook secret), publish the signing key, register the secrets (or refuse another
    database's; a secret the database is served with is never made anew where its file is
    missing: ``MissingKeyFile`` says where to find it, so that moving the signing key never
    moves a secret), refuse a database with rows but no record of its seals
    (``seals.NotSealed``: ``accountant seals init`` seals one from before seals), and create
    the first admin from ``ACCOUNTANT_ADMIN_KEY``. It opens its own connections and closes
    all of them: a SQLite connection inherited across fork shares its
    file locks with the parent, and when the parent dies the WAL can be deleted under the
    workers, losing acknowledged charges."""
    engine = make_engine(settings)
    try:
        try:  # a secret the database already has is found where it is, never made anew
            with engine.connect() as connection, connection.begin():
                registered = noise.registered_id(connection), key_hashing.registered_id(connection)
        except (OperationalError, ProgrammingError):
            registered = None, None  # no schema yet, or no answer: nothing registered to find
        secret = noise.load_or_create(Path(settings.noise_secret_file), registered[0])
        hasher = key_hashing.load_or_create(Path(settings.key_hash_secret_file), registered[1])
        signer = signing.load_or_create(Path(settings.signing_key_file))
        _prepare_webhook_secret(settings)
        try:
            with engine.connect() as connection:
                noise.register(connection, secret)
                key_hashing.register(connection, hasher)
                with connection.begin():
                    seals.require_sealed(connection)  # never seal existing rows unasked
        except (OperationalError, ProgrammingError):
            log.info("no schema yet; run 'accountant db upgrade'")
            return
        with make_session_factory(engine)() as session:
            try:
                begin_write(session)
                register_key(session, signer, time.time_ns() // 1000)
                session.commit()
            except IntegrityError:
                session.rollback()  # another host registered it at the same moment
        if settings.admin_key:
            with make_session_factory(engine)() as session:
                try:
                    begin_write(session)
                    if ensure_first_admin(
                        session, settings.admin_key, time.time_ns() // 1000, hasher
                    ):
                        log.info(
                            "created the first admin consumer 'admin' from ACCOUNTANT_ADMIN_KEY"
                        )
                    session.commit()
                except IntegrityError:
                    session.rollback()  # another host created it first
    finally:
        engine.dispose()


def _prepare_webhook_secret(settings: Settings) -> None:
    """With a webhook URL, create the secret alerts are signed with unless its file exists,
    check it, and log where it is and its public ids (never the secret): an alert is never
    sent unsigned, and an existing deployment keeps starting without a new setting."""
    if settings.alert_webhook_url is None:
        return
    path = Path(settings.alert_webhook_secret_file)
    try:
        webhook_signing.create(path)
    except OSError as error:  # a read-only mount, as secrets are in containers
        raise ConfigError(
            f"cannot create the webhook signing secret {path} ({error.strerror}): put a secret "
            "there ('accountant webhook-secret add' with ACCOUNTANT_ALERT_WEBHOOK_SECRET_FILE "
            "naming a writable file prints one), or set that setting to a file it can create"
        ) from None
    log.info(
        "budget alerts are signed for the webhook",
        extra={"path": str(path), "secret_ids": webhook_signing.load(path).ids},
    )


def _no_schema() -> Response:
    log.error("the database has no schema or is behind this release's migrations")
    return problems.response(
        problems.of(
            Unavailable(
                "the database has no schema, or is behind this release's migrations; an "
                "operator must run 'accountant db upgrade' (a retry fails until then)",
                retry_after=60,
            )
        )
    )


#: A charge's or a hold's path with an id that is not a UUID, which no route matches.
_BY_ID = re.compile(r"/v1/(?:(charge)s/([^/]+)|(hold)s/([^/]+)(?:/settle|/release)?)")


def _not_found(path: str) -> str:
    """Why nothing answers at ``path``: an id that cannot be a charge's or a hold's, or a
    path the API does not have."""
    if named := _BY_ID.fullmatch(path):
        what, given = (named[1], named[2]) if named[1] else (named[3], named[4])
        return (
            f"no {what} with id {given!r}: a {what} id is a UUID, as its "
            f"{'receipt' if what == 'charge' else 'creation'} states it"
        )
    return (
        f"nothing is served at {path}; check the path against the operations listed in "
        "GET /openapi.json (docs/api.md)"
    )


def _register_error_handlers(app: Flask) -> None:
    @app.errorhandler(AccountantError)
    def _on_domain_error(error: AccountantError) -> Response:
        return problems.response(problems.of(error))

    @app.errorhandler(HTTPException)
    def _on_http(error: HTTPException) -> Response:
        detail = error.description or error.name
        if error.code == 404:
            detail = _not_found(request.path)
        if error.code == 405:
            allowed = dict(error.get_headers()).get("Allow", "")
            detail = (
                f"{request.method} is not served at {request.path}; it answers "
                f"{allowed} (GET /openapi.json)"
            )
        if error.code == 413:
            limit = app.config["MAX_CONTENT_LENGTH"]
            detail = f"the request body is larger than {limit} bytes; send less data"
        allow = {name: value for name, value in error.get_headers() if name == "Allow"}
        return problems.response(
            problems.problem(
                error.code or 500,
                error.name.lower().replace(" ", "-"),
                error.name,
                detail,
                headers=allow,
            )
        )

    @app.errorhandler(ParseException)
    def _on_broken_framing(error: ParseException) -> Response:
        # gunicorn finds a broken chunked body only as the application reads it
        detail = (
            f"the body's chunked transfer encoding is broken ({type(error).__name__}): each "
            "chunk is its size in hex, CRLF, its data and CRLF, and a chunk of size 0 ends "
            "the body; or send the body with Content-Length"
        )
        return problems.response(
            problems.of(InvalidRequest(detail, errors=[{"field": "", "message": detail}]))
        )

    @app.errorhandler(IntegrityError)
    def _on_integrity(error: IntegrityError) -> Response:
        log.warning("integrity conflict", extra={"path": request.path})
        return problems.response(
            problems.of(Conflict("the request conflicts with the current state; retry it"))
        )

    @app.errorhandler(DataError)
    def _on_data(error: DataError) -> Response:
        # A value the database refuses to store or compare, such as a NUL character in a
        # name on PostgreSQL: the request's fault, and nothing was written.
        detail = (
            "a value in the request cannot be used by the database (for example a NUL "
            "character or a number out of range); remove it"
        )
        return problems.response(
            problems.of(InvalidRequest(detail, errors=[{"field": "", "message": detail}]))
        )

    @app.errorhandler(ProgrammingError)
    def _on_statement(error: ProgrammingError) -> Response:
        return _no_schema() if schema_missing(error) else _on_unexpected(error)

    @app.errorhandler(OperationalError)
    def _on_database(error: OperationalError) -> Response:
        if schema_missing(error):
            return _no_schema()
        record_metric(DATABASE_ERRORS.inc)
        log.error(
            "database unavailable", extra={"path": request.path, "error": str(error.orig)[:200]}
        )
        return problems.response(
            problems.of(
                Unavailable(
                    "the database is unavailable; retry with the same Idempotency-Key",
                    retry_after=1,
                )
            )
        )

    @app.errorhandler(Exception)
    def _on_unexpected(error: Exception) -> Response:
        log.exception("unexpected error", extra={"path": request.path})
        return problems.response(
            problems.problem(
                500,
                "internal",
                "Internal error",
                "an unexpected error occurred; it has been logged",
            )
        )
