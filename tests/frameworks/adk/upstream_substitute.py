"""A pytest plugin (`-p upstream_substitute`) that runs Google ADK's own session tests
(`tests/unittests/sessions` of a checkout of its repository) against
`SwitchboardSessionService`. A developer tool, not part of the suite: CI cannot download
ADK's repository, and nothing here is collected as a test (docs/frameworks/adk.md says
how to run it).

ADK's tests get the service under test in three ways, and each becomes ours, on a fresh
server of its own for each test (a SQLite file under the test's tmp_path, or with
SWITCHBOARD_ADK_BACKEND=postgres a fresh schema of SWITCHBOARD_TEST_POSTGRES_URL),
since they expect an empty store each time (fixed app, user and session names):
- the `session_service` fixture of `sessions/_conformance.py`, its registry of
  backends (`BACKENDS`) held to the shared contract: both are replaced before the test
  module imports them, by one backend, "switchboard";
- the test module's `get_session_service(service_type, tmp_path)` factory, replaced
  while each test runs (whatever service type a test asks for, it gets ours);
- a `session_service` argument parametrized directly with an ADK service instance,
  swapped for ours when the test is called.
Tests that build one of ADK's services themselves (to test its SQL, schema, pickling,
migrations or Vertex client) never meet ours: SWITCHBOARD_ADK_REPORT (a JSON path), when
set, gets which tests did, so that a table can call the rest not applicable.

The server is the production `GrpcApp` with a `SessionUnit`, on a loop thread of this
process; this plugin imports nothing from our `tests` package, since the working
directory is ADK's checkout, whose `tests` package is ADK's.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg2
import pytest
from google.adk.sessions.base_session_service import BaseSessionService
from switchboard_client.frameworks.adk import SwitchboardSessionService

from session_service.app import SessionUnit
from session_service.core import SessionLimits
from switchboard.database import DatabaseSettings
from switchboard.server import GrpcApp, ServerSettings

BACKEND_NAME = "switchboard"
_POSTGRES_URL = os.environ.get(
    "SWITCHBOARD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


_SQL_SCHEMA = (
    "ADK's database services' SQL schema, column types, storage rows and migrations "
    "(SQLAlchemy types, v0 pickle and v1 JSON schemas, their migration scripts)"
)
_SQL_ENGINE = (
    "DatabaseSessionService's SQLAlchemy engine: its options per dialect (pool pre-ping, "
    "read-only engine, naive or aware datetimes), its constructor's URL or engine "
    "arguments and their errors, its place in ADK's module namespace"
)
_SQLITE_URL = "SqliteSessionService's reading of its sqlite:/// URL and its file"
_SQL_ROWS = (
    "edits or deletes ADK's SQL rows behind the service (raw SQL or ADK's ORM classes) "
    "and checks what the service then reads"
)
_SQL_FAULTS = (
    "fakes failures or races inside DatabaseSessionService's SQLAlchemy session (commit "
    "failures and rollbacks, when it reads the row's revision, prepare_tables, "
    "_get_or_create_state, which rows it locks FOR UPDATE)"
)
_IN_MEMORY = (
    "InMemorySessionService's own API: its storage dict (`service.sessions`) or its "
    "*_sync methods, which BaseSessionService does not have"
)
_VERTEX = (
    "VertexAiSessionService against a fake Agent Engine client (needs google-api-core, "
    "which the dev install does not have; it fails on ADK's own service here too)"
)
_NO_SERVICE = "tests an ADK model or helper, no session service"

#: Files of `sessions/` (a folder ends with "/") not collected: none reaches a service.
IGNORED: dict[str, str] = {
    "migration/": _SQL_SCHEMA,
    "test_dynamic_pickle_type.py": _SQL_SCHEMA,
    "test_schemas_shared.py": _SQL_SCHEMA,
    "test_storage_session.py": _SQL_SCHEMA,
    "test_v0_storage_event.py": _SQL_SCHEMA,
    "test_session_util.py": (
        "ADK's private helpers (_session_util: decode_model, extract_state_delta, "
        "make_json_safe_state), no session service"
    ),
    "test_vertex_ai_session_service.py": _VERTEX,
}

_SERVICE_TESTS = "test_session_service.py::"
#: Tests of test_session_service.py (name, or name[param-prefix) not run: they test one of
#: ADK's own services' internals, which ours does not have, or no service at all.
DESELECTED: dict[str, str] = {
    _SERVICE_TESTS + name: reason
    for reason, names in (
        (
            _NO_SERVICE,
            [
                "test_get_session_config_rejects_negative_num_recent_events",
                "test_session_type_decorators_opt_into_statement_cache",
                "test_dynamic_json_column_statement_is_cacheable",
            ],
        ),
        (
            _SQL_ENGINE,
            [
                "test_database_session_service_enables_pool_pre_ping_by_default",
                "test_database_session_service_uses_naive_datetime_for_dialect",
                "test_database_session_service_keeps_timezone_for_spanner",
                "test_database_session_service_respects_pool_pre_ping_override",
                "test_database_session_service_creates_read_only_engine_for_spanner",
                "test_database_session_service_creates_read_only_engine_for_other_dialects",
                "test_database_session_service_get_session_uses_read_only_factory",
                "test_database_session_service_list_sessions_uses_read_only_factory",
                "test_database_session_service_caller_owned_engine_not_disposed_on_close",
                "test_database_session_service_requires_one_argument",
                "test_database_session_service_engine_error_hides_password",
                "test_database_session_service_malformed_url_reports_usable_error",
                "test_database_session_service_visible_in_module_namespace",
            ],
        ),
        (
            _SQLITE_URL,
            [
                "test_sqlite_session_service_accepts_sqlite_urls",
                "test_sqlite_session_service_preserves_uri_query_parameters",
                "test_sqlite_session_service_accepts_absolute_sqlite_urls",
            ],
        ),
        (
            _SQL_ROWS,
            [
                "test_database_session_service_list_sessions_orders_by_update_time_then_id",
                "test_append_event_raises_if_app_state_row_missing",
                "test_append_event_raises_if_user_state_row_missing",
                "test_database_session_service_sqlite_file_timestamp_read_after_reopen",
            ],
        ),
        (
            _SQL_FAULTS,
            [
                "test_create_session_calls_rollback_on_commit_failure",
                "test_append_event_calls_rollback_on_commit_failure",
                "test_append_event_reads_storage_revision_before_commit",
                "test_create_session_reads_storage_revision_before_commit",
                "test_delete_session_calls_rollback_on_commit_failure",
                "test_service_recovers_after_multiple_failures",
                "test_concurrent_prepare_tables_no_race_condition",
                "test_prepare_tables_serializes_schema_detection_and_creation",
                "test_get_or_create_state_returns_existing_row",
                "test_get_or_create_state_creates_new_row",
                "test_get_or_create_state_handles_race_condition",
                "test_prepare_tables_idempotent_after_creation",
                "test_public_prepare_tables_eager_initialization",
                "test_append_event_locks_only_scopes_with_deltas",
            ],
        ),
        (
            _IN_MEMORY,
            [
                "test_append_event_when_session_is_same_ref_as_storage_session",
                "test_delete_session_sync_removes_only_the_targeted_users_session",
                "test_delete_session_sync_unknown_session_is_a_noop",
                "test_list_sessions_sync_strips_events_and_merges_scoped_state",
                "test_list_sessions_sync_unknown_app_or_user_returns_empty_response",
            ],
        ),
        (_VERTEX, ["test_vertex_ai_session_service_raises_not_implemented_for_get_user_state"]),
    )
    for name in names
}

#: Tests that run and fail on ours by design, marked xfail(strict=True) as ADK's own
#: conformance registry marks a backend's divergences: fixing one fails the run until
#: its entry goes.
DIFFERENCES: dict[str, str] = {
    _SERVICE_TESTS + "test_get_session_orders_tied_timestamps_by_id[True-": (
        "ADK's SQL services return a session's events ORDER BY timestamp, id; ours "
        "returns them in the order they were appended (the log's), as "
        "InMemorySessionService does, so events appended with one timestamp in reverse "
        "id order come back in append order (ADK 2.13.0's own SqliteSessionService fails "
        "this case too)"
    ),
}


class _LoopThread:
    """The servers' event loop, on a daemon thread (the tests' loops are their own)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)


