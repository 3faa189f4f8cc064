"""Schema migrations on both backends: fresh databases, adopted old ones, refusals, the CLI.

Old databases are built the way the release before versioning built them
(`create_tables` of the store's models, no history table), with data written
through the real services; the committed fixture under tests/fixtures was
written by that release itself (see tests/upgrade/make_fixture.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playhouse.migrate import SchemaMigrator, migrate
from playhouse.schema_diff import diff_models

from delivery_service.app import DeliveryUnit
from delivery_service.migrations import BASELINE_MODELS as DELIVERY_BASELINE
from delivery_service.migrations import DELIVERY_SCHEMA
from delivery_service.state_machine import LedgerLimits
from delivery_service.store import LedgerStore
from session_service.app import SessionUnit
from session_service.framework_projection import FrameworkProjection
from session_service.migrations import BASELINE_MODELS as SESSION_BASELINE
from session_service.migrations import SESSION_SCHEMA
from session_service.pii import Redactor
from session_service.storage.erasure_store import ErasureStore
from session_service.storage.store import SessionStore
from switchboard import migrations
from switchboard.backends import open_backend
from switchboard.database import Backend, DatabaseSettings
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from switchboard.shared_settings import SESSION_SETTINGS, SharedSettings
from tests.harness import EventLoopThread, ServerProcess, delivery_server, session_server
from tests.upgrade import reads, sample

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "pre-migrations"
COMPONENTS = (SESSION_SCHEMA, DELIVERY_SCHEMA)


@pytest.fixture
def backend(database_url: str) -> Iterator[Backend]:
    opened = open_backend(DatabaseSettings(url=database_url))
    yield opened
    opened.database.close()


def _store_models(backend: Backend, component: migrations.Component) -> list[Any]:
    if component is SESSION_SCHEMA:
        erasure = ErasureStore(backend, Redactor())
        framework = FrameworkProjection(backend).models + erasure.models
        return [*SessionStore(backend).models, *framework]
    store = LedgerStore(backend, LedgerLimits())
    return [store.Instance, store.Obligation]


def _execute(backend: Backend, sql: str) -> None:
    database: Any = backend.database
    with database.connection_context():
        database.execute_sql(sql)


def _pre_versioning_schema(backend: Backend) -> None:
    """What the release before versioning did at start (`create_schema`, 360f72e)."""
    database: Any = backend.database
    store = SessionStore(backend)
    with database.connection_context():
        # The store's tables as that release had them (the store's models now carry
        # later migrations' columns): the frozen baseline models.
        with database.bind_ctx(SESSION_BASELINE):
            database.create_tables(SESSION_BASELINE, safe=True)
        store.tables.Head.insert(id=1, seq=0).on_conflict_ignore().execute()
        store.tables.Retention.insert(id=1, retained_from=0).on_conflict_ignore().execute()
        # The ledger's tables as that release had them: the frozen baseline models.
        with database.bind_ctx(DELIVERY_BASELINE):
            database.create_tables(DELIVERY_BASELINE, safe=True)


def _make_pre_versioning(backend: Backend, *, drop_resume_pending: bool = True) -> None:
    """Turns a migrated database into one of an older release: no history tables,
    and (as before `resume_pending` existed) no such column."""
    database: Any = backend.database
    with database.connection_context():
        # Everything later migrations made, the history tables among them.
        baseline = {m._meta.table_name for m in (*SESSION_BASELINE, *DELIVERY_BASELINE)}
        for table in database.get_tables():
            if table not in baseline and table != "switchboard_clock_anchor":
                database.execute_sql(f"DROP TABLE {table}")
        if drop_resume_pending:
            migrate(
                SchemaMigrator.from_database(database).drop_column(
                    "session_session", "resume_pending"
                )
            )
        _drop_row_scope(database)
        _drop_projection_summaries(database)
        _drop_inbound_refs(database)
        _drop_active_markers(database)
        _drop_storage_formats(database)
        _drop_sealed_targets(database)
        _drop_listing_indexes(database)


def _drop_sealed_targets(database: Any) -> None:
    """Obligations as they were before they could carry a sealed target (delivery 5)."""
    migrate(
        SchemaMigrator.from_database(database).drop_column("ledger_obligation", "sealed_target")
    )


def _drop_listing_indexes(database: Any) -> None:
    """Session rows as they were before every agent's sessions were listed (migration 7)."""
    for index in ("session_session_created_seq", "session_session_routing_key"):
        database.execute_sql(f"DROP INDEX IF EXISTS {index}")


