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

    def service(self) -> SwitchboardSessionService:
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
        return SwitchboardSessionService(self._app.address)

    def stop(self) -> None:
        if self._app is not None and _loop is not None:
            _loop.run(self._app.stop())
        self._stack.close()


_current_test = ""
_current_server: _Server | None = None
#: The tests that met our service (the others test ADK's own services).
_used_by: set[str] = set()


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("SWITCHBOARD_ADK_REPORT")
    if path:
        Path(path).write_text(json.dumps({"used_our_service": sorted(_used_by)}, indent=1))
