"""`switchboard` command line: run the services, operate on their storage and schemas."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlparse

import click
import peewee
from prometheus_client import CollectorRegistry

from switchboard import migrations, operators, secret_checks
from switchboard.auth import check_secret, check_sendable, parse_tokens
from switchboard.database import Backend, DatabaseSettings, StartupRefused
from switchboard.observability import (
    ACCESS_LEVELS,
    AccessLevel,
    RpcMetrics,
    StateCollector,
    configure_logging,
    serve_metrics,
)
from switchboard.server import GrpcApp, ServerSettings, serve_until_signalled

DEFAULT_SESSION_LISTEN = "127.0.0.1:50051"
DEFAULT_DELIVERY_LISTEN = "127.0.0.1:50052"


def _backoff(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[float, ...]:
    try:
        steps = tuple(float(step) for step in value.split(",") if step.strip())
    except ValueError as exc:
        raise click.BadParameter("use comma-separated seconds, e.g. 30,120") from exc
    if not steps or any(step < 0 for step in steps):
        raise click.BadParameter("give at least one non-negative delay")
    return steps


def _from_environment_only(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    if value is not None and ctx.get_parameter_source(str(param.name)) == (
        click.core.ParameterSource.COMMANDLINE
    ):
        raise click.BadParameter(
            "give the key in SWITCHBOARD_PII_KEY or a file (--pii-key-file), never on the "
            "command line, where every user of the host can read it"
        )
    return value


def _real_database_password(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    """A database URL whose password is a placeholder (the manifest's `CHANGE-ME`) or a
    well-known default is refused before anything connects with it (click names the
    option and, when it came from there, the environment variable)."""
    if not value:
        return value
    parsed = urlparse(value)
    passwords = [parsed.password or "", *parse_qs(parsed.query).get("password", [])]
    for password in filter(None, passwords):
        problem = secret_checks.weakness(unquote(password))
        if problem is not None:
            raise click.BadParameter(
                f"the database password in this URL is not a secret: {problem}; "
                "set the database user's real password in the URL (percent-encoded)"
            )
    return value


class _Commands(click.Group):
    """The command group; a database that must not be served ends the command with
    its reason and exit code 1, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StartupRefused as refused:
            logging.getLogger("switchboard").error("refusing to start: %s", refused)
            raise click.ClickException(str(refused)) from refused


_ENVIRONMENT = """\b
Environment (each option's own variable is shown in its command's --help):
  SWITCHBOARD_TOKEN             bearer token of the operator commands and chat
  SWITCHBOARD_SESSION_ADDRESS   SessionService host:port the commands call
                                [127.0.0.1:50051]
  SWITCHBOARD_DELIVERY_ADDRESS  DeliveryService host:port the commands call
                                [127.0.0.1:50052]
  SWITCHBOARD_LOG_LEVEL, SWITCHBOARD_LOG_FORMAT   --log-level, --log-format
  SWITCHBOARD_DATA_DIR          where SQLite files live (serve, rebuild, db)
"""


def _log_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--log-level and --log-format, taken before the command (`switchboard
    --log-format text serve`) and by `serve` itself (`switchboard serve --log-format
    text`, which is what `python3 dev.py serve --log-format text` runs)."""
    command = click.option(
        "--log-format",
        default=None,
        envvar="SWITCHBOARD_LOG_FORMAT",
        type=click.Choice(["json", "text"]),
        help="json: one structured line per event; access lines carry method, status, "
        "duration, request id and principal; text: the same, for people [default: json].",
    )(command)
    return click.option(
        "--log-level",
        default=None,
        envvar="SWITCHBOARD_LOG_LEVEL",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        help="WARNING also silences the access lines of calls that ended OK [default: INFO].",
    )(command)


@click.group(cls=_Commands, epilog=_ENVIRONMENT)
@click.version_option(package_name="switchboard", prog_name="switchboard")
@_log_options
@click.pass_context
def main(ctx: click.Context, log_level: str | None, log_format: str | None) -> None:
    """Switchboard: session and delivery backbone for AI-agent gateways."""
    ctx.obj = {
        "log_level": log_level or "INFO",
        "log_format": log_format or "json",
        "log_chosen": log_level is not None or log_format is not None,
    }
    configure_logging(ctx.obj["log_level"], json_format=ctx.obj["log_format"] == "json")


def _relog(ctx: click.Context, log_level: str | None, log_format: str | None) -> None:
    """A command's own --log-level/--log-format win over the group's."""
    if log_level is None and log_format is None:
        return
    chosen = ctx.find_object(dict) or {}
    level = log_level or chosen.get("log_level", "INFO")
    shape = log_format or chosen.get("log_format", "json")
    configure_logging(level, json_format=shape == "json")


@main.command()
@click.argument(
    "which", type=click.Choice(["all", "session", "delivery"]), default="all", required=False
)
@click.option(
    "--data-dir",
    default="var",
    envvar="SWITCHBOARD_DATA_DIR",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where SQLite files live when no database URL is given.",
)
@click.option(
    "--session-listen",
    default=DEFAULT_SESSION_LISTEN,
    envvar="SWITCHBOARD_SESSION_LISTEN",
    show_default=True,
    help="host:port for the SessionService (port 0 picks a free one).",
)
@click.option(
    "--session-database-url",
    default=None,
    envvar="SWITCHBOARD_SESSION_DATABASE_URL",
    help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB "
    "[default: sqlite:///DATA_DIR/session.sqlite3]",
    callback=_real_database_password,
)
@click.option(
    "--snapshot-every",
    default=100,
    envvar="SWITCHBOARD_SNAPSHOT_EVERY",
    show_default=True,
    help="Snapshot a session or agent after this many of its events.",
)
@click.option(
    "--delivery-listen",
    default=DEFAULT_DELIVERY_LISTEN,
    envvar="SWITCHBOARD_DELIVERY_LISTEN",
    show_default=True,
    help="host:port for the DeliveryService (port 0 picks a free one).",
)
@click.option(
    "--delivery-database-url",
    default=None,
    envvar="SWITCHBOARD_DELIVERY_DATABASE_URL",
    help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB "
    "[default: sqlite:///DATA_DIR/delivery.sqlite3]",
    callback=_real_database_password,
)
@click.option(
    "--sqlite-synchronous",
    default="FULL",
    envvar="SWITCHBOARD_SQLITE_SYNCHRONOUS",
    show_default=True,
    type=click.Choice(["FULL", "NORMAL"]),
    help="FULL survives power loss; NORMAL (WAL) only process crashes.",
)
@click.option(
    "--sqlite-integrity-check",
    default="quick",
    envvar="SWITCHBOARD_SQLITE_INTEGRITY_CHECK",
    show_default=True,
    type=click.Choice(["quick", "full", "off"]),
    help="Check SQLite files at start and refuse damaged ones: quick (PRAGMA quick_check, "
    "about 1 s per GB), full (integrity_check, also every index; about 5 times slower) "
    "or off.",
)
@click.option(
    "--on-settings-mismatch",
    default="refuse",
    envvar="SWITCHBOARD_ON_SETTINGS_MISMATCH",
    show_default=True,
    type=click.Choice(["refuse", "adopt", "overwrite"]),
    help="Replicas on one database must share --max-attempts, --stale-after, --retention, "
    "--lease-ttl and --backoff (DeliveryService), --request-id-window (both) and the PII "
    "key (SessionService; only a digest naming it is stored); the first to start stores "
    "them there. When this replica's differ (each difference is logged): refuse to start, "
    "adopt the stored values (never a key: a replica cannot adopt a secret it lacks), or "
    "overwrite them with this replica's (replicas already running keep theirs until "
    "restarted).",
)
@click.option("--db-pool-size", default=10, envvar="SWITCHBOARD_DB_POOL_SIZE", show_default=True)
@click.option(
    "--db-writer-threads",
    default=4,
    envvar="SWITCHBOARD_DB_WRITER_THREADS",
    show_default=True,
    help="Postgres writer threads (SQLite always has one writer).",
)
@click.option(
    "--db-lock-timeout",
    default=5.0,
    type=click.FloatRange(min=0.001),
    envvar="SWITCHBOARD_DB_LOCK_TIMEOUT_S",
    show_default=True,
    help="Seconds a statement waits for a lock another database connection holds (a "
    "LOCK TABLE, a migration, another process writing the SQLite file) before its call "
    "answers UNAVAILABLE; a call's deadline shortens the wait. Postgres' lock_timeout, set "
    "per transaction; SQLite's busy timeout.",
)
@click.option("--max-attempts", default=3, envvar="SWITCHBOARD_MAX_ATTEMPTS", show_default=True)
@click.option(
    "--stale-after",
    default=86400.0,
    envvar="SWITCHBOARD_STALE_AFTER_S",
    show_default=True,
    help="Seconds after recording when an undelivered reply is abandoned.",
)
@click.option(
    "--retention",
    default=604800.0,
    envvar="SWITCHBOARD_RETENTION_S",
    show_default=True,
    help="Seconds terminal rows are kept before pruning.",
)
@click.option(
    "--lease-ttl",
    default=30.0,
    envvar="SWITCHBOARD_LEASE_TTL_S",
    show_default=True,
    help="Default gateway lease in seconds.",
)
@click.option(
    "--backoff",
    default="30,120",
    envvar="SWITCHBOARD_BACKOFF_S",
    show_default=True,
    callback=_backoff,
    help="Retry delays in seconds by attempts spent; the last repeats.",
)
@click.option(
    "--max-content-bytes",
    default=256 * 1024,
    type=click.IntRange(min=1),
    envvar="SWITCHBOARD_MAX_CONTENT_BYTES",
    show_default=True,
    help="Longest message content accepted, in UTF-8 bytes: a session message (and its "
    "tool call arguments) and an owed reply (both services).",
)
@click.option(
    "--max-state-value-bytes",
    default=256 * 1024,
    type=click.IntRange(min=1),
    envvar="SWITCHBOARD_MAX_STATE_VALUE_BYTES",
    show_default=True,
    help="Largest scoped state value (StateDelta), in UTF-8 bytes; an owner's entries "
    "together stay below 1 MiB or this, whichever is higher.",
)
@click.option(
    "--max-record-bytes",
    default=1024 * 1024,
    type=click.IntRange(min=1),
    envvar="SWITCHBOARD_MAX_RECORD_BYTES",
    show_default=True,
    help="Largest stored record payload (PutRecords). Raising it past a few MiB needs "
    "clients whose receive limit reads such records back (GetRecord answers one whole).",
)
@click.option(
    "--max-records-call-bytes",
    default=8 * 1024 * 1024,
    type=click.IntRange(min=1),
    envvar="SWITCHBOARD_MAX_RECORDS_CALL_BYTES",
    show_default=True,
    help="Most payload bytes one PutRecords call stores (one log row); keep it below "
    "--max-message-bytes.",
)
@click.option(
    "--request-id-window",
    default=86400.0,
    type=click.FloatRange(min=0, min_open=True),
    envvar="SWITCHBOARD_REQUEST_ID_WINDOW_S",
    show_default=True,
    help="Seconds a call's request id and answer are kept, so that a retry with the "
    "same id is answered without running again (both services). Shared by the replicas "
    "of a database: see --on-settings-mismatch.",
)
@click.option(
    "--max-concurrent-rpcs",
    default=None,
    type=click.IntRange(min=1),
    envvar="SWITCHBOARD_MAX_CONCURRENT_RPCS",
    help="Beyond this many unary calls at once, answer RESOURCE_EXHAUSTED before reading "
    "the request; watchers' streams (see --max-watchers) and health checks are not "
    "counted [default: no limit].",
)
@click.option(
    "--max-watchers",
    default=4000,
    type=click.IntRange(min=1),
    envvar="SWITCHBOARD_MAX_WATCHERS",
    show_default=True,
    help="WatchEvents streams held at once by the SessionService; more are answered "
    "RESOURCE_EXHAUSTED (TOO_MANY_WATCHERS). Not counted in --max-concurrent-rpcs.",
)
@click.option(
    "--max-connections",
    default=1000,
    type=click.IntRange(min=0),
    envvar="SWITCHBOARD_MAX_CONNECTIONS",
    show_default=True,
    help="Connections held at once per service port; more are closed as accepted (0: no limit).",
)
@click.option(
    "--max-streams-per-connection",
    default=1000,
    type=click.IntRange(min=0),
    envvar="SWITCHBOARD_MAX_STREAMS_PER_CONNECTION",
    show_default=True,
    help="Calls open at once on one HTTP/2 connection; a client queues the ones beyond "
    "(0: no limit).",
)
@click.option(
    "--http2-window-bytes",
    default=64 * 1024,
    type=click.IntRange(min=0),
    envvar="SWITCHBOARD_HTTP2_WINDOW_BYTES",
    show_default=True,
    help="HTTP/2 flow-control window per stream and connection: what a client may send "
    "before the server reads (0: gRPC's default, bandwidth probing up to 4 MiB).",
)
@click.option(
    "--max-message-bytes",
    default=16 * 1024 * 1024,
    type=click.IntRange(min=1024),
    envvar="SWITCHBOARD_MAX_MESSAGE_BYTES",
    show_default=True,
    help="Largest request (and answer) gRPC accepts, for every method; bigger requests "
    "are RESOURCE_EXHAUSTED, smaller ones over a field's limit INVALID_ARGUMENT naming it.",
)
@click.option(
    "--drain-grace",
    default=10.0,
    envvar="SWITCHBOARD_DRAIN_GRACE_S",
    show_default=True,
    help="Seconds in-flight calls get after SIGTERM.",
)
@click.option(
    "--metrics-listen",
    default="",
    envvar="SWITCHBOARD_METRICS_LISTEN",
    help="host:port for the Prometheus endpoint (off when empty).",
)
@click.option(
    "--access-log",
    default="all",
    envvar="SWITCHBOARD_ACCESS_LOG",
    show_default=True,
    type=click.Choice(list(ACCESS_LEVELS)),
    help="One log line per call (method, status, duration, request id, principal): for "
    "every call, only for calls that did not end OK, or none. Independent of "
    "--metrics-listen; health checks are logged only when they fail.",
)
@_log_options
@click.option(
    "--auth-tokens",
    default="",
    envvar="SWITCHBOARD_AUTH_TOKENS",
    help="TOKEN=admin;TOKEN=agents:a,b (authentication is off when empty).",
)
@click.option(
    "--pii-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="SWITCHBOARD_PII_KEY_FILE",
    help="File holding the secret (at least 16 bytes; a trailing newline is ignored) that "
    "hashes user and chat ids of agents with settings.redact_pii (HMAC-SHA256); or set "
    "SWITCHBOARD_PII_KEY to the key itself. Without one the ids are hashed unkeyed, which "
    "brute force reverses. Setting or changing it starts fresh sessions for conversations "
    "routed before. The DeliveryService with a key stores session keys hashed and takes "
    "reply targets only sealed (every gateway then needs a reply key). Replicas of one "
    "database must share it: the first start with a new one needs "
    "--on-settings-mismatch overwrite.",
)
@click.option(
    "--pii-key",
    hidden=True,
    envvar="SWITCHBOARD_PII_KEY",
    callback=_from_environment_only,
    help="(SWITCHBOARD_PII_KEY only: a key on the command line is visible to every user)",
)
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="SWITCHBOARD_TLS_CERT",
    help="PEM certificate: serve TLS.",
)
@click.option(
    "--tls-key",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="SWITCHBOARD_TLS_KEY",
    help="PEM private key of --tls-cert.",
)
@click.option(
    "--tls-client-ca",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="SWITCHBOARD_TLS_CLIENT_CA",
    help="PEM CA: require client certificates it signed (mTLS).",
)
@click.option(
    "--no-migrate",
    is_flag=True,
    envvar="SWITCHBOARD_NO_MIGRATE",
    help="Do not migrate the schema at start: refuse to start when it is behind "
    "(then run `switchboard db migrate`).",
)
@click.option(
    "--console-listen",
    default="",
    envvar="SWITCHBOARD_CONSOLE_LISTEN",
    help="host:port for the operator console beside the services (`serve all` only; "
    "off when empty). See `switchboard console`.",
)
@click.option(
    "--console-read-only",
    is_flag=True,
    envvar="SWITCHBOARD_CONSOLE_READ_ONLY",
    help="The console of --console-listen refuses every write.",
)
def serve(
    which: str,
    data_dir: Path,
    session_listen: str,
    session_database_url: str | None,
    snapshot_every: int,
    delivery_listen: str,
    delivery_database_url: str | None,
    sqlite_synchronous: str,
    sqlite_integrity_check: str,
    on_settings_mismatch: str,
    db_pool_size: int,
    db_writer_threads: int,
    db_lock_timeout: float,
    max_attempts: int,
    stale_after: float,
    retention: float,
    lease_ttl: float,
    backoff: tuple[float, ...],
    max_content_bytes: int,
    max_state_value_bytes: int,
    max_record_bytes: int,
    max_records_call_bytes: int,
    request_id_window: float,
    max_concurrent_rpcs: int | None,
    max_watchers: int,
    max_connections: int,
    max_streams_per_connection: int,
    http2_window_bytes: int,
    max_message_bytes: int,
    drain_grace: float,
    metrics_listen: str,
    access_log: AccessLevel,
    log_level: str | None,
    log_format: str | None,
    auth_tokens: str,
    pii_key_file: Path | None,
    pii_key: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    no_migrate: bool,
    console_listen: str,
    console_read_only: bool,
) -> None:
    """Run the services until SIGTERM or Ctrl-C (then drain and exit 0)."""
    if console_listen and which != "all":
        raise click.UsageError("--console-listen needs both services: `serve all`")
    _relog(click.get_current_context(), log_level, log_format)
    from delivery_service.app import DeliveryUnit
    from delivery_service.state_machine import LedgerLimits
    from session_service import pii
    from session_service.app import SessionUnit
    from session_service.core import SessionLimits

    def database(url: str | None, file_name: str) -> DatabaseSettings:
        return DatabaseSettings(
            url=url or f"sqlite:///{(data_dir / file_name).resolve()}",
            sqlite_synchronous=sqlite_synchronous,  # type: ignore[arg-type]
            pool_size=db_pool_size,
            writer_threads=db_writer_threads,
            busy_timeout_ms=max(1, round(db_lock_timeout * 1000)),
            sqlite_integrity_check=sqlite_integrity_check,  # type: ignore[arg-type]
            on_settings_mismatch=on_settings_mismatch,  # type: ignore[arg-type]
        )

    try:
        grants = parse_tokens(auth_tokens)
        check_sendable(grants)
        check_secret(grants)
    except ValueError as exc:
        raise click.BadParameter(
            str(exc), param_hint="--auth-tokens / SWITCHBOARD_AUTH_TOKENS"
        ) from exc
    try:
        key = pii.read_key(pii_key_file, pii_key)
    except pii.PiiKeyRefused as exc:
        raise click.BadParameter(
            str(exc), param_hint="--pii-key-file / SWITCHBOARD_PII_KEY"
        ) from exc
    if (tls_cert is None) != (tls_key is None) or (tls_client_ca and not tls_cert):
        raise click.UsageError("TLS needs --tls-cert and --tls-key (and then --tls-client-ca)")
    registry = CollectorRegistry()
    metrics = RpcMetrics(registry) if metrics_listen else None

    def server(listen: str) -> ServerSettings:
        return ServerSettings(
            listen=listen,
            max_concurrent_rpcs=max_concurrent_rpcs,
            max_connections=max_connections or None,
            max_streams_per_connection=max_streams_per_connection or None,
            http2_window_bytes=http2_window_bytes or None,
            max_message_bytes=max_message_bytes,
            drain_grace_s=drain_grace,
            auth=grants,
            metrics=metrics,
            access_log=access_log,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
        )

    apps: list[GrpcApp] = []
    urls: dict[int, str] = {}
    migrate = not no_migrate
    try:
        if which in ("all", "session"):
            settings = database(session_database_url, "session.sqlite3")
            limits = SessionLimits(
                snapshot_every=snapshot_every,
                request_id_window_s=request_id_window,
                max_watchers=max_watchers,
                max_content_bytes=max_content_bytes,
                max_state_value_bytes=max_state_value_bytes,
                max_record_bytes=max_record_bytes,
                max_records_call_bytes=max_records_call_bytes,
            )
            apps.append(
                GrpcApp(
                    SessionUnit(settings, limits, migrate=migrate, pii_key=key),
                    server(session_listen),
                )
            )
            urls[id(apps[-1])] = _redacted(settings.url)
        if which in ("all", "delivery"):
            settings = database(delivery_database_url, "delivery.sqlite3")
            ledger_limits = LedgerLimits(
                max_attempts=max_attempts,
                stale_after_s=stale_after,
                retention_s=retention,
                lease_ttl_s=lease_ttl,
                backoff_s=backoff,
                max_content_bytes=max_content_bytes,
                request_id_window_s=request_id_window,
            )
            unit = DeliveryUnit(settings, ledger_limits, migrate=migrate, pii_key=key)
            apps.append(GrpcApp(unit, server(delivery_listen)))
            urls[id(apps[-1])] = _redacted(settings.url)
    except migrations.SchemaError as refused:
        for app in apps:
            app.unit.close()
        raise click.ClickException(str(refused)) from refused

    if metrics_listen:
        for app in apps:
            registry.register(StateCollector(app.unit.gauges))
        metrics_port = serve_metrics(registry, metrics_listen)
        click.echo(f"switchboard: metrics on {metrics_listen.rpartition(':')[0]}:{metrics_port}")

    def announce(started: Sequence[GrpcApp]) -> None:
        for app in started:
            name = app.unit.service_name.rsplit(".", 1)[-1]
            click.echo(f"switchboard: {name} listening on {app.address} ({urls[id(app)]})")
        click.echo("switchboard: ready; Ctrl-C or SIGTERM drains and stops")

    if not console_listen:
        asyncio.run(serve_until_signalled(apps, announce))
        return
    from switchboard_console.server import serve_with_console

    asyncio.run(
        serve_with_console(
            apps,
            announce,
            console_listen,
            console_read_only,
            lambda url: click.echo(f"switchboard: console on {url}"),
        )
    )


@main.command()
@click.option(
    "--session",
    "session_address",
    default=DEFAULT_SESSION_LISTEN,
    envvar="SWITCHBOARD_SESSION_ADDRESS",
    show_default=True,
    help="The SessionService's host:port.",
)
@click.option(
    "--delivery",
    "delivery_address",
    default=DEFAULT_DELIVERY_LISTEN,
    envvar="SWITCHBOARD_DELIVERY_ADDRESS",
    show_default=True,
    help="The DeliveryService's host:port.",
)
@click.option(
    "--listen",
    default="127.0.0.1:8233",
    envvar="SWITCHBOARD_CONSOLE_LISTEN",
    show_default=True,
    help="host:port the console serves on (loopback unless told otherwise).",
)
@click.option(
    "--read-only",
    is_flag=True,
    envvar="SWITCHBOARD_CONSOLE_READ_ONLY",
    help="Refuse every write (rewinds, checkouts, delivery actions).",
)
def console(session_address: str, delivery_address: str, listen: str, read_only: bool) -> None:
    """Serve the operator console: a web UI over the two services, as one more client.

    It asks each operator for a token and calls the services with it."""
    from switchboard_console.server import run, split_listen
    from switchboard_console.web import ConsoleSettings

    try:
        split_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from exc
    settings = ConsoleSettings(session_address, delivery_address, listen, read_only)
    run(settings, lambda url: click.echo(f"switchboard: console on {url}", err=False))


@main.group()
def session() -> None:
    """Operate on the SessionService's storage."""


@session.command()
@click.option(
    "--database-url",
    envvar="SWITCHBOARD_SESSION_DATABASE_URL",
    default=None,
    help="[default: sqlite:///DATA_DIR/session.sqlite3]",
    callback=_real_database_password,
)
@click.option(
    "--data-dir",
    default="var",
    envvar="SWITCHBOARD_DATA_DIR",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
)
def rebuild(database_url: str | None, data_dir: Path) -> None:
    """Replay the whole log into fresh projections and report what differed."""
    from rich.progress import Progress

    from session_service import recovery
    from session_service.core import Core, SessionLimits
    from session_service.log_store import LogStore
    from session_service.migrations import SESSION_SCHEMA
    from switchboard.database import open_backend
    from switchboard.runner import TransactionRunner

    settings = DatabaseSettings(
        url=database_url or f"sqlite:///{(data_dir / 'session.sqlite3').resolve()}"
    )
    _refuse_missing_sqlite(settings.url, "--database-url or --data-dir")
    backend = open_backend(settings)
    try:
        migrations.prepare(backend, SESSION_SCHEMA)
    except migrations.SchemaError as refused:
        raise click.ClickException(str(refused)) from refused
    store = LogStore(backend)
    runner = TransactionRunner(backend, settings, begin_write=store.lock_log)
    try:
        with Progress() as bar:
            task = bar.add_task("replaying the log", total=None)
            report = recovery.rebuild(
                Core(runner, store, SessionLimits()),
                lambda done, total: bar.update(task, completed=done, total=total),
            )
    finally:
        runner.close()
    click.echo(f"replayed {report.events} events")
    for name, count in report.differences.items():
        click.echo(f"  {name}: {count} row(s) differed" if count else f"  {name}: identical")
    if report.differed:
        click.echo("projections were repaired from the log")


@session.command("key-report")
@click.option(
    "--database-url",
    envvar="SWITCHBOARD_SESSION_DATABASE_URL",
    default=None,
    help="[default: sqlite:///DATA_DIR/session.sqlite3]",
)
@click.option(
    "--data-dir",
    default="var",
    envvar="SWITCHBOARD_DATA_DIR",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session.")
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also the ambiguous sessions: another source could have made their old key, "
    "but nothing in their history says one did.",
)
def key_report(database_url: str | None, data_dir: Path, as_json: bool, show_all: bool) -> None:
    """The sessions two conversations may have shared under one old routing key, as
    the upgrade to injective keys found them, with the evidence (reads the database)."""
    import dataclasses
    import json

    from session_service import key_migration
    from session_service.log_store import LogStore
    from session_service.migrations import SESSION_SCHEMA, injective_routing_keys

    url = database_url or f"sqlite:///{(data_dir / 'session.sqlite3').resolve()}"
    _refuse_missing_sqlite(url, "--database-url or --data-dir", "nothing to report")
    with _schema_backend(url) as backend:
        version = migrations.status(backend, SESSION_SCHEMA).database_version
        upgrade = SESSION_SCHEMA.migrations.index(injective_routing_keys) + 1
        if version < upgrade:
            raise click.ClickException(
                f"the session schema is at version {version}: routing keys are upgraded "
                f"(and the report written) by migration {upgrade}; run `switchboard db "
                "migrate session` or start the service first"
            )
        found = key_migration.reported(LogStore(backend))
    shown = [f for f in found if show_all or f.finding != key_migration.AMBIGUOUS]
    if as_json:
        for row in shown:
            click.echo(json.dumps(dataclasses.asdict(row), sort_keys=True))
        return
    if not found:
        click.echo("the upgrade to injective routing keys reported no session")
        return
    click.echo(key_migration.summary_line(key_migration.counts(found)))
    if len(shown) < len(found):
        click.echo(f"({len(found) - len(shown)} ambiguous session(s) not shown: --all lists them)")
    operators._table(  # the operators' table look, for a command that reads the database
        "sessions reported by the routing-key upgrade",
        ["finding", "agent", "session", "status", "old key", "new key", "evidence"],
        [
            [f.finding, f.agent, f.session_id, f.status, f.old_key, f.new_key, f.evidence]
            for f in shown
        ],
    )


def _refuse_missing_sqlite(url: str, options: str, nothing: str = "nothing to rebuild") -> None:
    """A command that reads a database must not create an empty one where none was
    (e.g. run from another directory than `serve`, whose --data-dir is relative)."""
    if not url.startswith("sqlite:///"):
        return
    path = Path(url.removeprefix("sqlite:///").split("?", 1)[0])
    if not path.exists():
        raise click.ClickException(
            f"no database file at {path}: {nothing}. Name the database with "
            f"{options} (a relative --data-dir is taken from the current directory, "
            f"{Path.cwd()})"
        )


def _redacted(url: str) -> str:
    """The database URL without its password, for printing."""
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        scheme, rest = url.split("//", 1)
        credentials, host = rest.split("@", 1)
        return f"{scheme}//{credentials.split(':', 1)[0]}:***@{host}"
    return url


operators.register(session, main)


# -- the schema ------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Inspect and migrate the services' database schemas."""


def _schema_options(command: Callable[..., None]) -> Callable[..., None]:
    """The database options of `serve`, for the schema commands."""
    for option in reversed(
        [
            click.argument(
                "which",
                type=click.Choice(["all", "session", "delivery"]),
                default="all",
                required=False,
            ),
            click.option(
                "--data-dir",
                default="var",
                envvar="SWITCHBOARD_DATA_DIR",
                show_default=True,
                type=click.Path(file_okay=False, path_type=Path),
                help="Where SQLite files live when no database URL is given.",
            ),
            click.option(
                "--session-database-url",
                default=None,
                envvar="SWITCHBOARD_SESSION_DATABASE_URL",
                help="[default: sqlite:///DATA_DIR/session.sqlite3]",
                callback=_real_database_password,
            ),
            click.option(
                "--delivery-database-url",
                default=None,
                envvar="SWITCHBOARD_DELIVERY_DATABASE_URL",
                help="[default: sqlite:///DATA_DIR/delivery.sqlite3]",
                callback=_real_database_password,
            ),
        ]
    ):
        command = option(command)
    return command


def _schemas(
    which: str, data_dir: Path, session_url: str | None, delivery_url: str | None
) -> list[tuple[migrations.Component, str]]:
    from delivery_service.migrations import DELIVERY_SCHEMA
    from session_service.migrations import SESSION_SCHEMA

    chosen = []
    if which in ("all", "session"):
        url = session_url or f"sqlite:///{(data_dir / 'session.sqlite3').resolve()}"
        chosen.append((SESSION_SCHEMA, url))
    if which in ("all", "delivery"):
        url = delivery_url or f"sqlite:///{(data_dir / 'delivery.sqlite3').resolve()}"
        chosen.append((DELIVERY_SCHEMA, url))
    return chosen


@contextmanager
def _schema_backend(url: str) -> Iterator[Backend]:
    """The database of one component for `db status|migrate`, closed after; a refused
    schema or an unreachable database ends the command with one line, no traceback."""
    from switchboard.database import open_backend

    backend = open_backend(DatabaseSettings(url=url))
    try:
        yield backend
    except migrations.SchemaError as refused:
        raise click.ClickException(str(refused)) from refused
    except peewee.OperationalError as unreachable:
        raise click.ClickException(f"{_redacted(url)}: {unreachable}") from unreachable
    finally:
        backend.database.close()


@db.command(name="status")
@_schema_options
def status_command(
    which: str, data_dir: Path, session_database_url: str | None, delivery_database_url: str | None
) -> None:
    """Per component: the database's schema version, this code's, and what is pending."""
    from datetime import UTC, datetime

    for component, url in _schemas(which, data_dir, session_database_url, delivery_database_url):
        path = Path(url.removeprefix("sqlite:///"))
        if url.startswith("sqlite:///") and not path.exists():  # reading must not create it
            click.echo(f"{component.name}: no database file at {path} (`db migrate` creates it)")
            continue
        with _schema_backend(url) as backend:
            found = migrations.status(backend, component)
        verdict = (
            "up to date"
            if found.database_version == found.code_version
            else f"{len(found.pending)} pending"
            if found.database_version < found.code_version
            else "NEWER than this code: run the release that migrated it"
        )
        click.echo(f"{component.name} ({_redacted(url)}): {verdict}")
        unversioned = " (tables of a release before versioning: adopted on migrate)"
        click.echo(
            f"  database version: {found.database_version}"
            + (unversioned if found.unversioned else "")
        )
        click.echo(f"  code version:     {found.code_version}")
        for row in found.history:
            when = datetime.fromtimestamp(row.applied_at, UTC).isoformat(timespec="seconds")
            click.echo(f"  {row.action} {row.version} {row.name} at {when} by {row.applied_by}")
        for title in found.pending:
            click.echo(f"  pending {title}")


@db.command(name="migrate")
@_schema_options
def migrate_command(
    which: str, data_dir: Path, session_database_url: str | None, delivery_database_url: str | None
) -> None:
    """Apply the pending migrations (what `serve` does at start unless --no-migrate)."""
    for component, url in _schemas(which, data_dir, session_database_url, delivery_database_url):
        with _schema_backend(url) as backend:
            report = migrations.migrate(backend, component)
        if not report.applied:
            click.echo(f"{component.name}: already at version {report.to_version}")
            continue
        how = " (adopted a database from before versioning)" if report.adopted else ""
        click.echo(
            f"{component.name}: migrated from version {report.from_version} "
            f"to {report.to_version}{how}"
        )
        for title in report.applied:
            click.echo(f"  applied {title}")


def _echo_agent(turn: Any) -> str:
    """A stand-in agent for trying the plumbing: it says what it got."""
    text = turn.state.state.inbox[-1].message.content if turn.state.state.inbox else ""
    return f"(echo) {text} [{len(turn.history)} earlier messages in this conversation]"


@main.command()
@click.option("--agent", required=True, help="The agent to talk to (created if missing).")
@click.option(
    "--session-address",
    default=DEFAULT_SESSION_LISTEN,
    envvar="SWITCHBOARD_SESSION_ADDRESS",
    show_default=True,
)
@click.option(
    "--delivery-address",
    default=DEFAULT_DELIVERY_LISTEN,
    envvar="SWITCHBOARD_DELIVERY_ADDRESS",
    show_default=True,
)
@click.option(
    "--token",
    default=None,
    envvar="SWITCHBOARD_TOKEN",
    callback=operators.no_placeholder_token,
    help="Bearer token for both services (when they run with --auth-tokens): admin, or "
    "one whose agents include --agent (it cannot create a missing agent).",
)
@click.option("--conversation", default="default", show_default=True, help="REPL conversation id.")
@click.option(
    "--callback",
    default="",
    help="module:function taking a switchboard_client.gateway.Turn and returning the reply, "
    "imported from the current directory first [default: an echo agent]",
)
def chat(
    agent: str,
    session_address: str,
    delivery_address: str,
    token: str | None,
    conversation: str,
    callback: str,
) -> None:
    """Talk to an agent from the terminal ("/help" lists the commands)."""
    from switchboard_client import SwitchboardError

    chosen = click.get_current_context().find_object(dict) or {}
    if not chosen.get("log_chosen"):
        # A person's terminal: the client's warnings as short text lines, no INFO.
        configure_logging("WARNING", json_format=False)
    reply = _callback(callback) if callback else _echo_agent
    try:
        _chat(agent, session_address, delivery_address, token, conversation, reply)
    except SwitchboardError as error:
        shown = _chat_failure(error, session_address, delivery_address)
        raise click.ClickException(shown) from None


def _callback(spec: str) -> Callable[[Any], str]:
    """`module:function`, imported as `python -m` would: the current directory first."""
    import importlib
    import os
    import sys

    module, _, function = spec.partition(":")
    if not module or not function:
        raise click.BadParameter("use module:function, e.g. mybot:reply", param_hint="--callback")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"{spec}: {exc}", param_hint="--callback") from exc
    if not callable(found):
        raise click.BadParameter(f"{spec} is not callable", param_hint="--callback")
    return cast(Callable[[Any], str], found)


