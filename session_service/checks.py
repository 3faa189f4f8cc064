"""Input validation of the session core, as plain functions: names, ids, messages,
agents and event inputs, and the limits they are held to. Each raises
`InvalidArgument` naming the field, before anything is read or written."""

from __future__ import annotations

import re
from collections.abc import Sequence

from session_service import convert, permissions
from session_service.records import (
    Agent,
    AgentSettings,
    EventBody,
    Message,
    MessageAppended,
    OutboxQueued,
    ResetMode,
    Role,
    TaskSet,
    TempStateChanged,
)
from switchboard import pagination, validation
from switchboard.errors import InvalidArgument

_AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_SESSION_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
MAX_EVENTS_PER_APPEND = 100
MAX_MESSAGE_REF_CHARS = 256
#: An agent travels whole in GetAgent, PutMemory and GetSessionState answers; kept well
#: below gRPC's default 4 MiB receive limit so that every client can still read it.
MAX_AGENT_BYTES = 1024 * 1024
#: A session's state (inbox, outbox, task, temp state) travels whole in GetSessionState,
#: next to its agent: together they stay below that 4 MiB too.
MAX_SESSION_STATE_BYTES = 2 * 1024 * 1024
#: What logging adds to an event beyond its input, at most, in encoded bytes: the
#: sequence, time and versions, a redacted sender, and the answer's field framing.
_LOGGED_EVENT_OVERHEAD = 128
_NAMED_ROLES = frozenset(Role) - {Role.UNSPECIFIED}
_RESET_MODES = frozenset(ResetMode)
#: The longest freshness window or idle time an agent's settings take: a year and a day.
MAX_POLICY_DURATION_S = 366 * 86400.0
#: The shortest idle time before an idle reset: zero would reset at every message.
MIN_IDLE_AFTER_S = 1.0


def agent_name(field: str, value: str) -> str:
    if not _AGENT_NAME.fullmatch(value):
        raise InvalidArgument(
            field,
            f"{value[:70]!r} is not an agent name: 1-63 lower-case letters, digits, '-' or '_', "
            "starting with a letter or digit",
        )
    return value


def checked_session_id(value: str) -> str:
    if not _SESSION_ID.fullmatch(value) or ".." in value:
        raise InvalidArgument(
            "session_id",
            "must be 1-128 letters, digits, '-', '_' or '.', without '..'",
            reason="UNSAFE_ID",
        )
    return value


def refuse_unanswerable(field: str, input_sizes: Sequence[int], remedy: str) -> None:
    """Refuses, before anything is written, a write whose answer would echo events
    too big for one answer (`input_sizes`: each event's input, encoded): a client
    that could not read the answer would take a committed write for a failed one,
    and its retry would write it twice."""
    answer = sum(size + _LOGGED_EVENT_OVERHEAD for size in input_sizes)
    if answer > pagination.MAX_ANSWER_BYTES:
        raise InvalidArgument(
            field,
            f"the answer would be about {answer} bytes, more than the "
            f"{pagination.MAX_ANSWER_BYTES} every client can read: {remedy}",
            reason="ANSWER_TOO_LARGE",
        )


def checked_message(field: str, message: Message | None, max_content_bytes: int) -> Message:
    """`max_content_bytes`: the server's limit on message content (`SessionLimits`)."""
    message = message or Message()
    if message.role not in _NAMED_ROLES:
        raise InvalidArgument(f"{field}.role", "must be USER, ASSISTANT, SYSTEM or TOOL")
    size = len(message.content.encode("utf-8"))
    if size > max_content_bytes:
        raise InvalidArgument(
            f"{field}.content",
            f"is {size} bytes; this server accepts at most {max_content_bytes}",
            reason="CONTENT_TOO_LARGE",
        )
    validation.text(f"{field}.sender", message.sender, max_len=256)
    checked_message_ref(f"{field}.message_ref", message.message_ref)
    validation.text(f"{field}.tool_call_id", message.tool_call_id, max_len=256)
    for index, call in enumerate(message.tool_calls):
        validation.text(f"{field}.tool_calls[{index}].id", call.id, max_len=256, required=True)
        validation.text(f"{field}.tool_calls[{index}].name", call.name, max_len=256)
        validation.text(
            f"{field}.tool_calls[{index}].arguments",
            call.arguments,
            max_len=max_content_bytes,
            allow_newlines=True,
        )
    validation.string_map(f"{field}.metadata", message.metadata)
    return message


def checked_message_ref(field: str, value: str) -> str:
    """A platform's message id: the key an inbox accepts one post per (see
    `EventLog.accepted_post`), so every character must be one a person can read
    back in a log or an error: no control, format, separator (but the space),
    private-use or unassigned characters."""
    validation.text(field, value, max_len=MAX_MESSAGE_REF_CHARS)
    if not value.isprintable():
        raise InvalidArgument(
            field,
            "must be printable: no control, format, private-use or unassigned characters, "
            "and no separators other than the space",
        )
    return value


def checked_agent(agent: Agent) -> None:
    agent_name("agent.name", agent.name)
    validation.text("agent.display_name", agent.display_name, max_len=256)
    validation.text("agent.workspace_root", agent.workspace_root, max_len=1024)
    permissions.checked_rules("agent.permissions", agent.permissions)
    for index, peer in enumerate(agent.peers):
        agent_name(f"agent.peers[{index}]", peer)
    if agent.parent:
        agent_name("agent.parent", agent.parent)
    checked_settings(agent.settings)
    validation.string_map("agent.memory", agent.memory, max_entries=1000)
    size = convert.encoded_size(agent)
    if size > MAX_AGENT_BYTES:
        raise InvalidArgument("agent", f"is {size} bytes encoded; the limit is {MAX_AGENT_BYTES}")


def checked_settings(settings: AgentSettings | None) -> None:
    """The settings' ranges that are not durations (those are checked on the message,
    by `validation.duration`, before it becomes a record)."""
    reset = settings.reset if settings is not None else None
    if reset is None:
        return
    if reset.mode not in _RESET_MODES:
        raise InvalidArgument(
            "agent.settings.reset.mode",
            f"{int(reset.mode)} is not a ResetMode: give RESET_MODE_UNSPECIFIED (none), "
            "RESET_MODE_IDLE or RESET_MODE_DAILY",
        )
    if reset.daily_at_hour > 23:
        raise InvalidArgument(
            "agent.settings.reset.daily_at_hour",
            f"is {reset.daily_at_hour}; give an hour of the day, 0-23 (UTC)",
        )


def checked_input(index: int, body: EventBody | None, max_content_bytes: int) -> EventBody:
    """The body of an append's `index`th input (None: it had none)."""
    field = f"events[{index}]"
    if body is None:
        raise InvalidArgument(field, "has no event body")
    if isinstance(body, (MessageAppended, OutboxQueued)):
        checked_message(f"{field}.{body.kind}.message", body.message, max_content_bytes)
    elif isinstance(body, TaskSet):
        task_id, description = (body.task.task_id, body.task.description) if body.task else ("", "")
        validation.text(f"{field}.task_set.task.task_id", task_id, max_len=256)
        validation.text(
            f"{field}.task_set.task.description",
            description,
            max_len=64 * 1024,
            allow_newlines=True,
        )
    elif isinstance(body, TempStateChanged):
        validation.string_map(f"{field}.temp_state_changed.set", body.set, max_entries=1000)
    return body
