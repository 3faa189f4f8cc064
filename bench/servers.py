"""The servers the benchmarks load, on the databases they need: started as an operator
starts them, always stopped.

A server is `python -m switchboard_cli serve delivery|session` in a process of its own,
started by the tests' own launcher (`tests.harness.ServerProcess`), on a SQLite file
in a temporary directory or in a fresh Postgres schema dropped afterwards. Nothing
here touches the server's code.
"""

from __future__ import annotations

import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg2

from switchboard.database import SqliteSync
from tests.harness import POSTGRES_URL, ServerProcess, postgres_schema, postgres_unreachable_reason

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Lines of a server's output kept once it listens (its access log is a line per call).
KEPT_OUTPUT_LINES = 200

__all__ = [
    "BACKENDS",
    "POSTGRES_URL",
    "REPO_ROOT",
    "Backend",
    "ServerProcess",
    "database",
    "machine_info",
    "postgres_schema",
    "postgres_unreachable_reason",
    "serving",
    "started",
    "temp_dir",
]


@dataclass(frozen=True)
class Backend:
    """A database configuration the benchmarks run on."""

    key: str
    label: str
    #: SQLite's synchronous setting; Postgres is compared with the FULL floors.
    sqlite_sync: SqliteSync = "FULL"

    @property
    def postgres(self) -> bool:
        return self.key == "postgres"


BACKENDS = (
    Backend("sqlite-full", "SQLite FULL"),
    Backend("sqlite-normal", "SQLite NORMAL", "NORMAL"),
    Backend("postgres", "Postgres"),
)


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def database(backend: Backend, directory: Path) -> Iterator[str]:
    """The URL of a fresh database of `backend`: a file in `directory`, or a new schema."""
    if backend.postgres:
        with postgres_schema() as url:
            yield url
    else:
        yield f"sqlite:///{directory / 'switchboard.sqlite3'}"


@contextmanager
def started(
    service: str,
    url: str,
    data_dir: Path,
    sync: SqliteSync = "FULL",
    extra: Sequence[str] = (),
    code_root: Path | None = None,
    command_prefix: Sequence[str] = (),
    start_timeout_s: float = 30.0,
) -> Iterator[ServerProcess]:
    """`switchboard serve SERVICE` on `url`, listening on a port the OS picked; stopped
    with SIGTERM (its drain), killed if it does not exit. `code_root`: another tree's
    server code (`bench.against`); `command_prefix`: a program that execs the server
    (valgrind)."""
    server = ServerProcess(
        url,
        data_dir,
        "--sqlite-synchronous",
        sync,
        *extra,
        service=service,
        code_root=code_root,
        command_prefix=command_prefix,
        keep_lines=KEPT_OUTPUT_LINES,
    )
    try:
        server.start(start_timeout_s)
        yield server
    finally:
        try:
            server.terminate()
        except (subprocess.TimeoutExpired, AssertionError):
            server.stop_quietly()


@contextmanager
def serving(service: str, backend: Backend, *extra: str, **options: Any) -> Iterator[ServerProcess]:
    """A server of `service` on a fresh database of `backend` (see `started`)."""
    with (
        temp_dir(f"bench-{service}-{backend.key}-") as data_dir,
        database(backend, data_dir) as url,
        started(service, url, data_dir, backend.sqlite_sync, extra, **options) as server,
    ):
        yield server


def postgres_version() -> str:
    connection = psycopg2.connect(POSTGRES_URL, connect_timeout=3)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            row = cursor.fetchone()
            return str(row[0]) if row else "?"
    finally:
        connection.close()


def machine_info() -> dict[str, Any]:
    """What the figures depend on besides the code: cores, versions, load."""
    cpu_model = ""
    with suppress(OSError, StopIteration):
        cpu_model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "grpcio": grpc.__version__,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
