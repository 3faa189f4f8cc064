"""The one place the session core is put together, for every caller alike: the
server (`app.SessionUnit`), the CLI (`switchboard session rebuild`) and the
benchmarks (`bench.seeding`).

`build_core` makes the store on a backend, the transaction runner whose write
transactions begin by taking the log's write lock, and the `Core` over them;
`build_parts` makes the rules the servicer serves, each given only the parts it
uses. Nothing else constructs a `TransactionRunner` or a `Core` for the session
service, so a runner without the log lock cannot be wired by accident.
"""

from __future__ import annotations

from dataclasses import dataclass

from session_service import pii
from session_service.agents import Agents
from session_service.audit import Audit
from session_service.continuity import Continuity
from session_service.conversations import Conversations
from session_service.core import Core, SessionLimits
from session_service.erasure import Erasures
from session_service.log_reads import LogReads
from session_service.multi_agent import MultiAgent
from session_service.retraction import Retraction
from session_service.scoped_state import ScopedState
from session_service.session_reads import SessionReads
from session_service.storage.store import SessionStore
from session_service.stored_records import StoredRecords
from session_service.time_travel import TimeTravel
from switchboard.database import Backend, DatabaseSettings
from switchboard.idempotency import SESSION_REQUESTS
from switchboard.runner import TransactionRunner

#: What appends write (the log and its head), the projections most calls update and the
#: remembered calls: health reports NOT_SERVING while a write cannot lock them.
WRITTEN_TABLES = (
    "session_log_head", "session_log", "session_session", "session_agent", SESSION_REQUESTS,
)  # fmt: skip


def build_core(
    backend: Backend,
    settings: DatabaseSettings,
    limits: SessionLimits | None = None,
    redactor: pii.Redactor | None = None,
) -> Core:
    """The session core on a migrated `backend`: its store, the runner that takes the
    log's write lock first in every write transaction, and the core over both."""
    store = SessionStore(backend)
    runner = TransactionRunner(
        backend, settings, begin_write=store.lock_log, written_tables=WRITTEN_TABLES
    )
    return Core(runner, store, limits or SessionLimits(), redactor)


@dataclass(frozen=True)
class Parts:
    """The session rules, each over the core and the other parts it uses."""

    agents: Agents
    conversations: Conversations
    reads: SessionReads
    time_travel: TimeTravel
    multi_agent: MultiAgent
    continuity: Continuity
    log_reads: LogReads
    audit: Audit
    retraction: Retraction
    scoped_state: ScopedState
    stored_records: StoredRecords
    erasures: Erasures


def build_parts(core: Core) -> Parts:
    agents = Agents(core)
    conversations = Conversations(core, agents)
    return Parts(
        agents=agents,
        conversations=conversations,
        reads=SessionReads(core),
        time_travel=TimeTravel(core),
        multi_agent=MultiAgent(core, agents, conversations),
        continuity=Continuity(core, agents, conversations),
        log_reads=LogReads(core),
        audit=Audit(core),
        retraction=Retraction(core),
        scoped_state=ScopedState(core, agents),
        stored_records=StoredRecords(core),
        erasures=Erasures(core),
    )
