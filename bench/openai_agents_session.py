"""The section `openai-agents`: the OpenAI Agents SDK adapter (`SwitchboardSession`)
beside the SDK's default store (`SQLiteSession`), in one run, on the same payload.

Two operations, each at 1 and 8 concurrent clients (a client is a conversation of its
own, on a pool of as many worker threads as clients, as `bench.peers.openai_agents`
runs the SDK): `add_items` of one user item of the benchmark's message, and
`get_items` of a whole conversation of `HISTORY` such items. `SQLiteSession` is one
file in process (the SDK's WAL, SQLite's default synchronous); `SwitchboardSession`
calls a session server on each selected backend over gRPC, through one `SessionClient`
that the sessions share (as the docs' example passes one client to its sessions).
Figures are operations per second and the ratio to `SQLiteSession`; the issue's line is
"no slower than the in-process default by more than 2x at 8 clients". Under the table,
a no-op RPC's rate on each server at each client count (`bench.noop`) and its ratio to
`SQLiteSession`: the best any networked store could reach.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from switchboard_client.session import SessionClient

from bench import noop, servers
from bench.peers.common import timed_async, user_message
from bench.plan import Context, Section
from bench.report import table
from bench.stats import Measurement

CLIENTS = (1, 8)
HISTORY = 100
OPERATIONS = ("add_items", "get_items")
AGENT = "bench"

#: Builds `clients` sessions (conversations) for an operation.
SessionFactory = Callable[[str, int], list[Any]]


def _item(i: int, worker: int) -> dict[str, str]:
    return {"role": "user", "content": user_message(i, worker)}


async def _measure(
    label: str, make: SessionFactory, operation: str, clients: int, ctx: Context
) -> Measurement:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=clients))
    sessions = make(operation, clients)
    if operation == "get_items":
        for worker, session in enumerate(sessions):
            await session.add_items([_item(i, worker) for i in range(HISTORY)])

    async def add(worker: int, i: int) -> None:
        await sessions[worker].add_items([_item(i, worker)])

    async def get(worker: int, i: int) -> None:
        items = await sessions[worker].get_items()
        assert len(items) == HISTORY, len(items)

    call = add if operation == "add_items" else get
    try:
        scale = ctx.scale
        return await timed_async(
            f"{label} {operation}", call, clients, scale.seconds, scale.warmup_s
        )
    finally:
        for session in sessions:
            session.close()


def _sqlite_sessions(path: Path) -> SessionFactory:
    def make(operation: str, clients: int) -> list[Any]:
        from agents import SQLiteSession

        return [SQLiteSession(f"{operation}-{clients}-{n}", path) for n in range(clients)]

    return make


def _switchboard_sessions(address: str, stack: ExitStack) -> SessionFactory:
    def make(operation: str, clients: int) -> list[Any]:
        from switchboard_client.frameworks.openai_agents import SwitchboardSession

        # One client for the process's sessions, as the docs show: concurrent writes
        # then share its channel and travel over one CallStream.
        client = stack.enter_context(SessionClient(address))
        return [
            SwitchboardSession(f"{operation}-{clients}-{n}", client, agent=AGENT)
            for n in range(clients)
        ]

    return make


def _side(label: str, make: SessionFactory, ctx: Context) -> dict[tuple[str, int], Measurement]:
    figures = {}
    for operation in OPERATIONS:
        for clients in CLIENTS:
            ctx.say(f"openai-agents: {label} {operation}, {clients} client(s)")
            figures[operation, clients] = asyncio.run(
                _measure(label, make, operation, clients, ctx)
            )
    return figures


def run(ctx: Context) -> Section:
    sides: dict[str, dict[tuple[str, int], Measurement]] = {}
    noops: dict[str, list[Measurement]] = {}
    with servers.temp_dir("bench-openai-agents-") as directory:
        sides["SQLiteSession"] = _side(
            "SQLiteSession", _sqlite_sessions(directory / "sdk.sqlite3"), ctx
        )
        for backend in ctx.backends:
            with servers.serving("session", backend) as server, ExitStack() as stack:
                with SessionClient(server.address) as client:
                    client.create_agent(AGENT)
                make = _switchboard_sessions(server.address, stack)
                sides[f"Switchboard {backend.label}"] = _side(backend.label, make, ctx)
                noops[backend.label] = _noops(server.address, ctx)
    data = {label: [m.to_json() for m in figures.values()] for label, figures in sides.items()}
    data["no-op"] = [
        m.to_json() | {"server": label} for label, found in noops.items() for m in found
    ]
    return Section(
        "openai-agents",
        "OpenAI Agents SDK: SwitchboardSession vs SQLiteSession (same run, same items)",
        _render(sides, noops),
        data,
    )


def _noops(address: str, ctx: Context) -> list[Measurement]:
    """The no-op RPC at each client count, on the server the adapter just used."""
    found = []
    for clients in CLIENTS:
        ctx.say(f"openai-agents: {noop.NAME}, {clients} client(s)")
        found.append(noop.health_checks(address, clients, ctx.scale.seconds, ctx.scale.warmup_s))
    return found


def _render(
    sides: dict[str, dict[tuple[str, int], Measurement]], noops: dict[str, list[Measurement]]
) -> str:
    baseline = sides["SQLiteSession"]
    labels: Sequence[str] = list(sides)
    rows = []
    for operation in OPERATIONS:
        for clients in CLIENTS:
            base = baseline[operation, clients].cycles_per_s
            cells = [f"{operation}, {clients} client{'s' * (clients > 1)}"]
            for label in labels:
                rate = sides[label][operation, clients].cycles_per_s
                ratio = "" if label == "SQLiteSession" else f" ({rate / base:.2f}x)" if base else ""
                cells.append(f"{rate:,.0f}/s{ratio}")
            rows.append([*cells, ""])
    note = (
        f"get_items reads a whole conversation of {HISTORY} items; ratios are to "
        "SQLiteSession (in process) in the same run"
    )
    lines = [
        noop.perspective(
            found,
            server,
            [
                (f"SQLiteSession {op}", baseline[op, found.clients].cycles_per_s)
                for op in OPERATIONS
            ],
        )
        for server, measured in noops.items()
        for found in measured
    ]
    return "\n".join([table(["operation", *labels, ""], rows, note), *lines])