def _chat(
    agent: str,
    session_address: str,
    delivery_address: str,
    token: str | None,
    conversation: str,
    reply: Callable[[Any], str],
) -> None:
    import sys

    from switchboard_client import DeliveryClient, SessionClient, SwitchboardError
    from switchboard_client.gateway import Gateway
    from switchboard_client.transports import ReplPlatform, run_repl

    with (
        SessionClient(session_address, token=token) as sessions,
        DeliveryClient(delivery_address, token=token) as ledger,
    ):
        try:
            sessions.get_agent(agent)
        except SwitchboardError as missing:
            if missing.code.name != "NOT_FOUND":
                raise
            _create_agent(sessions, agent)
        gateway = Gateway("repl", agent, sessions, ledger, [ReplPlatform(sys.stdout)], reply)
        gateway.start()
        interactive = sys.stdin.isatty()
        click.echo(
            f"switchboard chat: agent {agent!r}, conversation {conversation!r} "
            f"(sessions {session_address}, delivery {delivery_address})"
        )
        click.echo('type a message; "/help" lists the commands, "/quit" or Ctrl-D leaves')

        def failed(error: Exception) -> None:
            if isinstance(error, SwitchboardError):
                shown = _chat_failure(error, session_address, delivery_address)
            else:
                shown = f"the agent's callback failed: {type(error).__name__}: {error}"
            click.echo(f"error: {shown}", err=True)

        try:
            run_repl(
                gateway,
                sys.stdin,
                conversation,
                out=sys.stdout,
                interactive=interactive,
                on_error=failed,
            )
        except KeyboardInterrupt:
            click.echo()
        finally:
            gateway.stop()


