"""Switchboard as an OpenAI Agents SDK session: a drop-in for `SQLiteSession`.

    session = SwitchboardSession("conversation-1", client, agent="support", user_id="u-1")
    result = await Runner.run(agent, "Hello", session=session)

What maps to what:

- The SDK's session id (with an optional user id) is a conversation of one
  Switchboard agent: the session that `ResolveSession` (transport
  "openai_agents") answers for it. Reads never create it (`lookup_only`); the
  first `add_items` does.
- Each item is one history message of that session (a MessageAppended event of
  the global log) holding the item's JSON, so a Switchboard rewind or checkout
  moves the conversation with the rest of the log. One `add_items` call is one
  atomic `AppendEvents` (split, in order, past 100 items or 2 MiB).
- `pop_item` is `RetractMessages(newest_count=1)`: a retraction event, atomic on
  the server (two poppers never get the same item), which a rewind undoes.
- `clear_session` is `ResetSession`: the conversation's session ends (its
  history stays in the log, reachable by a rewind) and the id answers a fresh one.

Concurrency: by default writers share the session as `SQLiteSession`'s do: every
call is atomic and nothing is lost or duplicated, and appends of two writers
interleave whole. With `exclusive=True` each write carries the session version
this object last read or wrote (`expected_version`), and a write after another
writer's raises `SessionConflict` and writes nothing: two runners on one
conversation, one wins, the other re-reads and retries its turn.

The SDK's session API is async only; so is this one. The calls run the blocking
`SessionClient` (thread-safe, usable from any event loop, as `Runner.run_sync`
and several loops need) in worker threads, as `SQLiteSession` runs sqlite3.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc

try:
    from agents.exceptions import AgentsException
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as missing:  # the extra is not installed: say which one
    raise ImportError(
        f"switchboard_client.frameworks.openai_agents needs openai-agents ({missing.name} is "
        "missing): pip install 'switchboard-client[openai-agents]'"
    ) from missing

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client.errors import SwitchboardError
from switchboard_client.frameworks import _openai_agents_items as codec
from switchboard_client.session import SessionClient

#: The transport of the conversations this adapter opens (see Session.routing_key).
TRANSPORT = "openai_agents"
#: GetHistory's largest page.
_PAGE = 1000
#: AppendEvents takes at most 100 events; a call stays well under gRPC's 4 MiB.
_CHUNK_EVENTS = 100
_CHUNK_BYTES = 2 * 1024 * 1024

_T = TypeVar("_T")


class SessionConflict(AgentsException):  # type: ignore[misc]  # agents is typed Any
    """An exclusive session was changed by another writer since this object last read
    or wrote it (the server's version check refused the write; nothing was written).
    Re-read the session (`get_items`) and retry the turn."""


class SwitchboardSession:
    """The SDK's `Session` protocol on a Switchboard conversation (see the module)."""

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        client: SessionClient,
        *,
        agent: str,
        user_id: str = "",
        session_settings: SessionSettings | dict[str, Any] | None = None,
        exclusive: bool = False,
    ) -> None:
        """`session_id`: the SDK's conversation id; `agent`: the Switchboard agent
        (created beforehand) whose conversation it is; `user_id`: whose, if the same
        conversation id may recur for several users. `exclusive`: refuse a write
        that follows another writer's (`SessionConflict`)."""
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty string, not {session_id!r}")
        self.session_id = session_id
        self.client = client
        self.agent = agent
        self.user_id = user_id
        self.exclusive = exclusive
        self.session_settings = (
            SessionSettings()
            if session_settings is None
            else coerce_session_settings(session_settings)
        )
        # The Switchboard session last resolved, and the version this object last saw.
        self._current: pb.Session | None = None

    # -- the Session protocol -------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation's items, oldest first; with `limit`, the newest `limit`
        (0: none; negative: all, as `SQLiteSession`)."""
        effective = resolve_session_limit(limit, self.session_settings)
        return await asyncio.to_thread(self._get_items, effective)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Appends the items in one atomic write (per 100 items or 2 MiB)."""
        events = _events_of(items)
        if events:
            await _await_outcome(asyncio.to_thread(self._add_events, events))

    async def pop_item(self) -> TResponseInputItem | None:
        """Retracts and returns the newest item (None when there is none)."""
        return await _await_outcome(asyncio.to_thread(self._pop_item))

    async def clear_session(self) -> None:
        """Resets the conversation: it continues in a fresh, empty session."""
        await _await_outcome(asyncio.to_thread(self._clear))

    def close(self) -> None:
        """Nothing to release: the client (and its channel) is the caller's."""

    # -- the calls, in a worker thread ----------------------------------------------

    def _resolve(self, *, create: bool) -> pb.Session | None:
        """The conversation's current session (None: it has none and `create` is off)."""
        try:
            answer = self.client.resolve(
                self.agent,
                transport=TRANSPORT,
                conversation_id=self.session_id,
                user_id=self.user_id,
                lookup_only=not create,
            )
        except SwitchboardError as error:
            if not create and error.reason == "SESSION_NOT_FOUND":
                return None  # the conversation has no session yet (or it was erased)
            raise self._framework_error(error) from error
        return answer.session

    def _write_target(self, *, create: bool) -> pb.Session | None:
        """Where a write goes: the session (and version) this object saw last, else
        the one answering the conversation now. A shared session whose write finds it
        ended or gone (another writer's clear, a rewind) forgets it and resolves again."""
        if self._current is None:
            self._current = self._resolve(create=create)
        return self._current

    def _get_items(self, limit: int | None) -> list[TResponseInputItem]:
        if limit == 0:
            return []
        session = self._resolve(create=False)
        if session is None:
            return []
        self._current = session  # what an exclusive write will expect
        if limit is None or limit < 0:
            return list(self._items_oldest_first(session.session_id))
        return self._newest_items(session.session_id, limit)

    def _items_oldest_first(self, session_id: str) -> Iterator[TResponseInputItem]:
        for page in self.client.history_pages(self.agent, session_id, limit=_PAGE):
            yield from _decoded(page.messages)

    def _newest_items(self, session_id: str, limit: int) -> list[TResponseInputItem]:
        """The newest `limit` items: pages backwards until enough (a message holding no
        item does not count, as `SQLiteSession` skips corrupt rows)."""
        pages = self.client.history_pages(
            self.agent, session_id, newest=True, limit=min(limit, _PAGE)
        )
        found: list[TResponseInputItem] = []
        for page in pages:
            found = _decoded(page.messages) + found
            if len(found) >= limit:
                break
        return found[-limit:]

    def _add_events(self, events: Sequence[pb.SessionEventInput]) -> None:
        session = self._write_target(create=True)
        assert session is not None
        for number, chunk in enumerate(_chunks(events)):
            try:
                session = self._append(session, chunk)
            except SwitchboardError as error:
                if number or self.exclusive or not _session_moved(error):
                    raise self._framework_error(error) from error
                # Another writer cleared the conversation since this object resolved
                # it: nothing was written; append to the session that answers it now.
                self._current = None
                session = self._write_target(create=True)
                assert session is not None
                session = self._append(session, chunk)

    def _append(self, session: pb.Session, chunk: Sequence[pb.SessionEventInput]) -> pb.Session:
        answer = self.client.append(
            self.agent,
            session.session_id,
            *chunk,
            expected_version=session.version if self.exclusive else None,
            sequences_only=True,
        )
        self._current = _at_version(session, answer.version)
        return self._current

    def _pop_item(self) -> TResponseInputItem | None:
        while True:
            session = self._write_target(create=False)
            if session is None:
                return None
            try:
                answer = self.client.retract_messages(
                    self.agent,
                    session.session_id,
                    newest_count=1,
                    expected_version=session.version if self.exclusive else None,
                )
            except SwitchboardError as error:
                if self.exclusive or not _session_moved(error):
                    raise self._framework_error(error) from error
                self._current = None  # cleared meanwhile: pop from the current session
                continue
            self._current = _at_version(session, answer.version)
            if not answer.messages:
                return None
            [item] = _decoded(answer.messages) or [None]
            if item is not None:
                return item
            # A message that holds no item (not JSON): dropped, as SQLiteSession drops
            # a corrupt row, and the pop goes on to the next one.

    def _clear(self) -> None:
        session = self._resolve(create=False)
        if session is None:
            return
        try:
            answer = self.client.reset(self.agent, session.session_id, reason="clear_session")
        except SwitchboardError as error:
            if _session_moved(error):
                return  # another writer's clear_session ended it meanwhile
            raise self._framework_error(error) from error
        self._current = answer.session

    def _framework_error(self, error: SwitchboardError) -> Exception:
        """The exception the SDK's callers expect: ValueError for input the server
        refused (as `SQLiteSession` raises for bad items), `SessionConflict` for a
        stale exclusive write, the `SwitchboardError` itself otherwise."""
        if error.code == grpc.StatusCode.INVALID_ARGUMENT:
            fields = f" ({', '.join(error.field_violations)})" if error.field_violations else ""
            return ValueError(f"Switchboard refused the write{fields}: {error.message}")
        if self.exclusive and (error.code == grpc.StatusCode.ABORTED or _session_moved(error)):
            # What this object saw stays: every write conflicts until a read (get_items).
            return SessionConflict(
                f"conversation {self.session_id!r} was changed by another writer since "
                f"this session object last read it ({error.message}); nothing was "
                "written: call get_items and retry the turn"
            )
        return error


