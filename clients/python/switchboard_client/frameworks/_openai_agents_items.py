"""OpenAI Agents items as Switchboard history messages, and back.

An item is stored whole, as its JSON text in the content of one history message
(a MessageAppended event), so that a rewind or checkout of the log moves it like
any turn. The message's role follows the item's (a tool's output is TOOL, other
items without a role, such as function calls and reasoning, are ASSISTANT's) so
that the console and other clients read the conversation sensibly; a metadata
mark tells an item from a message written by someone else (a gateway), which is
read back as an easy input message of its role and text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from switchboard.session.v1 import session_service_pb2 as pb

#: Metadata key and value marking a message as a stored item (its content is JSON).
ITEM_MARK = ("openai_agents.item", "json")

_ROLES: Mapping[str, pb.Role.ValueType] = {
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_SYSTEM,
}
_ROLE_NAMES: Mapping[pb.Role.ValueType, str] = {
    pb.ROLE_USER: "user",
    pb.ROLE_ASSISTANT: "assistant",
    pb.ROLE_SYSTEM: "system",
}


def item_text(item: object, position: int) -> str:
    """The item's JSON text; TypeError or ValueError (as `SQLiteSession`'s json.dumps
    raises) naming the item, before anything is written."""
    if not isinstance(item, Mapping):
        raise TypeError(
            f"items[{position}] is a {type(item).__name__}; a session item is a dict "
            "(a TResponseInputItem, e.g. {'role': 'user', 'content': 'hi'})"
        )
    try:
        return json.dumps(item, allow_nan=False)
    except TypeError as exc:
        raise TypeError(f"items[{position}] is not JSON-serialisable: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"items[{position}] is not valid JSON: {exc}") from exc


def _role_of(item: Mapping[str, Any]) -> pb.Role.ValueType:
    role = item.get("role")
    if isinstance(role, str) and role in _ROLES:
        return _ROLES[role]
    kind = item.get("type")
    if isinstance(kind, str) and kind.endswith("_output"):
        return pb.ROLE_TOOL
    return pb.ROLE_ASSISTANT


def item_event(item: Mapping[str, Any], text: str) -> pb.SessionEventInput:
    """The history message holding one item (`text`: its JSON, from `item_text`)."""
    message = pb.Message(role=_role_of(item), content=text, metadata=dict([ITEM_MARK]))
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))


def item_of(message: pb.Message) -> dict[str, Any] | None:
    """The item a history message holds; None for one that holds none (a stored item
    whose JSON is not an object, a foreign tool message)."""
    if message.metadata.get(ITEM_MARK[0]) == ITEM_MARK[1]:
        try:
            item = json.loads(message.content)
        except json.JSONDecodeError:
            return None
        return item if isinstance(item, dict) else None
    role = _ROLE_NAMES.get(message.role)
    return None if role is None else {"role": role, "content": message.content}
