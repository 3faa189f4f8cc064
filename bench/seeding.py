"""Seeds written through the services' own write paths, batched, never raw SQL; and the
wiring of the services' cores the seeds and the in-process sections need.

The wiring is the functions under "wiring" and nothing else: the session core and its
rules come from the service's composition root (`session_service.composition`, through
`SessionUnit`), the ledger from `DeliveryUnit`, as the servers build them.

- Session logs: sessions opened by `Conversations.open_session`, events appended by
  `Core.log` (the write path every append takes: sequences, projections, summaries and
  snapshots as appends leave them), up to `TRANSACTION_EVENTS` per write transaction.
- Ledger rows: a gateway instance registered and deregistered through the `Ledger`,
  rows inserted by the ledger store's own `insert_if_live`, `CHUNK` per transaction.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from bench.workloads import CRASHED_GATEWAY
from delivery_service.app import DeliveryUnit
from delivery_service.records import NewObligation
from session_service import convert, records, routing
from session_service.app import SessionUnit
from session_service.composition import Parts, build_parts
from session_service.conversations import new_session_id
from session_service.core import Core
from switchboard.database import DatabaseSettings, SqliteSync
from switchboard.session.v1 import session_service_pb2 as pb

#: Events per write transaction when seeding a log.
TRANSACTION_EVENTS = 50_000
#: Ledger rows per write transaction when seeding orphans.
CHUNK = 10_000
#: Conversations the orphans are spread over (as in the race tests).
ORPHAN_CONVERSATIONS = 97


# -- wiring -------------------------------------------------------------------------------------


@contextmanager
def session_unit(url: str) -> Iterator[SessionUnit]:
    """The session core on `url`, wired as the server wires it (migrated, verified)."""
    unit = SessionUnit(DatabaseSettings(url=url))
    try:
        yield unit
    finally:
        unit.close()


def parts(core: Core) -> Parts:
    """The session rules over `core`, as the servicer serves them."""
    return build_parts(core)


@contextmanager
def delivery_unit(url: str, sync: SqliteSync = "FULL") -> Iterator[DeliveryUnit]:
    """The ledger on `url`, wired as the server wires it (migrated)."""
    unit = DeliveryUnit(DatabaseSettings(url=url, sqlite_synchronous=sync))
    try:
        yield unit
    finally:
        unit.close()


# -- session logs -------------------------------------------------------------------------------


def open_sessions(core: Core, agent: str, count: int) -> list[str]:
    """Creates `agent` and opens `count` sessions of it (web, tab-N); their ids."""
    rules = parts(core)
    asyncio.run(rules.agents.create_agent(records.Agent(name=agent)))
    talk = rules.conversations

    def op(now: float) -> list[str]:
        opened = []
        for n in range(count):
            source = records.Source(transport="web", conversation_id=f"tab-{n}")
            key = routing.routing_key(agent, source, None)
            opened.append(talk.open_session(now, agent, new_session_id(), key, source).session_id)
        return opened

    return core.runner.submit_write(op).result()


def message(text: str) -> pb.Event:
    event = pb.Event()
    event.message_appended.message.role = pb.ROLE_USER
    event.message_appended.message.content = text
    return event


def temp_state(value: str) -> pb.Event:
    event = pb.Event()
    event.temp_state_changed.set["last"] = value
    return event


#: The body of a session's event number `i` (from 0), as a protobuf Event.
Body = Callable[[int], pb.Event]


def seed_events(
    core: Core, session_ids: Sequence[str], per_session: int, body: Body, batch: int = 1000
) -> None:
    """`per_session` events into each session, `batch` per `Core.log` call, round robin
    over the sessions, `TRANSACTION_EVENTS` per write transaction."""
    chunks = [
        (session_id, first, min(batch, per_session - first))
        for first in range(0, per_session, batch)
        for session_id in session_ids
    ]
    per_transaction = max(1, TRANSACTION_EVENTS // batch)
    for start in range(0, len(chunks), per_transaction):
        logging = functools.partial(
            _log_chunks, core, chunks[start : start + per_transaction], body
        )
        core.runner.submit_write(logging).result()


def _log_chunks(core: Core, chunks: Sequence[tuple[str, int, int]], body: Body, now: float) -> None:
    for session_id, first, count in chunks:
        index = core.store.projections.session_index(session_id)
        assert index is not None, f"no session {session_id}"
        events = []
        for offset in range(count):
            event = body(first + offset)
            event.agent, event.session_id = index.agent, session_id
            event.session_version = index.version + offset + 1
            events.append(convert.event(event))
        core.log(now, events, index)


def log_head(core: Core) -> int:
    """The newest sequence of the log."""
    return int(core.runner.submit_write(lambda _now: core.store.log.head()).result())


def analyze(core: Core) -> None:
    """On Postgres, what autovacuum does soon after a bulk load: without statistics the
    planner does not know the seeded rows."""
    if core.store.backend.name == "postgres":
        core.runner.submit_write(lambda _now: core.store.database.execute_sql("ANALYZE")).result()


# -- ledger rows --------------------------------------------------------------------------------


def orphan(i: int) -> NewObligation:
    """Obligation number `i` of the dead instance: a Slack DM reply."""
    user = f"U{i % ORPHAN_CONVERSATIONS}"
    return NewObligation(
        session_key=f"agent:main:slack:dm:{user}",
        message_ref=f"m{i}",
        content=f"reply {i}",
        platform="slack",
        chat_id=user,
    )


def seed_orphans(url: str, sync: SqliteSync, count: int) -> float:
    """`count` PENDING rows owned by an instance of CRASHED_GATEWAY that then deregisters,
    which ends its lease: every row is recoverable, as after a gateway with a deep backlog
    died. Returns the seconds it took."""
    started = time.perf_counter()
    with delivery_unit(url, sync) as unit:
        ledger = unit.ledger
        instance = asyncio.run(
            ledger.register_instance(CRASHED_GATEWAY, "bench", os.getpid(), ["slack"], 3600.0)
        )

        def insert(first: int, now: float) -> int:
            rows = range(first, min(first + CHUNK, count))
            inserted = [unit.store.insert_if_live(now, orphan(i), instance.id) for i in rows]
            return sum(row is not None for row in inserted)

        seeded = sum(
            unit.runner.submit_write(functools.partial(insert, first)).result()
            for first in range(0, count, CHUNK)
        )
        if seeded != count:
            raise RuntimeError(f"{seeded:,} orphans seeded, {count:,} expected")
        asyncio.run(ledger.deregister(instance.id))
        database: Any = unit.store.backend.database
        if unit.store.backend.name == "postgres":  # as `analyze` does for the log
            unit.runner.submit_write(lambda _now: database.execute_sql("ANALYZE")).result()
    return time.perf_counter() - started