def _events_of(items: object) -> list[pb.SessionEventInput]:
    """The items as history messages; TypeError/ValueError before any write."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise TypeError(f"items must be a list of items, not a {type(items).__name__}")
    return [
        codec.item_event(item, codec.item_text(item, position))
        for position, item in enumerate(items)
    ]


def _chunks(events: Sequence[pb.SessionEventInput]) -> Iterator[list[pb.SessionEventInput]]:
    chunk: list[pb.SessionEventInput] = []
    size = 0
    for event in events:
        event_size = event.ByteSize()
        if chunk and (len(chunk) == _CHUNK_EVENTS or size + event_size > _CHUNK_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(event)
        size += event_size
    if chunk:
        yield chunk


def _decoded(messages: Sequence[pb.QueuedMessage]) -> list[TResponseInputItem]:
    items = (codec.item_of(queued.message) for queued in messages)
    return [item for item in items if item is not None]


def _at_version(session: pb.Session, version: int) -> pb.Session:
    moved = pb.Session()
    moved.CopyFrom(session)
    moved.version = version
    return moved


def _session_moved(error: SwitchboardError) -> bool:
    """The session this object resolved has ended (a reset) or is gone."""
    return error.reason in ("SESSION_ENDED", "SESSION_NOT_FOUND")


async def _await_outcome(call: asyncio.Future[_T] | Any) -> _T:
    """Awaits a write to its outcome even when the caller is cancelled meanwhile (then
    re-raises the cancellation), so that a cancelled turn never leaves the caller
    unsure whether its items were stored (as the SDK's sessions do)."""
    task: asyncio.Future[_T] = asyncio.ensure_future(call)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    result = task.result()
    if cancelled is not None:
        raise cancelled
    return result


__all__ = ["TRANSPORT", "SessionConflict", "SwitchboardSession"]
