"""The obligation state machine: states, legal transitions, marker and backoff rules.

    record ──► PENDING ──MarkAttempting──► ATTEMPTING ──MarkDelivered──► DELIVERED
                  │  ▲                        │  ▲
                  │  └─────────┐              │  └── ClaimRecoverable (owner dead,
                  │            │              │      or FAILED and due)
                  └──MarkFailed┴──────────────┴──► FAILED ──(not retryable, cap,
                                                             stale, operator)──► ABANDONED

DELIVERED and ABANDONED are terminal: nothing but an operator's RetryObligation
(ABANDONED only) ever moves a row out of them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from switchboard.idempotency import DEFAULT_WINDOW_S


class State(enum.StrEnum):
    PENDING = "pending"
    ATTEMPTING = "attempting"
    DELIVERED = "delivered"
    FAILED = "failed"
    ABANDONED = "abandoned"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({State.DELIVERED, State.ABANDONED})
#: Rows the ledger still owes a platform.
OWED = (State.PENDING, State.ATTEMPTING, State.FAILED)

#: Fenced transitions a holder may make, by target state: the states it may come from.
HOLDER_SOURCES: dict[State, tuple[State, ...]] = {
    State.ATTEMPTING: (State.PENDING,),
    State.DELIVERED: (State.PENDING, State.ATTEMPTING),
    State.FAILED: (State.PENDING, State.ATTEMPTING),
    State.ABANDONED: (State.PENDING, State.ATTEMPTING),
}


def needs_marker(previous: State, attempts: int) -> bool:
    """Whether a redelivery must say "this may be a duplicate".

    Only a row that was still PENDING and never claimed before is certain not to
    have reached the platform.
    """
    return previous is not State.PENDING or attempts > 0


@dataclass(frozen=True)
class LedgerLimits:
    """The ledger's policy knobs (all configurable, none hard-coded elsewhere)."""

    #: Recovery claims a row may use up; the next sweep abandons it.
    max_attempts: int = 3
    #: A row older than this (since it was recorded) is abandoned by a sweep.
    stale_after_s: float = 24 * 3600
    #: Terminal rows older than this are pruned.
    retention_s: float = 7 * 24 * 3600
    #: Default gateway lease; an instance without a heartbeat for this long is dead.
    lease_ttl_s: float = 30.0
    #: Delay before a retryable failure becomes claimable, by recovery attempts
    #: spent so far; the last entry repeats (applied in SQL by the store).
    backoff_s: Sequence[float] = field(default=(30.0, 120.0))
    #: Longest reply accepted, in UTF-8 bytes.
    max_content_bytes: int = 256 * 1024
    #: Rows a claim returns when the caller does not say.
    default_claim_limit: int = 100
    #: How long a request id's answer is kept for retries.
    request_id_window_s: float = DEFAULT_WINDOW_S
