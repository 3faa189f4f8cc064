"""Plain records the ledger hands out: obligations and gateway instances."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from delivery_service.state_machine import State

#: What an obligation takes in an answer beyond its content, metadata and error
#: (ids, chat, times, ...), generously: sizes only bound how many rows one answer holds.
ROW_OVERHEAD_BYTES = 2048


def compute_obligation_id(session_key: str, message_ref: str, content: str) -> str:
    """Stable id: the same reply to the same turn records once; distinct
    sessions, threads, turns or texts never collide."""
    payload = f"{session_key}|{message_ref}|{content}"
    return hashlib.sha256(payload.encode("utf-8", "replace")).hexdigest()[:24]


#: `agent:<name>:...`, with the SessionService's agent-name syntax (1-63 of a-z, 0-9,
#: "-", "_"): the routing keys it hands out start so.
_AGENT_KEY = re.compile(r"agent:([a-z0-9][a-z0-9_-]{0,62}):")


def agent_of(session_key: str) -> str:
    """The agent a session key `agent:<name>:...` belongs to; "" for any other key
    (no agent's token may record or read such a row; admins may)."""
    match = _AGENT_KEY.match(session_key)
    return match.group(1) if match else ""


@dataclass(frozen=True)
class Caller:
    """Who calls, as the rules need it (built by the servicer from the call's grant).

    `agents` None is an unrestricted caller: an admin token, or authentication
    off. Otherwise the caller acts for those agents only, through instances it
    registered itself (`principal`), and a gateway token (`gateway` set) may
    register under that one gateway name.
    """

    principal: str = ""
    agents: frozenset[str] | None = None
    gateway: str = ""

    @property
    def unrestricted(self) -> bool:
        return self.agents is None

    def may_act_for(self, agent: str) -> bool:
        return self.agents is None or agent in self.agents

    def owns(self, instance: Instance) -> bool:
        """Whether the caller may name this instance (it registered it, or is unrestricted)."""
        return self.agents is None or instance.principal == self.principal


#: Admin and authentication off: every row, every instance.
UNRESTRICTED = Caller()


@dataclass(frozen=True)
class Holder:
    """Who may move a row: the owning instance and the fence it was handed."""

    instance_id: str
    fence: int


@dataclass(frozen=True)
class NewObligation:
    session_key: str
    message_ref: str
    content: str
    platform: str
    chat_id: str
    thread_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    #: The reply target sealed by the gateway, in place of chat_id and thread_id.
    sealed_target: bytes = b""

    @property
    def id(self) -> str:
        return compute_obligation_id(self.session_key, self.message_ref, self.content)

    @property
    def agent(self) -> str:
        return agent_of(self.session_key)


@dataclass(frozen=True)
class Obligation:
    id: str
    session_key: str
    message_ref: str
    content: str
    platform: str
    chat_id: str
    thread_id: str
    metadata: dict[str, str]
    state: State
    owner_instance_id: str | None
    fence: int
    attempts: int
    needs_marker: bool
    platform_message_id: str
    last_error: str
    created_at: float
    updated_at: float
    next_attempt_at: float | None
    delivered_at: float | None
    #: The agent of `session_key` ("" for a key that is not `agent:<name>:...`).
    agent: str = ""
    #: The gateway (bot account) whose instances may claim the row; "" for any
    #: (rows recorded before rows remembered their gateway).
    gateway_name: str = ""
    #: The reply target sealed by the recording gateway (b"": chat_id says it).
    sealed_target: bytes = b""

    def answer_bytes(self) -> int:
        """About what the row takes in an answer: its longest texts and a fixed rest
        (which covers a sealed target, at most 1 KiB)."""
        texts = (self.content, self.last_error, *self.metadata.keys(), *self.metadata.values())
        return ROW_OVERHEAD_BYTES + sum(len(text.encode()) for text in texts)


@dataclass(frozen=True)
class Instance:
    id: str
    gateway_name: str
    host: str
    pid: int
    platforms: tuple[str, ...]
    registered_at: float
    heartbeat_at: float
    lease_expires_at: float
    deregistered_at: float | None
    #: The principal of the grant that registered it ("" with authentication off).
    principal: str = ""

    def live_at(self, now: float) -> bool:
        return self.deregistered_at is None and self.lease_expires_at > now


@dataclass(frozen=True)
class ClaimResult:
    obligations: list[Obligation]
    abandoned_count: int
    gated_count: int


@dataclass(frozen=True)
class LedgerStats:
    state_counts: dict[State, int]
    oldest_pending_age_s: float
    in_doubt_count: int
    gated_by_platform: dict[str, int]
    live_instance_count: int


@dataclass(frozen=True)
class ObligationFilter:
    state: State | None = None
    platform: str = ""
    session_key: str = ""
    owner_instance_id: str = ""
    gateway_name: str = ""
    #: `session_key` as a server with a PII key stores it; rows match under either.
    session_key_as_stored: str = ""
    #: Only this agent's rows ("": any).
    agent: str = ""
    #: Only rows still owed (PENDING, ATTEMPTING, FAILED); never with `state`.
    owed_only: bool = False


@dataclass(frozen=True)
class Page:
    obligations: list[Obligation]
    next_page_token: str


@dataclass(frozen=True)
class InstanceSummary:
    """An instance as operators list it: live now or not, and the owed rows it holds."""

    instance: Instance
    live: bool
    held_count: int


@dataclass(frozen=True)
class InstancePage:
    instances: list[InstanceSummary]
    next_page_token: str