def _drop_inbound_refs(database: Any) -> None:
    """A session log as it was before inbox posts kept their message_ref (migration 10)."""
    migrator = SchemaMigrator.from_database(database)
    migrate(migrator.drop_index("session_log", "session_log_inbound_ref"))
    migrate(migrator.drop_column("session_log", "inbound_ref"))


def _drop_storage_formats(database: Any) -> None:
    """Log and snapshot rows as they were before they named their format (migration 6)."""
    migrator = SchemaMigrator.from_database(database)
    for table in ("session_log", "session_snapshot"):
        migrate(migrator.drop_column(table, "format"))


def _drop_projection_summaries(database: Any) -> None:
    """Session projection rows as they were before they kept summaries (migration 3)."""
    migrator = SchemaMigrator.from_database(database)
    for table in ("session_agent", "session_session"):
        migrate(migrator.drop_column(table, "summary"))


#: What delivery migration 4 (row_scope) added: (table, column) and indexes.
ROW_SCOPE_COLUMNS = (
    ("ledger_obligation", "agent"),
    ("ledger_obligation", "gateway_name"),
    ("ledger_instance", "principal"),
)
ROW_SCOPE_INDEXES = (
    "ledger_obligation_agent_created_at_id",
    "ledger_obligation_gateway_name_state_platform",
)


def _drop_row_scope(database: Any) -> None:
    """A ledger as it was before rows remembered their agent and gateway."""
    migrator = SchemaMigrator.from_database(database)
    for index in ROW_SCOPE_INDEXES:
        migrate(migrator.drop_index("ledger_obligation", index))
    for table, column in ROW_SCOPE_COLUMNS:
        migrate(migrator.drop_column(table, column))


#: What session migration 4 (active_markers) added: indexes, then (table, column).
ACTIVE_MARKER_INDEXES = (
    ("session_log", "session_log_session_id_active_seq"),
    ("session_log", "session_log_agent_session_id_active_seq"),
    ("session_log", "session_log_session_id_kind_active_seq"),
    ("session_snapshot", "session_snapshot_entity_active_seq"),
    ("session_snapshot", "session_snapshot_seq"),
)


def _drop_active_markers(database: Any) -> None:
    """A session log as it was before rows said whether they are active."""
    migrator = SchemaMigrator.from_database(database)
    for table, index in ACTIVE_MARKER_INDEXES:
        migrate(migrator.drop_index(table, index))
    for table in ("session_log", "session_snapshot"):
        migrate(migrator.drop_column(table, "active"))


def _columns(backend: Backend) -> dict[str, list[str]]:
    database: Any = backend.database
    with database.connection_context():
        return {
            table: sorted(column.name for column in database.get_columns(table))
            for table in database.get_tables()
        }


def _assert_matches_the_stores(backend: Backend) -> None:
    """The migrated schema is what the store's models declare: a model changed
    without a migration (or a migration without the model) fails here."""
    database: Any = backend.database
    with database.connection_context():
        for component in COMPONENTS:
            models = _store_models(backend, component)
            if component is DELIVERY_SCHEMA:
                models.append(SharedSettings(backend).Setting)  # created by migration 2
            else:
                models.append(SharedSettings(backend, SESSION_SETTINGS).Setting)  # migration 9
            diff = diff_models(database, models)
            assert not diff, f"{component.name}: the migrations and the models differ:\n{diff}"


def _adopted(component: migrations.Component) -> list[tuple[int, str]]:
    """The history of a pre-versioning database brought up to date: the baseline
    adopted, every later migration applied."""
    later = range(2, component.code_version + 1)
    return [(1, migrations.ADOPTED), *((version, migrations.APPLIED) for version in later)]


def _applied(component: migrations.Component) -> list[tuple[int, str]]:
    return [(version, migrations.APPLIED) for version in range(1, component.code_version + 1)]


def _history(backend: Backend, component: migrations.Component) -> list[tuple[int, str]]:
    return [(row.version, row.action) for row in migrations.status(backend, component).history]


# -- fresh and old databases ---------------------------------------------------------------


