"""Operators' paged reads of global log state: the log itself and its checkpoints.

Both are admin-only (`switchboard.auth.ADMIN_ONLY`): they span every agent.
Every page is bounded by rows and, for the log, by bytes before it is read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from session_service.checks import agent_name, checked_session_id
from session_service.core import Core
from switchboard import pagination, validation
from switchboard.errors import InvalidArgument
from switchboard.proto_time import timestamp
from switchboard.session.v1 import session_service_pb2 as pb

#: The names ListLogEvents accepts as event types: Event's body fields.
EVENT_TYPES = frozenset(f.name for f in pb.Event.DESCRIPTOR.oneofs_by_name["body"].fields)


@dataclass(frozen=True)
class LogQuery:
    """The filters of a log read (all must hold; empty or zero: no filter)."""

    after: int = 0
    before: int = 0
    agent: str = ""
    session_id: str = ""
    event_types: tuple[str, ...] = ()
    branch: int = pb.LOG_BRANCH_UNSPECIFIED

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
        if self.branch not in pb.LogBranch.values():
            raise InvalidArgument("branch", f"{self.branch} is not a known LogBranch")
        return self


class LogReads:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.store = core.store

    async def events(
        self, query: LogQuery, page_size: int, page_token: str
    ) -> tuple[list[pb.LogEntry], str]:
        """A page of the log in sequence order, and the next page's token."""
        query.checked()
        size = pagination.page_size(page_size)
        filters = ["log", asdict(query)]
        position = pagination.position_of(page_token, filters, int)
        after = query.after if position is None else position[0]

        def op() -> tuple[list[pb.LogEntry], str]:
            found, more = self.store.log_page(
                after,
                query.before or None,
                query.agent,
                query.session_id,
                sorted(set(query.event_types)),
                query.branch,
                size,
                pagination.MAX_ANSWER_BYTES,
            )
            entries = [pb.LogEntry(event=event, abandoned=gone) for event, gone in found]
            last = found[-1][0].sequence if found else 0
            return entries, pagination.encode([last], filters) if more else ""

        return await self.core.runner.read(op)

    async def checkpoints(self, page_size: int, page_token: str) -> tuple[list[pb.Checkpoint], str]:
        """A page of checkpoints, oldest first, and the next page's token."""
        size = pagination.page_size(page_size)
        position = pagination.position_of(page_token, ["checkpoints"], int, str)
        after = None if position is None else (position[0], position[1])

        def op() -> tuple[list[pb.Checkpoint], str]:
            rows = self.store.checkpoints_page(after, size + 1)
            more = len(rows) > size
            rows = rows[:size]
            page = [
                pb.Checkpoint(label=label, sequence=seq, create_time=timestamp(at))
                for label, seq, at in rows
            ]
            token = pagination.encode([rows[-1][1], rows[-1][0]], ["checkpoints"]) if more else ""
            return page, token

        return await self.core.runner.read(op)
