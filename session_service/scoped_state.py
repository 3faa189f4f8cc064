"""Scoped state: key-value state owned by a session, by one user of an agent, or by
the agent, changed atomically by deltas (AppendEventsRequest.state_deltas,
UpdateState) and read with the session (GetSession, GetSessionState) or alone
(GetUserState). How Google ADK's session, "user:" and "app:" state map onto
Switchboard; ADK's "temp:" state is never stored (the adapter drops it).

A SESSION-scoped change is the session's event and part of its versioned turn; a
USER- or AGENT-scoped change is the agent's event: it never conflicts with a
session's expected_version (every write is serialized under the log's lock
anyway), and it outlives the erasure of the session it was made in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from session_service import pii
from session_service.agents import Agents
from session_service.checks import agent_name, checked_session_id
from session_service.core import Core
from session_service.records import Event, Session, StateChanged, StateScope
from session_service.storage.projections import SessionIndex
from session_service.storage.state_store import (
    StateStore,
    agent_owner,
    owner_of,
    session_owner,
    user_owner,
)
from switchboard import validation
from switchboard.errors import Aborted, FailedPrecondition, InvalidArgument
from switchboard.idempotency import RequestGuard

MAX_DELTAS = 16
MAX_ENTRIES_PER_DELTA = 1000
MAX_STATE_KEY_CHARS = 256
#: An owner's entries together (keys and values): its state travels whole in reads.
MIN_OWNER_STATE_BYTES = 1024 * 1024
_SCOPES = frozenset({StateScope.SESSION, StateScope.USER, StateScope.AGENT})


@dataclass(frozen=True)
class ScopedView:
    """The scoped state a session sees."""

    session: dict[str, str] = field(default_factory=dict)
    user: dict[str, str] = field(default_factory=dict)
    agent: dict[str, str] = field(default_factory=dict)
    user_id: str = ""


def checked_deltas(
    field_name: str, deltas: Sequence[StateChanged], max_value_bytes: int, *, allow_none: bool
) -> list[StateChanged]:
    """The deltas of a request, each checked (scope, user, keys, JSON values, sizes)."""
    if len(deltas) > MAX_DELTAS or (not deltas and not allow_none):
        raise InvalidArgument(field_name, f"give {0 if allow_none else 1} to {MAX_DELTAS} deltas")
    return [_checked_delta(f"{field_name}[{i}]", d, max_value_bytes) for i, d in enumerate(deltas)]


def _checked_delta(name: str, delta: StateChanged, max_value_bytes: int) -> StateChanged:
    if delta.scope not in _SCOPES:
        raise InvalidArgument(
            f"{name}.scope", "give STATE_SCOPE_SESSION, STATE_SCOPE_USER or STATE_SCOPE_AGENT"
        )
    if delta.user_id and delta.scope != StateScope.USER:
        raise InvalidArgument(f"{name}.user_id", "is for STATE_SCOPE_USER only; leave it empty")
    if delta.user_id:
        validation.routing_key(f"{name}.user_id", delta.user_id, max_len=256)
    if not delta.set and not delta.removed:
        raise InvalidArgument(name, "sets and removes nothing: give `set` or `removed` entries")
    if len(delta.set) + len(delta.removed) > MAX_ENTRIES_PER_DELTA:
        raise InvalidArgument(name, f"has more than {MAX_ENTRIES_PER_DELTA} entries")
    for key in [*delta.set, *delta.removed]:
        _checked_key(f"{name}[{key[:40]!r}]", key)
    both = set(delta.set) & set(delta.removed)
    if both:
        raise InvalidArgument(
            f"{name}.removed", f"key {sorted(both)[0]!r} is also set: set it or remove it"
        )
    for key, value in delta.set.items():
        _checked_value(f"{name}.set[{key[:40]!r}]", value, max_value_bytes)
    return delta


def _checked_key(name: str, key: str) -> None:
    validation.text(name, key, max_len=MAX_STATE_KEY_CHARS, required=True)
    if not key.isprintable():
        raise InvalidArgument(name, "must be printable (no control or format characters)")


def _checked_value(name: str, value: str, max_value_bytes: int) -> None:
    size = len(value.encode("utf-8"))
    if size > max_value_bytes:
        raise InvalidArgument(
            name,
            f"is {size} bytes; this server accepts at most {max_value_bytes} per state value "
            "(--max-state-value-bytes)",
            reason="STATE_VALUE_TOO_LARGE",
        )
    try:
        json.loads(value)
    except ValueError as error:
        raise InvalidArgument(
            name, f"is not JSON text ({error}); encode the value as JSON, e.g. '\"text\"' or '3'"
        ) from None


class ScopedState:
    def __init__(self, core: Core, agents: Agents) -> None:
        self.core = core
        self.agents = agents
        self.store = core.projection.framework.state
        self.runner = core.runner

    # -- writes -----------------------------------------------------------------------------

    def events(
        self,
        agent: str,
        index: SessionIndex | None,
        deltas: Sequence[StateChanged],
        first_version: int,
        field_name: str = "deltas",
    ) -> list[Event]:
        """The StateChanged events of checked deltas, in the caller's write transaction
        (under the log's lock): SESSION-scoped ones the session's, numbered on from
        `first_version`; the others the agent's. Refuses an owner's state growing past
        its bound. `index`: the session's row (None: no session)."""
        user = self._session_user(index)
        redactor = None
        if any(delta.user_id for delta in deltas):  # raw ids: hashed as the agent stores them
            redactor = self.core.redactor_for(self.agents.live_agent_summary(agent).settings)
        events, version = [], first_version
        for number, delta in enumerate(deltas):
            change = self._stored(f"{field_name}[{number}]", delta, index, user, redactor)
            if change.scope == StateScope.SESSION:
                assert index is not None
                events.append(
                    Event(
                        agent=agent,
                        session_id=index.session_id,
                        session_version=version,
                        body=change,
                    )
                )
                version += 1
            else:
                events.append(Event(agent=agent, body=change))
        self._refuse_growth(agent, index, events)
        return events

    def _session_user(self, index: SessionIndex | None) -> str:
        if index is None:
            return ""
        source = self.core.summary(index.session_id, index).source
        return source.user_id if source is not None else ""

    def _stored(
        self,
        name: str,
        delta: StateChanged,
        index: SessionIndex | None,
        session_user: str,
        redactor: pii.Redactor | None,
    ) -> StateChanged:
        """The change as logged: its user resolved (the session's) and stored as the
        agent stores user ids."""
        if delta.scope == StateScope.SESSION and index is None:
            raise InvalidArgument(
                "session_id", f"{name} is SESSION-scoped: name the session it changes"
            )
        if delta.scope != StateScope.USER:
            return replace(delta)
        if delta.user_id:
            return replace(
                delta, user_id=redactor.user(delta.user_id) if redactor else delta.user_id
            )
        if not session_user:
            raise InvalidArgument(
                f"{name}.user_id",
                "is empty and the session names no user (Source.user_id): give the user",
            )
        return replace(delta, user_id=session_user)

    def _refuse_growth(self, agent: str, index: SessionIndex | None, events: list[Event]) -> None:
        changes: dict[str, list[StateChanged]] = {}
        for event in events:
            assert isinstance(event.body, StateChanged)
            owner = owner_of(agent, index.session_id if index else "", event.body)
            changes.setdefault(owner, []).append(event.body)
        current = self.store.values(sorted(changes))
        bound = max(MIN_OWNER_STATE_BYTES, self.core.limits.max_state_value_bytes)
        for owner, owned in changes.items():
            entries = current[owner]
            for change in owned:
                entries.update(change.set)
                for key in change.removed:
                    entries.pop(key, None)
            size = sum(len(k.encode()) + len(v.encode()) for k, v in entries.items())
            if size > bound:
                raise FailedPrecondition(
                    "STATE_TOO_LARGE",
                    f"the {owner.split(':', 1)[0]} state would take {size} bytes; the limit is "
                    f"{bound}: remove entries first",
                )

    async def update(
        self,
        agent: str,
        session_id: str,
        expected_version: int | None,
        deltas: Sequence[StateChanged],
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[list[int], int, str]:
        """UpdateState: (the events' sequences, the session's version or 0, the session)."""
        agent_name("agent", agent)
        if session_id:
            checked_session_id(session_id)
        elif expected_version is not None:
            raise InvalidArgument("expected_version", "goes with a session_id only")
        checked = checked_deltas(
            "deltas", deltas, self.core.limits.max_state_value_bytes, allow_none=False
        )

        def op(now: float) -> tuple[list[int], int, str]:
            self.agents.live_agent_summary(agent)
            index = self.core.open_session_of(agent, session_id) if session_id else None
            if index is not None:
                refuse_stale(index, expected_version)
            first = index.version + 1 if index is not None else 0
            events = self.events(agent, index, checked, first)
            logged = self.core.log(now, events, index)
            session_events = sum(1 for e in logged if e.session_id)
            version = index.version + session_events if index is not None else 0
            return [event.sequence for event in logged], version, session_id

        result: tuple[list[int], int, str] = await self.core.write(op, guard=guard)
        return result

    # -- reads ------------------------------------------------------------------------------

    async def user_state(self, agent: str, user_id: str) -> tuple[dict[str, str], str]:
        """GetUserState: (the user's entries, the user id as stored)."""
        agent_name("agent", agent)
        validation.routing_key("user_id", user_id, max_len=256)

        def op() -> tuple[dict[str, str], str]:
            settings = self.agents.live_agent_summary(agent).settings
            redactor = self.core.redactor_for(settings)
            stored = redactor.user(user_id) if redactor else user_id
            return self.store.values([user_owner(agent, stored)])[user_owner(agent, stored)], stored

        result: tuple[dict[str, str], str] = await self.runner.read(op, consistent=True)
        return result


def view(store: StateStore, session: Session, until: int | None = None) -> ScopedView:
    """What `session` sees now (one statement), or as of `until` (folded from the
    owners' events active now)."""
    user_id = session.source.user_id if session.source is not None else ""
    owners = [session_owner(session.session_id), agent_owner(session.agent)]
    if user_id:
        owners.append(user_owner(session.agent, user_id))
    if until is None:
        found = store.values(owners)
    else:
        found = {owner: store.fold(owner, until) for owner in owners}
    return ScopedView(
        session=found[owners[0]],
        agent=found[owners[1]],
        user=found[owners[2]] if user_id else {},
        user_id=user_id,
    )


def refuse_stale(index: SessionIndex, expected_version: int | None) -> None:
    """ABORTED when the caller expects another version than the session's."""
    if expected_version is not None and expected_version != index.version:
        raise Aborted(
            "VERSION_MISMATCH",
            f"session {index.session_id!r} is at version {index.version}, not "
            f"{expected_version}: re-read it and retry",
            {"version": str(index.version)},
        )
