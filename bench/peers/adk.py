"""Google ADK's session services on SQLite, in process: `append_event`, and `get_session`
of a session of 1,000 events (the load-for-next-turn goal's peer).

Two services: `DatabaseSessionService` (SQLAlchemy on aiosqlite) and
`SqliteSessionService` (aiosqlite directly, opening a connection per call). Each
writes one user event of the benchmark's message per `append_event`, one client,
on the session it created; ADK commits every append. Storage settings are ADK's
own (rollback journal); DatabaseSessionService gets `PRAGMA synchronous=FULL` on
each connection through a SQLAlchemy connect hook (FULL is also SQLite's default,
which SqliteSessionService keeps; it offers no hook). What each ran with is read
back from the database file and reported.
"""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

from bench.peers.common import PeerResult, sqlite_settings, timed_async, timed_reads, user_message

#: Events in the session `get_session` loads (the goal's 1,000).
GET_SESSION_EVENTS = 1000
APP = "bench"
USER = "bench-user"


def _event(i: int) -> Any:
    from google.adk.events import Event
    from google.genai import types

    return Event(
        invocation_id=f"inv-{i}",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=user_message(i))]),
    )


def _database_service(path: Path) -> Any:
    from google.adk.sessions import DatabaseSessionService
    from sqlalchemy import event

    service = DatabaseSessionService(db_url=f"sqlite+aiosqlite:///{path}")

    def full_sync(dbapi_connection: Any, _record: object) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    event.listen(service.db_engine.sync_engine, "connect", full_sync)
    return service


def _sqlite_service(path: Path) -> Any:
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    return SqliteSessionService(db_path=str(path))


SERVICES = {
    "database": ("DatabaseSessionService", _database_service),
    "sqlite": ("SqliteSessionService", _sqlite_service),
}


async def _appends(service: Any, name: str, seconds: float, warmup_s: float) -> Any:
    session = await service.create_session(app_name=APP, user_id=USER)

    async def append(_worker: int, i: int) -> None:
        await service.append_event(session, _event(i))

    return await timed_async(name, append, 1, seconds, warmup_s)


async def _get_session(service: Any, name: str, repetitions: int, warmup: int) -> Any:
    session = await service.create_session(app_name=APP, user_id=USER)
    for i in range(GET_SESSION_EVENTS):
        await service.append_event(session, _event(i))

    async def load() -> None:
        loaded = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        if loaded is None or len(loaded.events) != GET_SESSION_EVENTS:
            raise RuntimeError(f"ADK {name} returned {loaded and len(loaded.events)} events")

    return await timed_reads(name, load, repetitions, warmup)


async def measure_service(
    which: str, directory: Path, seconds: float, warmup_s: float, repetitions: int
) -> list[PeerResult]:
    """The append rate and the 1,000-event get_session latency of one ADK service."""
    label, make = SERVICES[which]
    path = directory / f"adk-{which}-{uuid.uuid4().hex[:8]}.sqlite3"
    service = make(path)
    try:
        appends = await _appends(service, f"ADK {label}", seconds, warmup_s)
        loads = await _get_session(
            service, f"ADK {label} get_session", repetitions, max(2, repetitions // 10)
        )
    finally:
        close = getattr(service, "close", None)
        if close is not None:
            await close()
    with closing(sqlite3.connect(path)) as connection:
        settings = sqlite_settings(connection)
    if which == "database":
        settings += " (synchronous set per connection by a connect hook)"
    else:
        settings += " (SQLite's defaults, read on a fresh connection; the service offers no hook)"
    return [
        PeerResult(
            f"adk-{which}-append",
            f"ADK {label}.append_event",
            "rate",
            appends,
            settings=settings,
        ),
        PeerResult(
            f"adk-{which}-get-session",
            f"ADK {label}.get_session @{GET_SESSION_EVENTS:,}",
            "latency",
            loads,
            settings=settings,
            extra={"events": GET_SESSION_EVENTS},
        ),
    ]
