"""`switchboard serve`: settings, then the services' units, then their servers."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import click
from prometheus_client import CollectorRegistry

from delivery_service.app import DeliveryUnit
from delivery_service.state_machine import LedgerLimits
from session_service import pii
from session_service.app import SessionUnit
from session_service.core import SessionLimits
from switchboard import migrations
from switchboard.auth import Grant, check_secret, check_sendable, parse_tokens
from switchboard.database import DatabaseSettings, IntegrityCheck, SettingsMismatch, SqliteSync
from switchboard.observability import (
    ACCESS_LEVELS,
    AccessLevel,
    RpcMetrics,
    StateCollector,
    configure_logging,
    serve_metrics,
)
from switchboard.server import GrpcApp, ServerSettings, serve_until_signalled
from switchboard_cli.databases import (
    DataDir,
    Service,
    data_dir_option,
    database_url_option,
    locate,
    redacted,
)
from switchboard_cli.options import (
    DEFAULT_DELIVERY_LISTEN,
    DEFAULT_SESSION_LISTEN,
    log_options,
    relog,
)
from switchboard_cli.workers import Ready, Supervisor, WorkersFailed, drain_when_orphaned
from switchboard_console.server import serve_with_console


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


@dataclass(frozen=True)
class ServeOptions:
    """Every option of `serve`, as click parsed them."""

    which: str
    data_dir: DataDir | None
    session_listen: str
    session_database_url: str | None
    snapshot_every: int
    delivery_listen: str
    delivery_database_url: str | None
    sqlite_synchronous: SqliteSync
    sqlite_integrity_check: IntegrityCheck
    on_settings_mismatch: SettingsMismatch
    db_pool_size: int
    db_writer_threads: int | None
    db_lock_timeout: float
    max_attempts: int
    stale_after: float
    retention: float
    lease_ttl: float
    backoff: tuple[float, ...]
    max_content_bytes: int
    max_state_value_bytes: int
    max_record_bytes: int
    max_records_call_bytes: int
    request_id_window: float
    max_concurrent_rpcs: int | None
    max_watchers: int
    max_connections: int
    max_streams_per_connection: int
    http2_window_bytes: int
    max_message_bytes: int
    drain_grace: float
    metrics_listen: str
    access_log: AccessLevel
    log_level: str | None
    log_format: str | None
    auth_tokens: str
    pii_key_file: Path | None
    pii_key: str | None
    tls_cert: Path | None
    tls_key: Path | None
    tls_client_ca: Path | None
    no_migrate: bool
    console_listen: str
    console_read_only: bool
    workers: int

    def serves(self, service: Service) -> bool:
        return self.which in ("all", service)


@dataclass(frozen=True)
class Checked:
    """What the options become once checked, before any database is opened."""

    grants: dict[str, Grant]
    pii_key: bytes | None
    database_urls: dict[Service, str]


@click.command()
@click.argument(
    "which", type=click.Choice(["all", "session", "delivery"]), default="all", required=False
)
@data_dir_option
@click.option(
    "--session-listen",
    default=DEFAULT_SESSION_LISTEN,
    envvar="SWITCHBOARD_SESSION_LISTEN",
    show_default=True,
    help="host:port for the SessionService (port 0 picks a free one).",
)
@database_url_option("session")
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
@database_url_option("delivery")
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
    type=click.IntRange(min=1),
    default=None,
    envvar="SWITCHBOARD_DB_WRITER_THREADS",
    help="Postgres writer threads per service (SQLite always has one writer). "
    "[default: 1 for the SessionService, whose writes take the log's lock in turn; "
    "4 for the DeliveryService]",
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
@log_options
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
@click.option(
    "--workers",
    default=1,
    type=int,
    envvar="SWITCHBOARD_WORKERS",
    show_default=True,
    help="Server processes sharing each port (SO_REUSEPORT), Postgres only: about one "
    "core each (see docs/performance.md). A worker that dies stops them all (exit 1); "
    "with --metrics-listen host:P worker i serves its metrics on P+i.",
)
def serve(**parsed: Any) -> None:
    """Run the services until SIGTERM or Ctrl-C (then drain and exit 0)."""
    options = ServeOptions(**parsed)
    ctx = click.get_current_context()
    relog(ctx, options.log_level, options.log_format)
    checked = _checked(options)
    if options.workers > 1:
        _supervise(_worker_options(options, ctx), checked)
        return
    _serve_here(options, checked)


def _serve_here(
    options: ServeOptions,
    checked: Checked,
    report: Callable[[Sequence[GrpcApp], int], None] | None = None,
) -> None:
    """One process serving every asked service (a worker's body as well). `report`
    replaces the printed addresses: it gets the started apps and the metrics port."""
    registry = CollectorRegistry()
    metrics = RpcMetrics(registry) if options.metrics_listen else None
    apps = _apps(options, checked, metrics)
    metrics_port = 0
    if options.metrics_listen:
        for app in apps.values():
            registry.register(StateCollector(app.unit.gauges))
        metrics_port = serve_metrics(registry, options.metrics_listen)
        if report is None:
            host = options.metrics_listen.rpartition(":")[0]
            click.echo(f"switchboard: metrics on {host}:{metrics_port}")
    _run(options, apps, checked, None if report is None else lambda a: report(a, metrics_port))


def _worker_options(options: ServeOptions, ctx: click.Context) -> ServeOptions:
    """The options a worker process runs with: the logging the group chose is carried
    (a spawned process starts with none)."""
    chosen = ctx.find_object(dict) or {}
    return dataclasses.replace(
        options,
        log_level=options.log_level or chosen.get("log_level", "INFO"),
        log_format=options.log_format or chosen.get("log_format", "json"),
    )


def _listens(options: ServeOptions) -> dict[Service, str]:
    listens: dict[Service, str] = {
        "session": options.session_listen,
        "delivery": options.delivery_listen,
    }
    return {service: listen for service, listen in listens.items() if options.serves(service)}


def _supervise(options: ServeOptions, checked: Checked) -> None:
    """N workers on shared ports; the addresses and readiness printed as one process
    prints them, once all serve."""
    target = functools.partial(_worker_main, options, checked)
    supervisor = Supervisor(target, options.workers, options.drain_grace)
    try:
        listens = {str(service): listen for service, listen in _listens(options).items()}
        readies = supervisor.start(listens, timeout_s=120.0)
    except WorkersFailed as failed:
        raise click.ClickException(str(failed)) from failed
    _announce_workers(options, checked, readies, supervisor)
    try:
        supervisor.watch()
    except WorkersFailed as failed:
        raise click.ClickException(str(failed)) from failed
    if not supervisor.clean_exit():
        sys.exit(1)


def _announce_workers(
    options: ServeOptions, checked: Checked, readies: list[Ready], supervisor: Supervisor
) -> None:
    names = {"session": "SessionService", "delivery": "DeliveryService"}
    for service, listen in _listens(options).items():
        host = listen.rsplit(":", 1)[0]
        url = redacted(checked.database_urls[service])
        click.echo(
            f"switchboard: {names[service]} listening on {host}:{readies[0][service]} ({url})"
        )
    if options.metrics_listen:
        host = options.metrics_listen.rpartition(":")[0]
        for index, ready in enumerate(readies):
            click.echo(f"switchboard: metrics of worker {index} on {host}:{ready['metrics']}")
    pids = ", ".join(str(worker.process.pid) for worker in supervisor.workers)
    click.echo(f"switchboard: {options.workers} workers share the ports (pids {pids})")
    click.echo("switchboard: ready; Ctrl-C or SIGTERM drains and stops")


def _worker_main(
    options: ServeOptions,
    checked: Checked,
    index: int,
    listens: Mapping[str, str],
    pipe: Connection,
) -> None:
    """A worker process: serves on `listens` (the ports the first worker got), reports
    its ports on `pipe` once serving, and drains on SIGTERM."""
    configure_logging(options.log_level or "INFO", json_format=options.log_format == "json")
    drain_when_orphaned()
    metrics_listen = options.metrics_listen
    if metrics_listen and not metrics_listen.endswith(":0"):
        host, _, port = metrics_listen.rpartition(":")
        metrics_listen = f"{host}:{int(port) + index}"  # one endpoint per worker
    mine = dataclasses.replace(
        options,
        session_listen=listens.get("session", options.session_listen),
        delivery_listen=listens.get("delivery", options.delivery_listen),
        metrics_listen=metrics_listen,
    )

    def report(apps: Sequence[GrpcApp], metrics_port: int) -> None:
        ready: Ready = {_service_of(app): app.port for app in apps}
        pipe.send({**ready, "metrics": metrics_port})
        pipe.close()

    try:
        _serve_here(mine, checked, report)
    except click.ClickException as refused:
        refused.show()
        sys.exit(refused.exit_code)


def _service_of(app: GrpcApp) -> str:
    return "session" if app.unit.service_name.endswith("SessionService") else "delivery"


def _checked(options: ServeOptions) -> Checked:
    """Every option that can be refused is, before anything is opened."""
    if options.console_listen and options.which != "all":
        raise click.UsageError("--console-listen needs both services: `serve all`")
    _check_workers(options)
    try:
        grants = parse_tokens(options.auth_tokens)
        check_sendable(grants)
        check_secret(grants)
    except ValueError as exc:
        raise click.BadParameter(
            str(exc), param_hint="--auth-tokens / SWITCHBOARD_AUTH_TOKENS"
        ) from exc
    try:
        key = pii.read_key(options.pii_key_file, options.pii_key)
    except pii.PiiKeyRefused as exc:
        raise click.BadParameter(
            str(exc), param_hint="--pii-key-file / SWITCHBOARD_PII_KEY"
        ) from exc
    if (options.tls_cert is None) != (options.tls_key is None) or (
        options.tls_client_ca and not options.tls_cert
    ):
        raise click.UsageError("TLS needs --tls-cert and --tls-key (and then --tls-client-ca)")
    given: dict[Service, str | None] = {
        "session": options.session_database_url,
        "delivery": options.delivery_database_url,
    }
    urls = {
        service: locate(service, url, options.data_dir).url
        for service, url in given.items()
        if options.serves(service)
    }
    if options.workers > 1:
        _check_shared_database(urls)
    return Checked(grants, key, urls)


def _check_workers(options: ServeOptions) -> None:
    if options.workers < 1:
        raise click.BadParameter(
            f"{options.workers}: give 1 (one process) or more", param_hint="--workers"
        )
    if options.workers > 1 and options.console_listen:
        raise click.UsageError(
            "--console-listen serves one console beside one process: run it with "
            "--workers 1, or `switchboard console` beside the workers"
        )


def _check_shared_database(urls: Mapping[Service, str]) -> None:
    """Several workers write one database: only Postgres takes writers from several
    processes (a SQLite file has one writer process; more would wait on its lock)."""
    for service, url in urls.items():
        if not url.startswith(("postgres://", "postgresql://")):
            raise click.UsageError(
                f"--workers above 1 needs a Postgres database: the {service} database is "
                f"{redacted(url)}, and SQLite keeps one writer process (run --workers 1, "
                "or give a postgresql:// URL)"
            )


def _database(options: ServeOptions, url: str) -> DatabaseSettings:
    return DatabaseSettings(
        url=url,
        sqlite_synchronous=options.sqlite_synchronous,
        pool_size=options.db_pool_size,
        writer_threads=options.db_writer_threads,
        busy_timeout_ms=max(1, round(options.db_lock_timeout * 1000)),
        sqlite_integrity_check=options.sqlite_integrity_check,
        on_settings_mismatch=options.on_settings_mismatch,
    )


def _server(
    options: ServeOptions, listen: str, grants: dict[str, Grant], metrics: RpcMetrics | None
) -> ServerSettings:
    return ServerSettings(
        listen=listen,
        max_concurrent_rpcs=options.max_concurrent_rpcs,
        max_connections=options.max_connections or None,
        max_streams_per_connection=options.max_streams_per_connection or None,
        http2_window_bytes=options.http2_window_bytes or None,
        max_message_bytes=options.max_message_bytes,
        drain_grace_s=options.drain_grace,
        auth=grants,
        metrics=metrics,
        access_log=options.access_log,
        tls_cert=options.tls_cert,
        tls_key=options.tls_key,
        tls_client_ca=options.tls_client_ca,
        share_port=options.workers > 1,
    )


def _session_unit(options: ServeOptions, checked: Checked) -> SessionUnit:
    limits = SessionLimits(
        snapshot_every=options.snapshot_every,
        request_id_window_s=options.request_id_window,
        max_watchers=options.max_watchers,
        max_content_bytes=options.max_content_bytes,
        max_state_value_bytes=options.max_state_value_bytes,
        max_record_bytes=options.max_record_bytes,
        max_records_call_bytes=options.max_records_call_bytes,
    )
    database = _database(options, checked.database_urls["session"])
    return SessionUnit(database, limits, migrate=not options.no_migrate, pii_key=checked.pii_key)


def _delivery_unit(options: ServeOptions, checked: Checked) -> DeliveryUnit:
    limits = LedgerLimits(
        max_attempts=options.max_attempts,
        stale_after_s=options.stale_after,
        retention_s=options.retention,
        lease_ttl_s=options.lease_ttl,
        backoff_s=options.backoff,
        max_content_bytes=options.max_content_bytes,
        request_id_window_s=options.request_id_window,
    )
    database = _database(options, checked.database_urls["delivery"])
    return DeliveryUnit(database, limits, migrate=not options.no_migrate, pii_key=checked.pii_key)


def _apps(
    options: ServeOptions, checked: Checked, metrics: RpcMetrics | None
) -> dict[Service, GrpcApp]:
    """The services' units (their databases opened and migrated), each with its server
    settings; a refused schema closes what was opened and ends the command."""
    apps: dict[Service, GrpcApp] = {}
    try:
        if options.serves("session"):
            listen = _server(options, options.session_listen, checked.grants, metrics)
            apps["session"] = GrpcApp(_session_unit(options, checked), listen)
        if options.serves("delivery"):
            listen = _server(options, options.delivery_listen, checked.grants, metrics)
            apps["delivery"] = GrpcApp(_delivery_unit(options, checked), listen)
    except migrations.SchemaError as refused:
        for app in apps.values():
            app.unit.close()
        raise click.ClickException(str(refused)) from refused
    return apps


def _run(
    options: ServeOptions,
    apps: dict[Service, GrpcApp],
    checked: Checked,
    on_ready: Callable[[Sequence[GrpcApp]], None] | None = None,
) -> None:
    """Serves until SIGTERM or Ctrl-C, the console beside the services when asked;
    `on_ready` replaces the printed addresses (a worker reports to its parent)."""
    urls = {id(app): redacted(checked.database_urls[service]) for service, app in apps.items()}
    served = list(apps.values())

    def announce(started: Sequence[GrpcApp]) -> None:
        for app in started:
            name = app.unit.service_name.rsplit(".", 1)[-1]
            click.echo(f"switchboard: {name} listening on {app.address} ({urls[id(app)]})")
        click.echo("switchboard: ready; Ctrl-C or SIGTERM drains and stops")

    if not options.console_listen:
        asyncio.run(serve_until_signalled(served, on_ready or announce))
        return
    asyncio.run(
        serve_with_console(
            served,
            announce,
            options.console_listen,
            options.console_read_only,
            lambda url: click.echo(f"switchboard: console on {url}"),
        )
    )
