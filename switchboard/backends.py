"""The database backends, by the URL scheme that selects each, and `open_backend`.

The one module that imports every backend: `database.py` holds what they share (the
`Backend` interface, settings, statement counting) and imports none of them, so no
import runs in a circle and none hides inside a function. A new backend is a module
implementing `Backend` and one line in `BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable

from switchboard.database import Backend, DatabaseSettings
from switchboard.postgres_backend import PostgresBackend
from switchboard.sqlite_backend import SqliteBackend

#: URL prefix -> the backend for a URL of that prefix (given the URL and the settings).
BACKENDS: dict[str, Callable[[str, DatabaseSettings], Backend]] = {
    "sqlite:///": lambda url, settings: SqliteBackend(
        url.removeprefix("sqlite:///") or ":memory:", settings
    ),
    "postgresql://": PostgresBackend,
    "postgres://": PostgresBackend,
}


def open_backend(settings: DatabaseSettings) -> Backend:
    for prefix, backend in BACKENDS.items():
        if settings.url.startswith(prefix):
            return backend(settings.url, settings)
    raise ValueError(
        f"unsupported database URL {settings.url!r}: use sqlite:///PATH or "
        "postgresql://USER@HOST:PORT/DB"
    )
