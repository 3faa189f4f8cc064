"""What the chaos tests share: the round count, seeds, bounded waiting, server
processes that may run under a skewed clock, and direct reads of the database
(the oracle the services are checked against).

`SWITCHBOARD_CHAOS_ROUNDS` sets how many kill (or race) rounds every test runs;
the default keeps the whole suite within a few minutes on a 2-core machine.
`SWITCHBOARD_CHAOS_SEED` replays a failing run: every test prints its seed.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psycopg2
import pytest

from session_service import convert, storage_format
from switchboard.session.v1 import session_service_pb2 as spb
from tests.harness import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = max(1, int(os.environ.get("SWITCHBOARD_CHAOS_ROUNDS", "2")))
#: A deadline for each chaos test that grows with the rounds (the suite's default is 300 s).
DEADLINE = pytest.mark.timeout(120 + 20 * ROUNDS)
T = TypeVar("T")


def seeded(name: str) -> random.Random:
    """A random source for one test; the seed is printed (shown when the test fails)."""
    seed = int(os.environ.get("SWITCHBOARD_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"{name}: SWITCHBOARD_CHAOS_SEED={seed} SWITCHBOARD_CHAOS_ROUNDS={ROUNDS}")
    return random.Random(seed)


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.05) -> T:
    """Polls until `condition()` is truthy; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


def join_all(threads: Sequence[threading.Thread], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [thread.name for thread in threads if thread.is_alive()]
    assert not stuck, f"threads still running after {timeout_s:g} s: {stuck}"


def rpc_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    return error.code() if isinstance(error, grpc.Call) else None


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:///")


# -- server processes ------------------------------------------------------------------------


class Processes:
    """Every server and child process a test starts; all are killed at teardown."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.servers: list[ServerProcess] = []
        self.children: list[subprocess.Popen[str]] = []

    def server(
        self, url: str, *extra: str, service: str = "delivery", env: dict[str, str] | None = None
    ) -> ServerProcess:
        """Starts `switchboard serve SERVICE` on `url`; returns it (address in `.address`)."""
        server = ServerProcess(url, self.data_dir, *extra, service=service, env=env)
        self.servers.append(server)
        server.start()
        return server

    def close(self) -> None:
        for server in self.servers:
            server.stop_quietly()
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)


@contextmanager
def channel_to(address: str) -> Iterator[grpc.Channel]:
    channel = grpc.insecure_channel(address)
    try:
        yield channel
    finally:
        channel.close()


# -- the database, read directly ---------------------------------------------------------------


def sql(url: str, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Runs one read-only query on the test's database (`?` placeholders)."""
    if is_sqlite(url):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)) as database:
            return database.execute(query, params).fetchall()
    connection = psycopg2.connect(url)
    try:
        with connection.cursor() as cursor:
            cursor.execute(query.replace("?", "%s"), params)
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows
    finally:
        connection.close()


def sqlite_integrity(url: str) -> str:
    [(verdict,)] = sql(url, "PRAGMA integrity_check")
    return str(verdict)


def session_log(url: str) -> tuple[int, list[spb.Event]]:
    """The log head counter and every logged event, in sequence order."""
    [(head,)] = sql(url, "SELECT seq FROM session_log_head WHERE id = 1")
    rows = sql(url, "SELECT seq, kind, format, payload FROM session_log ORDER BY seq")
    events = []
    for seq, kind, fmt, payload in rows:
        event = convert.event_pb(storage_format.decode_event(int(fmt), payload))
        assert (event.sequence, event.WhichOneof("body")) == (seq, kind), f"row {seq} vs payload"
        events.append(event)
    return int(head), events


def assert_gap_free(head: int, events: Sequence[spb.Event]) -> None:
    """Sequences are exactly 1..head: no gap, no duplicate (rewind records take a
    sequence of their own, so they are part of the run too)."""
    sequences = [event.sequence for event in events]
    assert len(sequences) == len(set(sequences)), "a sequence is logged twice"
    if sequences != list(range(1, head + 1)):
        missing = sorted(set(range(1, head + 1)) - set(sequences))
        beyond = sorted(s for s in sequences if s > head)
        raise AssertionError(
            f"the log is not 1..{head}: {len(missing)} missing (first {missing[:10]}), "
            f"beyond the head: {beyond[:10]}"
        )