def test_a_fresh_database_migrates_to_the_latest_version(backend: Backend) -> None:
    for component in COMPONENTS:
        before = migrations.status(backend, component)
        assert (before.database_version, before.unversioned) == (0, False)
        assert len(before.pending) == component.code_version
        report = migrations.migrate(backend, component)
        assert (report.from_version, report.to_version) == (0, component.code_version)
        assert not report.adopted
        after = migrations.status(backend, component)
        assert after.database_version == after.code_version == component.code_version
        assert after.pending == []
        assert _history(backend, component) == _applied(component)
        # A second run finds nothing to do.
        assert migrations.migrate(backend, component).applied == []
    _assert_matches_the_stores(backend)
    database: Any = backend.database
    with database.connection_context():
        seeds = database.execute_sql(
            "SELECT (SELECT seq FROM session_log_head WHERE id = 1), "
            "(SELECT retained_from FROM session_retention WHERE id = 1)"
        ).fetchone()
    assert tuple(seeds) == (0, 0)


def test_a_pre_versioning_database_is_adopted_and_completed(backend: Backend) -> None:
    _pre_versioning_schema(backend)
    database: Any = backend.database
    with database.connection_context():
        migrate(
            SchemaMigrator.from_database(database).drop_column("session_session", "resume_pending")
        )
        database.execute_sql("DROP TABLE session_checkpoint")
    assert "resume_pending" not in _columns(backend)["session_session"]
    for component in COMPONENTS:
        found = migrations.status(backend, component)
        assert (found.database_version, found.unversioned) == (0, True)
        report = migrations.migrate(backend, component)
        assert report.adopted
        assert _history(backend, component)[0] == (1, migrations.ADOPTED)
    columns = _columns(backend)
    assert "resume_pending" in columns["session_session"]
    assert "session_checkpoint" in columns
    _assert_matches_the_stores(backend)