def _create_agent(sessions: Any, agent: str) -> None:
    from switchboard_client import SwitchboardError

    try:
        sessions.create_agent(agent)
    except SwitchboardError as refused:
        if refused.code.name != "PERMISSION_DENIED":
            raise
        raise click.ClickException(
            f"agent {agent!r} does not exist and this token may not create it "
            "(PERMISSION_DENIED): create it with an admin token, e.g. "
            f"`switchboard chat --agent {agent} --token ADMIN_TOKEN` once"
        ) from None


def _chat_failure(error: Any, session_address: str, delivery_address: str) -> str:
    """One line saying what went wrong and what to do, for a person."""
    code = error.code.name
    if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return (
            f"cannot reach the services at {session_address} and {delivery_address} "
            f"({code}); start them with `switchboard serve` (or `python3 dev.py serve`), "
            "or pass --session-address/--delivery-address"
        )
    if code == "UNAUTHENTICATED":
        return (
            "the services refused the token (UNAUTHENTICATED); pass --token or set "
            "SWITCHBOARD_TOKEN to one of the server's --auth-tokens"
        )
    if code == "PERMISSION_DENIED":
        return f"this token may not do that (PERMISSION_DENIED): {error.message}"
    return f"{code}: {error.message}"


@main.command()
@click.option(
    "--platform",
    type=click.Choice(["loopback"]),
    default="loopback",
    show_default=True,
    help="The chat platform. loopback: a stand-in whose inbound messages are POSTed to "
    "--listen and whose sends are answered back (POST /messages, GET /healthz).",
)
@click.option("--agent", required=True, help="The agent every turn runs as.")
@click.option(
    "--create-agent", is_flag=True, help="Create --agent when it does not exist (an admin token)."
)
@click.option(
    "--name",
    default="loopback-gateway",
    show_default=True,
    help="The gateway's (bot account's) name: its instances take over each other's replies.",
)
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    envvar="SWITCHBOARD_GATEWAY_LISTEN",
    show_default=True,
    help="host:port of the platform's HTTP door.",
)
@click.option(
    "--session-address",
    default=DEFAULT_SESSION_LISTEN,
    envvar="SWITCHBOARD_SESSION_ADDRESS",
    show_default=True,
)
@click.option(
    "--delivery-address",
    default=DEFAULT_DELIVERY_LISTEN,
    envvar="SWITCHBOARD_DELIVERY_ADDRESS",
    show_default=True,
)
@click.option(
    "--token",
    default=None,
    envvar="SWITCHBOARD_TOKEN",
    help="Bearer token for both services (when they run with --auth-tokens).",
)
@click.option(
    "--callback",
    default="",
    help="module:function taking a switchboard_client.gateway.Turn and returning the reply "
    "[default: an echo agent]",
)
def gateway(
    platform: str,
    agent: str,
    create_agent: bool,
    name: str,
    listen: str,
    session_address: str,
    delivery_address: str,
    token: str | None,
    callback: str,
) -> None:
    """Run the reference gateway until SIGTERM or Ctrl-C."""
    from switchboard_client import SwitchboardError

    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter("use host:port, e.g. 127.0.0.1:8080", param_hint="--listen")
    reply = _callback(callback) if callback else _echo_agent
    addresses = (session_address, delivery_address)
    try:
        _gateway(platform, agent, create_agent, name, (host, int(port)), addresses, token, reply)
    except SwitchboardError as error:
        raise click.ClickException(_chat_failure(error, *addresses)) from None
    except OSError as error:  # the door's address: in use, or not this host's
        raise click.ClickException(f"cannot listen on {listen}: {error.strerror}") from None


