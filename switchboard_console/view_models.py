"""What the pages show of the services' messages: plain values for the templates and
for the live tail's JSON, each computed once per message."""

from __future__ import annotations

import datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb

#: Event kinds by what they concern, for colours and legends.
KIND_GROUPS = {
    "agent": ("agent_created", "agent_updated", "memory_put", "memory_deleted", "agent_archived"),
    "lifecycle": ("session_opened", "session_ended", "suspension_changed", "resume_marked"),
    "message": ("message_appended",),
    "queue": ("inbox_posted", "inbox_drained", "outbox_queued", "outbox_acked"),
    "task": ("task_set", "task_cleared", "temp_state_changed"),
    "permission": ("permission_checked",),
    "travel": ("rewound", "rewind_applied"),
    "audit": ("operator_action",),
}
_GROUP_OF = {kind: group for group, kinds in KIND_GROUPS.items() for kind in kinds}

STATE_NAMES = {
    dpb.OBLIGATION_STATE_PENDING: "pending",
    dpb.OBLIGATION_STATE_ATTEMPTING: "attempting",
    dpb.OBLIGATION_STATE_DELIVERED: "delivered",
    dpb.OBLIGATION_STATE_FAILED: "failed",
    dpb.OBLIGATION_STATE_ABANDONED: "abandoned",
}
STATES_BY_NAME = {name: state for state, name in STATE_NAMES.items()}
ROLE_NAMES = {
    pb.ROLE_USER: "user",
    pb.ROLE_ASSISTANT: "assistant",
    pb.ROLE_SYSTEM: "system",
    pb.ROLE_TOOL: "tool",
}


def kind_of(event: pb.Event) -> str:
    return event.WhichOneof("body") or "unknown"


def group_of(kind: str) -> str:
    return _GROUP_OF.get(kind, "other")


def when(stamp: Timestamp) -> str:
    """A timestamp as people read it (UTC, to the second); "" when unset."""
    if not stamp.seconds and not stamp.nanos:
        return ""
    moment = datetime.datetime.fromtimestamp(stamp.seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def describe(event: pb.Event) -> str:
    """One line saying what an event did."""
    kind = kind_of(event)
    if kind == "rewound":
        moved = event.rewound
        verb = "checkout" if moved.checkout else "rewind"
        label = f" ({moved.checkpoint})" if moved.checkpoint else ""
        who = f" by {moved.principal}" if moved.principal else ""
        return f"{verb} to {moved.to_sequence}{label}{who}"
    if kind == "operator_action":
        action = event.operator_action
        who = action.principal or "(authentication off)"
        detail = f" ({action.detail})" if action.detail else ""
        return f"{action.action} by {who}: {action.subject}{detail}"
    if kind == "message_appended":
        message = event.message_appended.message
        return f"{ROLE_NAMES.get(message.role, 'message')}: {message.content[:80]}"
    if kind == "permission_checked":
        decision = event.permission_checked
        verdict = "allowed" if decision.allowed else "denied"
        return f"{decision.action} on {decision.resource}: {verdict}"
    return kind.replace("_", " ")


def event_summary(event: pb.Event, *, abandoned: bool) -> dict[str, Any]:
    """An event as the timeline and the live tail place it."""
    kind = kind_of(event)
    summary: dict[str, Any] = {
        "seq": event.sequence,
        "agent": event.agent,
        "session": event.session_id,
        "kind": kind,
        "group": group_of(kind),
        "text": describe(event),
        "time": when(event.time),
        "abandoned": abandoned,
    }
    if kind == "rewound":
        summary["to"] = event.rewound.to_sequence
        summary["checkout"] = event.rewound.checkout
    return summary


def obligation_row(row: dpb.Obligation) -> dict[str, Any]:
    return {
        "id": row.id,
        "state": STATE_NAMES.get(row.state, "unknown"),
        "platform": row.platform,
        "gateway": row.gateway_name,
        "agent": row.agent,
        "session_key": row.session_key,
        "session_id": row.metadata.get("session_id", ""),
        "owner": row.owner_instance_id,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "content": row.content[:120],
        "created": when(row.create_time),
        "updated": when(row.update_time),
    }
