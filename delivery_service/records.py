"""Plain records the ledger hands out: obligations and gateway instances."""

from __future__ import annotations

import hashlib
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

    @property
    def id(self) -> str:
        return compute_obligation_id(self.session_key, self.message_ref, self.content)


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

    def answer_bytes(self) -> int:
        """About what the row takes in an answer: its longest texts and a fixed rest."""
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


@dataclass(frozen=True)
class Page:
    obligations: list[Obligation]
    next_page_token: str
