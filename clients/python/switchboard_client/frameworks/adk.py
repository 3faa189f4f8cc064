"""Google ADK's session service on Switchboard (`pip install "switchboard-client[adk]"`).

    from switchboard_client.frameworks.adk import SwitchboardSessionService
    sessions = SwitchboardSessionService("127.0.0.1:50051")
    runner = Runner(agent=agent, app_name="shop", session_service=sessions)

What ADK's names become:
- an app is an agent (`_adk_codec.agent_name`), created on first use;
- a session (app, user, session id) is the agent's session routed by the source
  {transport "adk", user_id, conversation_id: the ADK session id};
- an event is one history message holding the event's JSON, appended with its state
  delta in one atomic AppendEvents: unprefixed keys are the session's scoped state,
  "user:" keys the user's, "app:" keys the agent's; "temp:" keys stay in memory;
- a loaded session remembers the stored session and version it was read at; its next
  append expects that version, so a second writer that got there first makes it fail
  with ADK's own `StaleSessionError` instead of interleaving (reload and retry);
- `delete_session` erases the session (EraseSession: content gone from the log, its
  snapshots and projections, a tombstone left);
- ADK's `Runner.rewind_async` is an ordinary appended event (ADK's own, per session);
  it is not Switchboard's global rewind.

Bad input raises what ADK raises (ValueError and its subclasses, AlreadyExistsError)
with the service's reason, and writes nothing. Calls work from any event loop: each loop
gets its own channel (ADK's `Runner.run` runs its loop in a thread of its own).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar

import grpc

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events import Event
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
except ImportError as missing:  # the extra is not installed: say which one
    raise ImportError(
        f"switchboard_client.frameworks.adk needs google-adk ({missing.name} is "
        "missing): pip install 'switchboard-client[adk]'"
    ) from missing

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client import _framework
from switchboard_client.aio import AsyncSessionClient
from switchboard_client.errors import SwitchboardError
from switchboard_client.frameworks import _adk_cache
from switchboard_client.frameworks import _adk_codec as codec
from switchboard_client.frameworks._adk_codec import Marker

__all__ = ["STALE_SESSION_MESSAGE", "SwitchboardSessionService"]

#: ADK's own words for a lost race (its database service's), so callers' handling and
#: logs read the same.
STALE_SESSION_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
#: History messages per read (the service's most).
_PAGE = 1000
#: Sessions whose state `list_sessions` reads at once.
_LIST_STATE_READS = 16
_REFUSALS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
)
T = TypeVar("T")


def _as_adk_error(error: SwitchboardError, what: str) -> Exception:
    """The exception ADK's own services raise for what the service answered."""
    if error.code == grpc.StatusCode.ABORTED:
        stale: Exception = StaleSessionError(STALE_SESSION_MESSAGE)
        return stale
    if error.code == grpc.StatusCode.NOT_FOUND:
        missing: Exception = SessionNotFoundError(f"{what}: {error.message}")
        return missing
    if error.code in _REFUSALS:
        fields = f" (field {', '.join(error.field_violations)})" if error.field_violations else ""
        return ValueError(f"{what}: {error.message}{fields}")
    return error


async def _adk_errors(call: Awaitable[T], what: str) -> T:
    try:
        return await call
    except SwitchboardError as error:
        raised = _as_adk_error(error, what)
        if raised is error:
            raise
        raise raised from error


def _shown(session_id: str) -> str:
    """A session id for a message (a refused one may be very long)."""
    return repr(session_id if len(session_id) <= 80 else f"{session_id[:77]}...")


def _configured(events: list[Event], config: GetSessionConfig | None) -> list[Event]:
    """`GetSessionConfig` on a whole history, as ADK's services apply it: the newest
    `num_recent_events` of the events at or after `after_timestamp`."""
    if config is None:
        return events
    if config.after_timestamp is not None:
        events = [e for e in events if e.timestamp >= config.after_timestamp]
    wanted = config.num_recent_events
    if wanted is not None:
        events = events[max(0, len(events) - wanted) :] if wanted else []
    return events


