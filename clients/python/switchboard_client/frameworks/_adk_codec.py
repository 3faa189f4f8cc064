"""How Google ADK's values become Switchboard's and back, for `frameworks.adk`: app
names as agent names, events as history messages, prefixed state keys as scoped state
deltas, and the revision marker a loaded session carries."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.adk.events import Event
from google.adk.sessions.state import State
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client import _framework

log = logging.getLogger("switchboard_client.frameworks.adk")

#: The transport of the sources ADK sessions are routed by (agent, user, session id).
TRANSPORT = "adk"

# The service's agent names (session_service/checks.py): what an app name may be as is.
_AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_SLUG_DROPPED = re.compile(r"[^a-z0-9_-]+")
# The service's longest state key (StateDelta.set).
_MAX_KEY = 256


def agent_name(app_name: str) -> str:
    """The agent an ADK app is stored under: the app name itself when it is a valid agent
    name, else a readable slug of it with a digest of the exact name (so two apps never
    share an agent, e.g. "MyApp" and "myapp")."""
    if _AGENT_NAME.fullmatch(app_name):
        return app_name
    digest = hashlib.sha256(app_name.encode()).hexdigest()[:12]
    slug = _SLUG_DROPPED.sub("-", app_name.lower()).strip("-_")[:40]
    return f"adk-{slug}-{digest}" if slug else f"adk-{digest}"


@dataclass(frozen=True)
class Marker:
    """Which stored session a loaded ADK session is, and at which version: kept in the
    session's `_storage_update_marker`, ADK's own slot for a storage revision."""

    session_id: str
    version: int

    def text(self) -> str:
        return f"{self.session_id}@{self.version}"

    @classmethod
    def parse(cls, text: str | None) -> Marker | None:
        if not text or "@" not in text:
            return None
        session_id, _, version = text.rpartition("@")
        return cls(session_id, int(version)) if version.isdigit() else None


def json_safe(values: Mapping[str, Any], what: str) -> dict[str, Any]:
    """`values` as JSON-ready data. A value JSON cannot hold (a callable, say) is
    stored as its representation, with a warning naming it, as ADK's own services
    store it (`make_json_safe_state`), so that one value never loses a whole event."""
    try:
        safe: dict[str, Any] = to_jsonable_python(dict(values))
    except PydanticSerializationError:
        lossy = [key for key in values if not _serializable(values[key])]
        log.warning(
            "%s %s cannot be stored as JSON: stored as their representation instead",
            what,
            ", ".join(map(repr, lossy)),
        )
        safe = to_jsonable_python(dict(values), serialize_unknown=True)
    return safe


def _serializable(value: Any) -> bool:
    try:
        to_jsonable_python(value)
    except PydanticSerializationError:
        return False
    return True


def state_deltas(state: Mapping[str, Any], what: str) -> list[pb.StateDelta]:
    """ADK's prefixed state keys as scoped deltas: "app:" the agent's, "user:" the
    session's user's, unprefixed the session's; "temp:" keys are never stored. A value
    of None is stored as JSON null, as ADK's database service stores it."""
    safe = json_safe(state, what)
    scoped: dict[pb.StateScope.ValueType, dict[str, Any]] = {}
    for key, value in safe.items():
        if key.startswith(State.TEMP_PREFIX):
            continue
        if key.startswith(State.APP_PREFIX):
            scope, name = pb.STATE_SCOPE_AGENT, key.removeprefix(State.APP_PREFIX)
        elif key.startswith(State.USER_PREFIX):
            scope, name = pb.STATE_SCOPE_USER, key.removeprefix(State.USER_PREFIX)
        else:
            scope, name = pb.STATE_SCOPE_SESSION, key
        _check_key(key, name, what)
        scoped.setdefault(scope, {})[name] = value
    return [_framework.state_delta(scope, values) for scope, values in scoped.items()]


def _check_key(key: str, name: str, what: str) -> None:
    """The service's rule for state keys (1-256 printable characters), checked before
    anything is written."""
    if not name or len(name) > _MAX_KEY or not name.isprintable():
        raise ValueError(
            f"{what} {key!r}: a state key needs 1-{_MAX_KEY} printable characters "
            "after its app:/user: prefix"
        )


def merged_state(scoped: pb.ScopedState) -> dict[str, Any]:
    """The state an ADK session shows: its own keys, then "user:" and "app:" ones."""
    state = _framework.state_values(scoped.session)
    state.update(
        {State.USER_PREFIX + k: v for k, v in _framework.state_values(scoped.user).items()}
    )
    state.update(
        {State.APP_PREFIX + k: v for k, v in _framework.state_values(scoped.agent).items()}
    )
    return state


def event_input(event: Event) -> pb.SessionEventInput:
    """An ADK event as a history message: its JSON in the content (so it reads back
    whole), the user's events as user messages, every other author's as the agent's."""
    try:
        content = event.model_dump_json(exclude_none=True)
    except PydanticSerializationError as error:
        # ADK's state_delta serializer already falls back; any other field it cannot
        # hold is the caller's mistake, refused before anything is written.
        raise ValueError(f"event {event.id!r} cannot be stored as JSON: {error}") from None
    role = pb.ROLE_USER if event.author == "user" else pb.ROLE_ASSISTANT
    message = pb.Message(role=role, content=content)
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))


def decode_event(queued: pb.QueuedMessage) -> Event:
    try:
        return Event.model_validate_json(queued.message.content)
    except (ValidationError, json.JSONDecodeError) as error:
        raise ValueError(
            f"history message at sequence {queued.sequence} is not an ADK event "
            f"(was it written by another client?): {error}"
        ) from None


def seconds(time: Timestamp) -> float:
    return time.seconds + time.nanos / 1e9
