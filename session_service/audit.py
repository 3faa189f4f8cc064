"""Operators' actions recorded in the global log, for an audit trail.

An `OperatorAction` event belongs to no agent or session (like a rewind record),
so no state folds it; unlike a rewind record, no move ever abandons it
(`Markers.mark` leaves it active) and no truncation deletes it.
"""

from __future__ import annotations

import re

from session_service.core import Core
from session_service.records import Event, OperatorAction
from switchboard import validation
from switchboard.errors import InvalidArgument
from switchboard.idempotency import RequestGuard

_ACTION = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
MAX_SUBJECT_CHARS = 512
MAX_DETAIL_CHARS = 4096


class Audit:
    def __init__(self, core: Core) -> None:
        self.core = core

    async def record(
        self,
        principal: str,
        action: str,
        subject: str,
        detail: str,
        *,
        guard: RequestGuard | None = None,
    ) -> Event:
        """Logs the action under `principal` (the caller's, from its credentials)."""
        if not _ACTION.fullmatch(action):
            raise InvalidArgument(
                "action",
                f"{action[:70]!r} is not an action name: 1-64 lower-case letters, digits, "
                "'_', '-' or '.', e.g. delivery.retry",
            )
        validation.text("subject", subject, max_len=MAX_SUBJECT_CHARS)
        validation.text("detail", detail, max_len=MAX_DETAIL_CHARS, allow_newlines=True)
        body = OperatorAction(principal=principal, action=action, subject=subject, detail=detail)

        def op(now: float) -> Event:
            [logged] = self.core.record(now, [Event(body=body)])
            return logged

        event: Event = await self.core.write(op, guard=guard)
        return event
