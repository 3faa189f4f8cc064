"""Retraction: taking history messages back (RetractMessages), atomically and as an
event of the log, so that a rewind or checkout moves it like any turn change.

What an agent framework's "pop the newest item" becomes (OpenAI Agents
`Session.pop_item`): the newest message is read and retracted under the log's
lock, so two callers never pop the same item, and the answer carries what left.
"""

from __future__ import annotations

from collections.abc import Sequence

from session_service import convert, storage_format
from session_service.checks import agent_name, checked_session_id
from session_service.core import Core
from session_service.records import Event, MessageAppended, MessagesRetracted, QueuedMessage
from session_service.scoped_state import refuse_stale
from switchboard import pagination
from switchboard.errors import FailedPrecondition, InvalidArgument
from switchboard.idempotency import RequestGuard

MAX_RETRACTED = 100


def _checked_choice(newest_count: int, sequences: Sequence[int]) -> None:
    if bool(newest_count) == bool(sequences):
        raise InvalidArgument(
            "newest_count", "give newest_count or sequences (one of them) to say what to retract"
        )
    if newest_count > MAX_RETRACTED or len(sequences) > MAX_RETRACTED:
        raise InvalidArgument(
            "sequences" if sequences else "newest_count",
            f"retract at most {MAX_RETRACTED} messages per call",
        )
    if len(set(sequences)) != len(sequences):
        raise InvalidArgument("sequences", "names a sequence twice")


class Retraction:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.store = core.store
        self.retractions = core.projection.framework.retractions

    async def retract(
        self,
        agent: str,
        session_id: str,
        expected_version: int | None,
        newest_count: int,
        sequences: Sequence[int],
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[list[QueuedMessage], int, int, str]:
        """(the retracted messages oldest first, the version, the event's sequence or 0
        when there was nothing to retract, the session): the write's own result, so that
        a request id's stored answer is built from it."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        _checked_choice(newest_count, sequences)

        def op(now: float) -> tuple[list[QueuedMessage], int, int, str]:
            index = self.core.open_session_of(agent, session_id)
            refuse_stale(index, expected_version)
            lineage = self.core.summary(session_id, index).lineage
            shared = lineage is not None and lineage.shares_parent_history
            if newest_count:
                events = self._newest(session_id, newest_count, shared)
            else:
                events = self._named(session_id, sequences)
            if not events:
                return [], index.version, 0, session_id
            retracted = MessagesRetracted(sequences=[e.sequence for e in reversed(events)])
            event = Event(
                agent=agent,
                session_id=session_id,
                session_version=index.version + 1,
                body=retracted,
            )
            [logged] = self.core.log(now, [event], index)
            messages = [
                QueuedMessage(sequence=e.sequence, message=e.body.message)
                for e in events
                if isinstance(e.body, MessageAppended)
            ]
            return messages, index.version + 1, logged.sequence, session_id

        result: tuple[list[QueuedMessage], int, int, str] = await self.core.write(op, guard=guard)
        return result

    def _newest(self, session_id: str, count: int, shared: bool) -> list[Event]:
        events, more = self.store.history.history(
            session_id, 0, None, count, True, False, pagination.MAX_ANSWER_BYTES, shared
        )
        if len(events) < count and more:
            raise _too_large(count)
        return events

    def _named(self, session_id: str, sequences: Sequence[int]) -> list[Event]:
        rows = self.retractions.visible_messages(session_id, sorted(sequences))
        events = [storage_format.decode_event(fmt, payload) for fmt, payload in rows]
        missing = sorted(set(sequences) - {event.sequence for event in events})
        if missing:
            raise FailedPrecondition(
                "MESSAGE_NOT_IN_HISTORY",
                f"sequence {missing[0]} is not a message of session {session_id!r}'s current "
                "history (another event, another session's, abandoned, or retracted already)",
            )
        if sum(convert.encoded_size(event) for event in events) > pagination.MAX_ANSWER_BYTES:
            raise _too_large(len(events))
        return events


def _too_large(count: int) -> InvalidArgument:
    return InvalidArgument(
        "newest_count",
        f"the {count} messages would not fit one answer ({pagination.MAX_ANSWER_BYTES} "
        "bytes): retract fewer at a time",
        reason="ANSWER_TOO_LARGE",
    )
