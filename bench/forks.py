"""ForkSession against the history's length: what a fork writes and costs, and what
reading a fork costs beside reading its parent.

    .venv/bin/python -m bench.forks [--quick]

Against a `switchboard serve session` process (`bench.servers`; SQLite FULL, then
Postgres in a fresh schema when it answers): one session holding 100 / 1,000
(/ 10,000 without --quick) messages of `MESSAGE_BYTES`, then
- ForkSession, median of `FORKS` forks, and the log bytes each fork adds (read from
  the database: the payloads' total length before and after);
- beside it, as the same run's baseline, what a fork that copies the history costs:
  the same messages appended to a fresh session (what forks wrote before lineage);
- GetHistory, the newest page of 100, median of `READS` reads, of the parent and of a
  fork of it (ratio fork/parent: a fork reads its parent's rows in the same statements).

Tables on stdout, progress on stderr, results in bench/results/forks.json.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from bench import servers
from bench.harness import RESULTS_DIR, log
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc

MESSAGE_BYTES = 1000
FORKS = 10
READS = 20
BATCH = 100
RESULTS = RESULTS_DIR / "forks.json"


def _message(n: int) -> pb.SessionEventInput:
    content = f"message {n} " + "x" * (MESSAGE_BYTES - 16)
    message = pb.Message(role=pb.ROLE_USER, content=content)
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))


def _fill(stub: pb_grpc.SessionServiceStub, session_id: str, messages: int) -> float:
    """Appends `messages` messages in batches; returns the seconds it took."""
    started = time.perf_counter()
    for first in range(0, messages, BATCH):
        batch = [_message(n) for n in range(first, min(first + BATCH, messages))]
        request = pb.AppendEventsRequest(
            agent="bench", session_id=session_id, events=batch, sequences_only=True
        )
        stub.AppendEvents(request)
    return time.perf_counter() - started


def _median_ms(call: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


class LogBytes:
    """The log's payload bytes, read straight from the server's database."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self) -> int:
        sql = "SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM session_log"
        if self.url.startswith("sqlite"):
            path = self.url.split("///", 1)[1]
            with sqlite3.connect(path) as connection:
                return int(connection.execute(sql).fetchone()[0])
        import psycopg2

        with psycopg2.connect(self.url) as connection, connection.cursor() as cursor:
            cursor.execute(sql)
            row = cursor.fetchone()
            return int(row[0]) if row else 0


def point(stub: pb_grpc.SessionServiceStub, log_bytes: LogBytes, messages: int) -> dict[str, Any]:
    parent = stub.SpawnSession(pb.SpawnSessionRequest(agent="bench")).session.session_id
    _fill(stub, parent, messages)
    fork_request = pb.ForkSessionRequest(agent="bench", session_id=parent)
    before = log_bytes()
    fork_ms = _median_ms(lambda: stub.ForkSession(fork_request), FORKS)
    written = (log_bytes() - before) / FORKS
    copy = stub.SpawnSession(pb.SpawnSessionRequest(agent="bench")).session.session_id
    copy_ms = _fill(stub, copy, messages) * 1000
    fork = stub.ForkSession(fork_request).session.session_id

    def newest_page(session_id: str) -> Callable[[], Any]:
        request = pb.GetHistoryRequest(agent="bench", session_id=session_id, limit=100, newest=True)
        return lambda: stub.GetHistory(request)

    parent_read = _median_ms(newest_page(parent), READS)
    fork_read = _median_ms(newest_page(fork), READS)
    return {
        "messages": messages,
        "fork_ms": fork_ms,
        "fork_bytes_written": written,
        "copying_fork_ms": copy_ms,
        "copying_fork_bytes": messages * MESSAGE_BYTES,
        "fork_over_copy": fork_ms / copy_ms,
        "parent_history_ms": parent_read,
        "fork_history_ms": fork_read,
        "fork_read_ratio": fork_read / parent_read,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    lengths = [100, 1000] if quick else [100, 1000, 10_000]
    results = []
    for backend in ("sqlite", "postgres"):
        with servers.temp_dir("bench-forks-") as data_dir, _database(backend, data_dir) as url:
            if url is None:
                continue
            with servers.running_server(url, data_dir, service="session") as process:
                channel = grpc.insecure_channel(process.address)
                stub = pb_grpc.SessionServiceStub(channel)
                stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="bench")))
                for messages in lengths:
                    log(f"{backend}: {messages} messages")
                    results.append({"backend": backend, **point(stub, LogBytes(url), messages)})
                channel.close()
    return results


@contextmanager
def _database(backend: str, data_dir: Any) -> Iterator[str | None]:
    if backend == "sqlite":
        yield f"sqlite:///{data_dir}/session.sqlite3"
        return
    reason = servers.postgres_unreachable_reason()
    if reason is not None:
        log(f"postgres skipped: {reason}")
        yield None
        return
    with servers.postgres_schema() as url:
        yield url


def report(results: list[dict[str, Any]]) -> None:
    print(
        f"{'backend':9} {'messages':>8} {'fork ms':>8} {'bytes/fork':>10} {'copy ms':>9} "
        f"{'fork/copy':>9} {'parent read':>11} {'fork read':>9} {'ratio':>6}"
    )
    for r in results:
        print(
            f"{r['backend']:9} {r['messages']:>8} {r['fork_ms']:>8.2f} "
            f"{r['fork_bytes_written']:>10.0f} {r['copying_fork_ms']:>9.1f} "
            f"{r['fork_over_copy']:>9.4f} {r['parent_history_ms']:>10.2f}  "
            f"{r['fork_history_ms']:>9.2f} {r['fork_read_ratio']:>6.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 messages only")
    args = parser.parse_args(argv)
    results = run(args.quick)
    report(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