_loop: _LoopThread | None = None


@contextlib.contextmanager
def _database(tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database for one test: a SQLite file, or a Postgres schema."""
    if os.environ.get("SWITCHBOARD_ADK_BACKEND", "sqlite") != "postgres":
        yield f"sqlite:///{tmp_path / 'switchboard.sqlite3'}"
        return
    schema = f"adk_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(_POSTGRES_URL)
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{_POSTGRES_URL}?options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


class _Server:
    """One test's Switchboard session server, started when the test first needs it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self._stack = contextlib.ExitStack()
        self._app: GrpcApp | None = None

    def address(self) -> str:
        global _loop
        if self._app is None:
            if _loop is None:
                _loop = _LoopThread()
            url = self._stack.enter_context(_database(self.tmp_path))
            unit = SessionUnit(DatabaseSettings(url=url), SessionLimits(watch_poll_s=0.2))
            app = GrpcApp(unit, ServerSettings(listen="127.0.0.1:0", drain_grace_s=1.0))
            _loop.run(app.start())
            self._app = app
        _used_by.add(_current_test)
        return self._app.address

    def service(self) -> SwitchboardSessionService:
        return SwitchboardSessionService(self.address())

    def stop(self) -> None:
        if self._app is not None and _loop is not None:
            _loop.run(self._app.stop())
        self._stack.close()


_current_test = ""
_current_server: _Server | None = None
#: The tests that met our service (the others test ADK's own services).
_used_by: set[str] = set()


#: ADK's services that the test module names (imported from google.adk) and builds
#: itself: under those names it gets ours. Tests reaching into the module that defines
#: one (`database_session_service.DatabaseSessionService`, to fake its engine) still
#: build ADK's own.
_STANDS_IN_FOR = ("DatabaseSessionService", "SqliteSessionService", "InMemorySessionService")


def _standing_in(name: str, server: _Server) -> type[SwitchboardSessionService]:
    class StandIn(SwitchboardSessionService):
        # ADK's constructor arguments (a database URL, a file) name a store of ADK's;
        # ours is the test's server.
        def __init__(self, *_args: Any, **_kwargs: Any) -> None:
            super().__init__(server.address())

    StandIn.__name__ = StandIn.__qualname__ = f"SwitchboardAs{name}"
    return StandIn


@pytest.fixture(autouse=True)
def _switchboard_server(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_Server]:
    global _current_test, _current_server
    server = _Server(tmp_path)
    _current_test, _current_server = request.node.nodeid, server
    if hasattr(request.module, "get_session_service"):

        def ours(*_args: Any, **_kwargs: Any) -> BaseSessionService:
            return server.service()

        monkeypatch.setattr(request.module, "get_session_service", ours)
    for name in _STANDS_IN_FOR:
        if hasattr(request.module, name):
            monkeypatch.setattr(request.module, name, _standing_in(name, server))
    try:
        yield server
    finally:
        _current_server = None
        server.stop()


@pytest.fixture(name="session_service", params=[BACKEND_NAME])
async def _session_service(
    _switchboard_server: _Server,
) -> AsyncIterator[BaseSessionService]:
    """What replaces `_conformance.session_service`: our service, one backend."""
    service = _switchboard_server.service()
    try:
        yield service
    finally:
        await service.close()


def _substitute_conformance(module_name: str) -> None:
    """Puts our backend in the conformance registry before the tests import it."""
    conformance = importlib.import_module(module_name)

    @contextlib.asynccontextmanager
    async def make(tmp_path: Path) -> AsyncIterator[BaseSessionService]:
        assert _current_server is not None
        yield _current_server.service()

    # setattr: the module is ADK's, its names unknown to the type checker
    setattr(conformance, "BACKENDS", [conformance._Backend(BACKEND_NAME, make)])  # noqa: B010
    setattr(conformance, "session_service", _session_service)  # noqa: B010


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> None:
    sibling = module_path.parent / "_conformance.py"
    if module_path.name.startswith("test_") and sibling.exists():
        # The dotted name the test module's `from ._conformance import ...` resolves to:
        # its package, up to the first folder without an __init__.py.
        parts = [sibling.stem]
        folder = sibling.parent
        while (folder / "__init__.py").exists():
            parts.insert(0, folder.name)
            folder = folder.parent
        _substitute_conformance(".".join(parts))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    """A `session_service` parametrized directly with one of ADK's services is ours."""
    given = pyfuncitem.funcargs.get("session_service")
    if (
        isinstance(given, BaseSessionService)
        and not isinstance(given, SwitchboardSessionService)
        and _current_server is not None
    ):
        pyfuncitem.funcargs["session_service"] = _current_server.service()


def _within_sessions(path: str) -> str:
    """A node id or path relative to ADK's `sessions/` folder."""
    return path.split("unittests/sessions/", 1)[-1]


def _listed(nodeid: str, listing: dict[str, str]) -> str | None:
    """The key of `listing` that names the test (a key ending inside the brackets
    names a prefix of the parameters)."""
    name = _within_sessions(nodeid)
    for key in listing:
        if name == key or name.startswith(key if "[" in key else f"{key}["):
            return key
    return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    relative = _within_sessions(collection_path.as_posix())
    if relative in IGNORED or f"{relative}/" in IGNORED:
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    matched: set[str] = set()
    for item in items:
        deselected = _listed(item.nodeid, DESELECTED)
        different = _listed(item.nodeid, DIFFERENCES)
        matched.update(key for key in (deselected, different) if key)
        if deselected:
            dropped.append(item)
            continue
        if different:
            item.add_marker(pytest.mark.xfail(strict=True, reason=DIFFERENCES[different]))
        kept.append(item)
    collected = {_within_sessions(item.nodeid).split("::")[0] for item in items}
    listed = {key for key in [*DESELECTED, *DIFFERENCES] if key.split("::")[0] in collected}
    if listed - matched:  # a renamed or removed upstream test: the lists must stay true
        raise pytest.UsageError(f"listed tests matching none: {sorted(listed - matched)}")
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Writes the tests that met our service, and the lists with their reasons, to
    SWITCHBOARD_ADK_REPORT (JSON) when set."""
    path = os.environ.get("SWITCHBOARD_ADK_REPORT")
    if path:
        report = {
            "used_our_service": sorted(_used_by),
            "ignored": IGNORED,
            "deselected": DESELECTED,
            "differences": DIFFERENCES,
        }
        Path(path).write_text(json.dumps(report, indent=1))
