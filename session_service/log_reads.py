"""Operators' paged reads of global log state: the log itself and its checkpoints.

Both are admin-only (`switchboard.auth.ADMIN_ONLY`): they span every agent.
Every page is bounded by rows and, for the log, by bytes before it is read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from session_service.checks import agent_name, checked_session_id
from session_service.core import Core
from session_service.records import EVENT_BODIES, Checkpoint, Event, LogBranch
from session_service.time_travel import checkpoint_of
from switchboard import pagination, validation
from switchboard.errors import InvalidArgument

#: The names ListLogEvents accepts as event types: Event's body fields.
EVENT_TYPES = frozenset(body.kind for body in EVENT_BODIES)


@dataclass(frozen=True)
class LogQuery:
    """The filters of a log read (all must hold; empty or zero: no filter)."""

    after: int = 0
    before: int = 0
    agent: str = ""
    session_id: str = ""
    event_types: tuple[str, ...] = ()
    branch: int = LogBranch.UNSPECIFIED
    #: The newest matching events (a page from the top), paged backwards.
    newest: bool = False

    def checked(self) -> LogQuery:
        validation.int64("after_sequence", self.after)
        validation.int64("before_sequence", self.before)
        if self.agent:
            agent_name("agent", self.agent)
        if self.session_id:
            checked_session_id(self.session_id)
        for index, name in enumerate(self.event_types):
            if name not in EVENT_TYPES:
                raise InvalidArgument(
                    f"event_types[{index}]",
                    f"{name[:70]!r} is not an event type; use Event's body field names, "
                    "e.g. message_appended, session_opened, rewound",
                )
        if self.branch not in set(LogBranch):
            raise InvalidArgument("branch", f"{self.branch} is not a known LogBranch")
        return self


@dataclass(frozen=True)
class LogPage:
    """A page of the log, each event with whether it is abandoned, and the log's
    bounds when it was read."""

    entries: list[tuple[Event, bool]]
    next_page_token: str
    head: int
    retained_from: int


class LogReads:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.store = core.store

    async def events(self, query: LogQuery, page_size: int, page_token: str) -> LogPage:
        """A page of the log in sequence order and the next page's token (forwards, or
        with `newest` backwards)."""
        query.checked()
        size = pagination.page_size(page_size)
        fields = asdict(query)
        if not query.newest:  # tokens issued before `newest` existed stay valid
            del fields["newest"]
        filters = ["log", fields]
        position = pagination.position_of(page_token, filters, int)
        after, before = query.after, query.before
        if position is not None:  # the bound that moves: the upper one backwards
            after, before = (after, position[0]) if query.newest else (position[0], before)

        def op() -> LogPage:
            found, more = self.store.history.log_page(
                after,
                before or None,
                query.agent,
                query.session_id,
                sorted(set(query.event_types)),
                query.branch,
                size,
                pagination.MAX_ANSWER_BYTES,
                newest=query.newest,
            )
            edge = (found[0] if query.newest else found[-1])[0].sequence if found else 0
            token = pagination.encode([edge], filters) if more else ""
            return LogPage(found, token, self.store.log.head(), self.store.markers.retained_from())

        # The rows' sizes, the rows that fit, which are abandoned: a move committed
        # between them would hand back a page no state of the log had.
        return await self.core.runner.read(op, consistent=True)

    async def checkpoints(
        self, page_size: int, page_token: str, min_sequence: int = 0
    ) -> tuple[list[Checkpoint], str]:
        """A page of checkpoints at `min_sequence` or later, oldest first, and the next
        page's token."""
        validation.int64("min_sequence", min_sequence)
        size = pagination.page_size(page_size)
        filters: list[Any] = ["checkpoints"]
        if min_sequence:  # tokens issued before the filter existed stay valid
            filters.append(min_sequence)
        position = pagination.position_of(page_token, filters, int, str)
        after = None if position is None else (position[0], position[1])

        def op() -> tuple[list[Checkpoint], str]:
            rows = self.store.markers.checkpoints_page(after, size + 1, min_sequence)
            more = len(rows) > size
            rows = rows[:size]
            page = [checkpoint_of(label, seq, at) for label, seq, at in rows]
            token = pagination.encode([rows[-1][1], rows[-1][0]], filters) if more else ""
            return page, token

        return await self.core.runner.read(op)