def _check_names(app_name: object, user_id: object) -> None:
    for name, value in (("app_name", app_name), ("user_id", user_id)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, not {value!r}")


class SwitchboardSessionService(BaseSessionService):  # type: ignore[misc]
    """A `google.adk.sessions.BaseSessionService` storing in a Switchboard SessionService.

    `target` is the service's address ("host:port"); `token` its bearer token, if it
    checks one. Pass `client` instead to use an `AsyncSessionClient` of yours (then use
    the service from that client's event loop only). The decoded events of the
    `cached_sessions` most recently used sessions are kept, and reused while a session
    is still at the version they were read or written at (0: none kept)."""

    def __init__(
        self,
        target: str = "",
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        client: AsyncSessionClient | None = None,
        cached_sessions: int = _adk_cache.SESSIONS,
    ) -> None:
        if not target and client is None:
            raise ValueError("give the SessionService's address (target) or a client")
        self._target = target
        self._token = token
        self._timeout_s = timeout_s
        self._client = client
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSessionClient]
        self._clients = weakref.WeakKeyDictionary()
        # (agent, user, ADK session id) -> stored session id, so that a read is one call
        # fewer; a stale entry (erased session) is found out and dropped.
        self._routes: dict[tuple[str, str, str], str] = {}
        self._cache = _adk_cache.EventCache(cached_sessions)

    # -- plumbing ----------------------------------------------------------------------

    def _session_client(self) -> AsyncSessionClient:
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = AsyncSessionClient(self._target, timeout_s=self._timeout_s, token=self._token)
            self._clients[loop] = client
        return client

    async def close(self) -> None:
        """Closes the channel of the running loop (a passed-in client stays open)."""
        if self._client is None:
            client = self._clients.pop(asyncio.get_running_loop(), None)
            if client is not None:
                await client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _open(
        self, agent: str, app_name: str, user_id: str, session_id: str
    ) -> pb.ResolveSessionResponse:
        """Opens the stored session of a new ADK session (its app's agent made on first
        use, so that a refused session creates no agent either)."""
        client = self._session_client()
        for attempt in range(2):
            try:
                return await client.resolve(
                    agent,
                    transport=codec.TRANSPORT,
                    conversation_id=session_id,
                    user_id=user_id,
                    request_id=str(uuid.uuid4()),
                    reopen_erased=True,
                )
            except SwitchboardError as error:
                if error.reason != "AGENT_NOT_FOUND" or attempt:
                    raise _as_adk_error(
                        error, f"cannot create session {_shown(session_id)}"
                    ) from error
            await self._create_agent(agent, app_name)
        raise AssertionError("unreachable")

    async def _create_agent(self, agent: str, app_name: str) -> None:
        try:
            await self._session_client().create_agent(
                agent, request_id=str(uuid.uuid4()), display_name=app_name[:200]
            )
        except SwitchboardError as error:
            if error.code != grpc.StatusCode.ALREADY_EXISTS:  # another client made it
                raise _as_adk_error(error, f"cannot use app {app_name!r}") from error

    async def _lookup(self, agent: str, user_id: str, session_id: str) -> str | None:
        """The stored session of an ADK session, or None (never creates one)."""
        key = (agent, user_id, session_id)
        if key in self._routes:
            return self._routes[key]
        try:
            answer = await self._session_client().resolve(
                agent,
                transport=codec.TRANSPORT,
                conversation_id=session_id,
                user_id=user_id,
                lookup_only=True,
            )
        except SwitchboardError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise _as_adk_error(error, f"cannot look session {_shown(session_id)} up") from error
        self._remember(key, answer.session.session_id)
        return answer.session.session_id

    def _remember(self, key: tuple[str, str, str], stored_id: str) -> None:
        if len(self._routes) >= 100_000:
            self._routes.clear()
        self._routes[key] = stored_id

    async def _read_once(
        self, agent: str, user_id: str, session_id: str, read: Callable[[str], Awaitable[T]]
    ) -> T | None:
        """`read` of the stored session, looked up again once if the remembered one is
        gone (erased, by this process or another); None when there is none."""
        for _ in range(2):
            stored_id = await self._lookup(agent, user_id, session_id)
            if stored_id is None:
                return None
            try:
                return await read(stored_id)
            except SwitchboardError as error:
                if error.code != grpc.StatusCode.NOT_FOUND:
                    raise _as_adk_error(
                        error, f"cannot read session {_shown(session_id)}"
                    ) from error
                self._routes.pop((agent, user_id, session_id), None)
        return None

    # -- BaseSessionService --------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        _check_names(app_name, user_id)
        session_id = (session_id.strip() if session_id else None) or str(uuid.uuid4())
        deltas = codec.state_deltas(state or {}, "state")
        agent = codec.agent_name(app_name)
        client = self._session_client()
        answer = await self._open(agent, app_name, user_id, session_id)
        if not answer.created:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        stored = answer.session
        self._remember((agent, user_id, session_id), stored.session_id)
        if deltas:
            await self._initial_state(agent, stored, deltas, session_id)
        read = await client.get_session_with_state(agent, stored.session_id)
        if read.session.message_count == 0:  # else another writer was quicker still
            self._cache.keep((agent, stored.session_id), read.session.version, [])
        return self._session(app_name, user_id, session_id, read, [])

    async def _initial_state(
        self, agent: str, stored: pb.Session, deltas: list[pb.StateDelta], session_id: str
    ) -> None:
        """The initial state, on the session just opened; a refused state (too large,
        a bad key) takes the new session back out, so nothing stays of the call."""
        client = self._session_client()
        try:
            await client.append(
                agent,
                stored.session_id,
                expected_version=stored.version,
                state_deltas=deltas,
                sequences_only=True,
                request_id=str(uuid.uuid4()),
            )
        except SwitchboardError as error:
            await client.erase_session(agent, stored.session_id, request_id=str(uuid.uuid4()))
            self._routes.pop((agent, stored.source.user_id, session_id), None)
            raise _as_adk_error(error, f"cannot create session {_shown(session_id)}") from error

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        _check_names(app_name, user_id)
        session_id = session_id.strip() if session_id else session_id
        agent = codec.agent_name(app_name)
        client = self._session_client()

        async def read(stored_id: str) -> Session:
            summary = await client.get_session_with_state(agent, stored_id)
            events = await self._events(agent, summary.session, config)
            return self._session(app_name, user_id, session_id, summary, events)

        return await self._read_once(agent, user_id, session_id, read)

    async def _events(
        self, agent: str, stored: pb.Session, config: GetSessionConfig | None
    ) -> list[Event]:
        """The session's events at the version just read, as the config limits them:
        from the cache when it has that version, else read (and kept when whole)."""
        key = (agent, stored.session_id)
        known = self._cache.events(key, stored.version)
        if known is not None:
            return _configured(known, config)
        events = await self._read_events(agent, stored, config)
        if config is None or (config.num_recent_events is None and not config.after_timestamp):
            self._cache.keep(key, stored.version, events)
        return events

    async def _read_events(
        self, agent: str, stored: pb.Session, config: GetSessionConfig | None
    ) -> list[Event]:
        """The history up to the summary's last sequence (so that it matches the
        version read with it), newest pages first, only as far as the config wants.

        `after_timestamp` filters every event rather than stopping at the first older
        one: a timestamp is the caller's (ADK stamps an event when it makes it, not when
        it is appended), so an older event can follow a newer one in the log."""
        wanted = None if config is None else config.num_recent_events
        after = None if config is None else config.after_timestamp
        if wanted == 0 or stored.message_count == 0:
            return []
        client = self._session_client()
        newest_first: list[Event] = []
        before = stored.last_sequence + 1
        read = 0
        while read < stored.message_count and (wanted is None or len(newest_first) < wanted):
            limit = _PAGE
            if wanted is not None and after is None:  # every event read is kept
                limit = min(_PAGE, wanted - len(newest_first))
            page = await client.history(
                agent, stored.session_id, limit=limit, newest=True, before=before
            )
            if not page:
                break
            read += len(page)
            for queued in reversed(page):
                event = codec.decode_event(queued)
                if after is None or event.timestamp >= after:
                    newest_first.append(event)
                    if len(newest_first) == wanted:
                        break
            before = page[0].sequence
        return newest_first[::-1]

    def _session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        read: pb.GetSessionResponse,
        events: list[Event],
    ) -> Session:
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=codec.merged_state(read.scoped_state),
            events=events,
            # ADK's services stamp a session with its newest event's time; without
            # events read, the time of its last change in the store.
            last_update_time=events[-1].timestamp
            if events
            else codec.seconds(read.session.update_time),
        )
        session._storage_update_marker = Marker(
            read.session.session_id, read.session.version
        ).text()
        return session

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The sessions (without events, with their merged state), least recently
        updated first, as ADK's services order them."""
        if user_id is not None:
            _check_names(app_name, user_id)
        else:
            _check_names(app_name, "any")
        agent = codec.agent_name(app_name)
        client = self._session_client()
        stored: list[pb.Session] = []
        try:
            async for found in client.iter_sessions(
                agent, transport=codec.TRANSPORT, user_id=user_id or "", page_size=1000
            ):
                stored.append(found)
        except SwitchboardError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                return ListSessionsResponse()
            raise _as_adk_error(error, f"cannot list the sessions of {app_name!r}") from error
        gate = asyncio.Semaphore(_LIST_STATE_READS)

        async def with_state(found: pb.Session) -> Session | None:
            async with gate:
                try:
                    read = await client.get_session_with_state(agent, found.session_id)
                except SwitchboardError as error:
                    if error.code == grpc.StatusCode.NOT_FOUND:  # erased meanwhile
                        return None
                    raise
            source = found.source
            return self._session(app_name, source.user_id, source.conversation_id, read, [])

        sessions = [s for s in await asyncio.gather(*map(with_state, stored)) if s is not None]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Erases the session for good (EraseSession); a session that is not there is
        no error, as with ADK's services."""
        _check_names(app_name, user_id)
        session_id = session_id.strip() if session_id else session_id
        agent = codec.agent_name(app_name)
        client = self._session_client()

        async def erase(stored_id: str) -> None:
            self._cache.drop((agent, stored_id))
            await client.erase_session(agent, stored_id, request_id=str(uuid.uuid4()))

        await self._read_once(agent, user_id, session_id, erase)
        self._routes.pop((agent, user_id, session_id), None)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's "user:" state, keys without the prefix ({} for none)."""
        _check_names(app_name, user_id)
        try:
            answer = await self._session_client().user_state(codec.agent_name(app_name), user_id)
        except SwitchboardError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                return {}
            raise _as_adk_error(error, f"cannot read the state of user {user_id!r}") from error
        return _framework.state_values(answer.state)

    async def append_event(self, session: Session, event: Event) -> Event:
        """Stores the event and its state delta atomically, if the session is still at
        the version it was read at (else ADK's `StaleSessionError`, nothing written)."""
        if event.partial:
            return event
        # An event the session already holds (the same object, or an equal copy: a
        # caller retrying an append that went through) is not stored twice: ADK's
        # InMemorySessionService ignores it too, and its SQL services refuse the id. An
        # event that only shares the id is another event, stored as InMemory stores it.
        if any(e == event for e in session.events if e.id == event.id):
            return event
        deltas = codec.state_deltas(event.actions.state_delta or {}, "state_delta key")
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        message = codec.event_input(event)
        agent = codec.agent_name(session.app_name)
        marker = Marker.parse(session._storage_update_marker)
        if marker is None:
            marker = await self._marker_of_unloaded(agent, session)
        answer = await _adk_errors(
            self._session_client().append(
                agent,
                marker.session_id,
                message,
                expected_version=marker.version,
                state_deltas=deltas,
                sequences_only=True,
                request_id=str(uuid.uuid4()),
            ),
            f"cannot append to session {_shown(session.id)}",
        )
        session._storage_update_marker = Marker(marker.session_id, answer.version).text()
        session.last_update_time = event.timestamp
        self._cache.appended((agent, marker.session_id), marker.version, answer.version, event)
        return self._commit_event_to_session(session, event)

    async def _marker_of_unloaded(self, agent: str, session: Session) -> Marker:
        """A session object this service did not load (built by hand, or copied without
        its private marker): accepted only while the store holds exactly its events, as
        ADK's database service accepts one."""
        stored_id = await self._lookup(agent, session.user_id, session.id)
        if stored_id is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        client = self._session_client()
        stored = await _adk_errors(
            client.get_session(agent, stored_id), f"cannot read session {_shown(session.id)}"
        )
        newest = await client.history(agent, stored_id, limit=1, newest=True)
        matches = (
            codec.decode_event(newest[0]).id == session.events[-1].id
            if newest and session.events
            else not newest and not session.events
        )
        if not matches:
            raise StaleSessionError(STALE_SESSION_MESSAGE)
        return Marker(stored_id, stored.version)