def test_data_written_before_versioning_reads_back_the_same_after_adoption(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    """Real data through the real services, the database turned into an older
    release's, then both services restarted on it: every read is the same."""
    with (
        session_server(loop_thread, database_url) as sessions,
        delivery_server(loop_thread, database_url) as ledger,
    ):
        session_stub = spb_grpc.SessionServiceStub(sessions.channel)
        delivery_stub = dpb_grpc.DeliveryServiceStub(ledger.channel)
        head = sample.write_sessions(session_stub, resume_mark=False)
        instance_ids = sample.write_ledger(delivery_stub)
        before = (
            reads.read_sessions(session_stub, head),
            reads.read_ledger(delivery_stub, instance_ids),
        )
    old = open_backend(DatabaseSettings(url=database_url))
    _make_pre_versioning(old)
    assert all(migrations.status(old, c).unversioned for c in COMPONENTS)
    with (
        session_server(loop_thread, database_url) as sessions,
        delivery_server(loop_thread, database_url) as ledger,
    ):
        session_stub = spb_grpc.SessionServiceStub(sessions.channel)
        delivery_stub = dpb_grpc.DeliveryServiceStub(ledger.channel)
        after = (
            reads.read_sessions(session_stub, head),
            reads.read_ledger(delivery_stub, instance_ids),
        )
        # Still writable after the upgrade, on the restored column too.
        beta = before[0]["agents"]["beta"]["sessions"]
        [sid] = [
            sid for sid, read in beta.items() if read["session"]["source"]["transport"] == "slack"
        ]
        marked = session_stub.MarkResumable(
            spb.MarkResumableRequest(agent="beta", session_id=sid, pending=True, holder="gw")
        ).session
        assert marked.resume_pending
    assert after == before
    for component in COMPONENTS:
        assert _history(old, component) == _adopted(component)
    _assert_matches_the_stores(old)
    old.database.close()


def test_the_release_fixture_migrates_and_reads_back_as_the_old_code_saw_it(
    tmp_path: Path, loop_thread: EventLoopThread
) -> None:
    """SQLite files written by the release before migrations (commit 360f72e)."""
    expected = json.loads((FIXTURE / "expected_reads.json").read_text())
    for name in ("session.sqlite3", "delivery.sqlite3"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    session_url = f"sqlite:///{tmp_path / 'session.sqlite3'}"
    delivery_url = f"sqlite:///{tmp_path / 'delivery.sqlite3'}"
    for url, component in ((session_url, SESSION_SCHEMA), (delivery_url, DELIVERY_SCHEMA)):
        assert migrations.status(open_backend(DatabaseSettings(url=url)), component).unversioned
    with (
        session_server(loop_thread, session_url) as sessions,
        delivery_server(loop_thread, delivery_url) as ledger,
    ):
        session_stub = spb_grpc.SessionServiceStub(sessions.channel)
        delivery_stub = dpb_grpc.DeliveryServiceStub(ledger.channel)
        # Migration 11 keyed the sessions (and reads the log's keys) in the injective
        # encoding; everything else reads as that release saw it.
        assert reads.read_sessions(session_stub, expected["head"]) == _rekeyed(
            expected["sessions"], FIXTURE_KEYS
        )
        got = reads.read_ledger(delivery_stub, expected["instance_ids"])
        # Migration 4 filled in what that release did not know: each row's agent
        # (from its session key) and gateway (its owner's). The rest reads the same.
        for listing in ("obligations", "fetched"):
            for row in got[listing]:
                assert (row.pop("agent"), row.pop("gateway_name")) == ("alpha", "fixture-gateway")
        assert got == expected["ledger"]
    session_backend = open_backend(DatabaseSettings(url=session_url))
    assert _history(session_backend, SESSION_SCHEMA) == _adopted(SESSION_SCHEMA)
    delivery_backend = open_backend(DatabaseSettings(url=delivery_url))
    assert _history(delivery_backend, DELIVERY_SCHEMA) == _adopted(DELIVERY_SCHEMA)
    database: Any = session_backend.database
    with database.connection_context():
        diff = diff_models(database, SessionStore(session_backend).models)
    assert not diff, str(diff)


#: The fixture's routing keys, as that release wrote them and in the injective encoding.
FIXTURE_KEYS = {
    "agent:alpha:web:c-1": "agent:alpha:web:id=c-1",
    "agent:beta:web:c-2": "agent:beta:web:id=c-2",
    "agent:beta:slack:channel:C1:U1": "agent:beta:slack:channel:c=C1:u=U1",
}


def _rekeyed(read: Any, keys: dict[str, str]) -> Any:
    """`read` with every `routing_key` value renamed by `keys`."""
    if isinstance(read, dict):
        return {
            name: keys[value] if name == "routing_key" else _rekeyed(value, keys)
            for name, value in read.items()
        }
    if isinstance(read, list):
        return [_rekeyed(item, keys) for item in read]
    return read


# -- refusals --------------------------------------------------------------------------------


def _bump_past_the_code(backend: Backend, component: migrations.Component) -> int:
    newer = component.code_version + 1
    database: Any = backend.database
    with database.connection_context():
        database.execute_sql(
            f"INSERT INTO {component.history_table} "
            "(version, name, action, applied_at, applied_by) "
            f"VALUES ({newer}, 'from_the_future', 'applied', 0, 'a newer release')"
        )
    return newer


def test_code_older_than_the_schema_refuses_to_start_and_touches_nothing(
    backend: Backend, database_url: str
) -> None:
    for component in COMPONENTS:
        migrations.migrate(backend, component)
    newer = {component.name: _bump_past_the_code(backend, component) for component in COMPONENTS}
    # Something a migrating (or table-creating) start would put back:
    _execute(backend, "DROP TABLE session_checkpoint")
    before = _columns(backend)
    settings = DatabaseSettings(url=database_url)
    with pytest.raises(migrations.SchemaNewerThanCode) as refused:
        SessionUnit(settings)
    message = str(refused.value)
    assert f"version {newer['session']}" in message
    assert f"version {SESSION_SCHEMA.code_version}" in message
    with pytest.raises(migrations.SchemaNewerThanCode):
        DeliveryUnit(settings)
    with pytest.raises(migrations.SchemaNewerThanCode):
        migrations.migrate(backend, SESSION_SCHEMA)
    assert _columns(backend) == before


def test_no_migrate_refuses_a_schema_that_is_behind(backend: Backend, database_url: str) -> None:
    settings = DatabaseSettings(url=database_url)
    with pytest.raises(migrations.SchemaBehind, match="switchboard db migrate"):
        SessionUnit(settings, migrate=False)
    with pytest.raises(migrations.SchemaBehind, match="switchboard db migrate"):
        DeliveryUnit(settings, migrate=False)
    # The SQLite backend's clock anchor is the backend's own, made when it opens the file.
    created = {t for t in _columns(backend) if t != "switchboard_clock_anchor"}
    assert created == set(), "a refused start created tables"
    for component in COMPONENTS:
        migrations.migrate(backend, component)
    SessionUnit(settings, migrate=False).close()
    DeliveryUnit(settings, migrate=False).close()


# -- the command line ------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard_cli", "--log-format", "text", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def _urls(url: str) -> tuple[str, ...]:
    return ("--session-database-url", url, "--delivery-database-url", url)


def test_db_status_and_migrate_through_the_cli(database_url: str, tmp_path: Path) -> None:
    if database_url.startswith("sqlite:///"):
        missing = _cli("db", "status", *_urls(database_url))
        assert missing.returncode == 1, missing.stderr
        path = database_url.removeprefix("sqlite:///")
        for service in ("session", "delivery"):
            assert f"no {service} database at {path}" in missing.stderr
        assert not Path(path).exists()
        open_backend(DatabaseSettings(url=database_url)).database.connect()  # an empty file
    status = _cli("db", "status", *_urls(database_url), "--data-dir", str(tmp_path))
    assert status.returncode == 0, status.stderr
    assert "session" in status.stdout and "delivery" in status.stdout
    for component in COMPONENTS:
        assert f"{component.code_version} pending" in status.stdout
    assert "database version: 0" in status.stdout
    assert "pending 1 baseline" in status.stdout

    done = _cli("db", "migrate", "session", *_urls(database_url))
    assert done.returncode == 0, done.stderr
    assert f"session: migrated from version 0 to {SESSION_SCHEMA.code_version}" in done.stdout
    assert "delivery" not in done.stdout
    done = _cli("db", "migrate", *_urls(database_url))
    assert done.returncode == 0, done.stderr
    assert f"session: already at version {SESSION_SCHEMA.code_version}" in done.stdout
    assert f"delivery: migrated from version 0 to {DELIVERY_SCHEMA.code_version}" in done.stdout

    status = _cli("db", "status", *_urls(database_url))
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("up to date") == 2
    assert status.stdout.count("applied 1 baseline") == 2
    assert "pending" not in status.stdout


def test_db_status_names_an_unversioned_database(database_url: str) -> None:
    backend = open_backend(DatabaseSettings(url=database_url))
    _pre_versioning_schema(backend)
    status = _cli("db", "status", "delivery", *_urls(database_url))
    assert status.returncode == 0, status.stderr
    assert "before versioning" in status.stdout
    done = _cli("db", "migrate", "delivery", *_urls(database_url))
    assert "adopted" in done.stdout, done.stdout + done.stderr
    assert _history(backend, DELIVERY_SCHEMA) == _adopted(DELIVERY_SCHEMA)


def test_serve_refuses_a_newer_schema_with_a_clear_message(database_url: str) -> None:
    backend = open_backend(DatabaseSettings(url=database_url))
    migrations.migrate(backend, SESSION_SCHEMA)
    newer = _bump_past_the_code(backend, SESSION_SCHEMA)
    for args in (
        ("serve", "session", "--session-listen", "127.0.0.1:0", *_urls(database_url)),
        ("db", "migrate", "session", *_urls(database_url)),
    ):
        refused = _cli(*args)
        assert refused.returncode != 0
        assert f"version {newer}" in refused.stderr
        assert f"version {SESSION_SCHEMA.code_version}" in refused.stderr
        assert "Traceback" not in refused.stderr + refused.stdout


def test_serve_no_migrate_refuses_until_db_migrate_ran(database_url: str, tmp_path: Path) -> None:
    serve = ("serve", "delivery", "--delivery-listen", "127.0.0.1:0", *_urls(database_url))
    for refused in (
        _cli(*serve, "--no-migrate"),
        _cli(*serve, env={"SWITCHBOARD_NO_MIGRATE": "1"}),
    ):
        assert refused.returncode != 0
        assert "switchboard db migrate" in refused.stderr
        assert "Traceback" not in refused.stderr + refused.stdout
    assert _cli("db", "migrate", "delivery", *_urls(database_url)).returncode == 0
    server = ServerProcess(database_url, tmp_path, "--no-migrate")
    try:
        server.start()
    finally:
        server.stop_quietly()
    backend = open_backend(DatabaseSettings(url=database_url))
    assert _history(backend, DELIVERY_SCHEMA) == _applied(DELIVERY_SCHEMA)


def test_every_component_has_a_lock_key_and_title_of_its_own() -> None:
    assert SESSION_SCHEMA.lock_key != DELIVERY_SCHEMA.lock_key
    assert SESSION_SCHEMA.history_table != DELIVERY_SCHEMA.history_table
    for component in COMPONENTS:
        for version in range(1, component.code_version + 1):
            assert component.title(version).startswith(f"{version} ")
            assert ":" in component.title(version), "a migration without a docstring"