def _gateway(
    platform: str,
    agent: str,
    create_agent: bool,
    name: str,
    listen: tuple[str, int],
    addresses: tuple[str, str],
    token: str | None,
    reply: Callable[[Any], str],
) -> None:
    import signal
    import threading

    from switchboard_client import DeliveryClient, SessionClient, SwitchboardError
    from switchboard_client.gateway import Gateway
    from switchboard_client.loopback import LoopbackPlatform
    from switchboard_client.loopback_http import LoopbackDoor

    with (
        SessionClient(addresses[0], token=token) as sessions,
        DeliveryClient(addresses[1], token=token) as ledger,
    ):
        try:
            sessions.get_agent(agent)
        except SwitchboardError as missing:
            if missing.code.name != "NOT_FOUND":
                raise
            if not create_agent:
                raise click.ClickException(
                    f"agent {agent!r} does not exist: pass --create-agent to create it"
                ) from None
            _create_agent(sessions, agent)
        adapter = LoopbackPlatform(name=platform)
        running = Gateway(name, agent, sessions, ledger, [adapter], reply)
        running.start()
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        try:
            with LoopbackDoor(listen, running, adapter.name) as door:
                threading.Thread(target=door.serve_forever, daemon=True).start()
                click.echo(
                    f"switchboard gateway: {name} on the {platform} platform, agent {agent!r}, "
                    f"listening on http://{listen[0]}:{door.server_port}; ready",
                )
                stop.wait()
                door.shutdown()
        finally:
            running.stop()


def _show_environment(group: click.Group) -> None:
    """Every option's environment variable in its command's --help."""
    for command in [group, *group.commands.values()]:
        for param in command.params:
            if isinstance(param, click.Option) and param.envvar and not param.hidden:
                param.show_envvar = True
        if isinstance(command, click.Group) and command is not group:
            _show_environment(command)


_show_environment(main)
