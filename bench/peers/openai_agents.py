"""The OpenAI Agents SDK's `SQLiteSession.add_items`, in process, 1 and 8 clients.

Each client is a conversation of its own (its own `SQLiteSession`, one file for
all), adding one user item of the benchmark's message per call; the SDK commits
every call. The session is thread-safe: it runs each call in a worker thread
(`asyncio.to_thread`) with a connection per thread and serialises writers to one
file with a lock, so 8 clients are 8 coroutines over a pool of 8 threads (the
default pool has only cpu_count + 4). Storage: the SDK sets WAL; synchronous is
SQLite's default (the SDK offers no hook), read back on a fresh connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

from bench.peers.common import PeerResult, sqlite_settings, timed_async, user_message

CLIENTS = (1, 8)


async def _add_items(path: Path, clients: int, seconds: float, warmup_s: float) -> Any:
    from agents import SQLiteSession

    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=clients))
    sessions = [SQLiteSession(f"conversation-{clients}-{n}", path) for n in range(clients)]

    async def add(worker: int, i: int) -> None:
        await sessions[worker].add_items([{"role": "user", "content": user_message(i, worker)}])

    try:
        return await timed_async("OpenAI Agents SQLiteSession", add, clients, seconds, warmup_s)
    finally:
        for session in sessions:
            session.close()


def measure(directory: Path, seconds: float, warmup_s: float) -> list[PeerResult]:
    results: list[PeerResult] = []
    for clients in CLIENTS:
        path = directory / f"openai-agents-{clients}.sqlite3"
        measurement = asyncio.run(_add_items(path, clients, seconds, warmup_s))
        with closing(sqlite3.connect(path)) as connection:
            settings = sqlite_settings(connection) + " (synchronous: SQLite's default)"
        results.append(
            PeerResult(
                f"openai-agents-add-items-{clients}",
                f"OpenAI Agents SQLiteSession.add_items, {clients} client{'s' * (clients > 1)}",
                "rate",
                measurement,
                settings=settings,
            )
        )
    return results
