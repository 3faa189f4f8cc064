"""The session core's values: plain dataclasses, one per message the core keeps.

They mirror the `switchboard.session.v1` messages field by field (same names,
same defaults), so that `session_service.convert` maps the two mechanically and a
field added to the proto without one here fails `tests/session/test_records.py`.
The core folds, checks and stores these; protobuf lives only at the edges (the
servicer, `convert` and `storage_format`).

Conventions, chosen so that a message survives pb -> record -> pb byte for byte:
- a singular message field is `X | None`: None is "not set" (proto presence);
- a `google.protobuf.Timestamp` or `Duration` is an `int | None` of nanoseconds;
- a `google.protobuf.FieldMask` is a `list[str] | None` of its paths;
- enums are `IntEnum`s with the proto's numbers (`OpenEnum` keeps numbers a newer
  client sent that this release does not name, as proto3 does);
- the `Event.body` oneof is `Event.body`, an `EventBody` subclass whose `kind` is
  the oneof field's name (what the log's `kind` column and `event_types` filters hold).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar


class OpenEnum(IntEnum):
    """An enum that, like a proto3 enum, holds numbers it has no name for."""

    @classmethod
    def _missing_(cls, value: object) -> OpenEnum | None:
        if not isinstance(value, int):
            return None
        member = int.__new__(cls, value)
        member._name_ = f"UNKNOWN_{value}"
        member._value_ = value
        return member


class ResetMode(OpenEnum):
    UNSPECIFIED = 0
    IDLE = 1
    DAILY = 2


class PermissionEffect(OpenEnum):
    UNSPECIFIED = 0
    ALLOW = 1
    DENY = 2


class ChatType(OpenEnum):
    UNSPECIFIED = 0
    DM = 1
    GROUP = 2
    CHANNEL = 3
    THREAD = 4


class SessionStatus(OpenEnum):
    UNSPECIFIED = 0
    OPEN = 1
    ENDED = 2


class Role(OpenEnum):
    UNSPECIFIED = 0
    USER = 1
    ASSISTANT = 2
    SYSTEM = 3
    TOOL = 4


class LogBranch(OpenEnum):
    UNSPECIFIED = 0
    ACTIVE = 1
    ABANDONED = 2


class StateScope(OpenEnum):
    UNSPECIFIED = 0
    SESSION = 1
    USER = 2
    AGENT = 3


# -- agents ---------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class RoutingPolicy:
    shared_group_sessions: bool = False
    per_user_thread_sessions: bool = False


@dataclass(slots=True, kw_only=True)
class ResumePolicy:
    freshness_window: int | None = None  # nanoseconds
    never_resume: bool = False


@dataclass(slots=True, kw_only=True)
class ResetPolicy:
    mode: ResetMode = ResetMode.UNSPECIFIED
    idle_after: int | None = None  # nanoseconds
    daily_at_hour: int = 0


@dataclass(slots=True, kw_only=True)
class AgentSettings:
    redact_pii: bool = False
    routing: RoutingPolicy | None = None
    resume: ResumePolicy | None = None
    reset: ResetPolicy | None = None


@dataclass(slots=True, kw_only=True)
class PermissionRule:
    effect: PermissionEffect = PermissionEffect.UNSPECIFIED
    action: str = ""
    resource: str = ""


@dataclass(slots=True, kw_only=True)
class Narrowing:
    rules: list[PermissionRule] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class Agent:
    name: str = ""
    display_name: str = ""
    memory: dict[str, str] = field(default_factory=dict)
    permissions: list[PermissionRule] = field(default_factory=list)
    workspace_root: str = ""
    peers: list[str] = field(default_factory=list)
    settings: AgentSettings | None = None
    archived: bool = False
    version: int = 0
    last_sequence: int = 0
    create_time: int | None = None  # nanoseconds since the epoch
    update_time: int | None = None
    parent: str = ""


# -- sessions -------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Lineage:
    parent_session_id: str = ""
    parent_agent: str = ""
    forked_at_sequence: int = 0
    delegated: bool = False
    shares_parent_history: bool = False


@dataclass(slots=True, kw_only=True)
class Source:
    transport: str = ""
    conversation_id: str = ""
    chat_type: ChatType = ChatType.UNSPECIFIED
    chat_id: str = ""
    thread_id: str = ""
    user_id: str = ""
    scope_id: str = ""
    from_agent: str = ""


@dataclass(slots=True, kw_only=True)
class Session:
    session_id: str = ""
    agent: str = ""
    routing_key: str = ""
    source: Source | None = None
    status: SessionStatus = SessionStatus.UNSPECIFIED
    end_reason: str = ""
    version: int = 0
    last_sequence: int = 0
    message_count: int = 0
    create_time: int | None = None  # nanoseconds since the epoch
    update_time: int | None = None
    create_sequence: int = 0
    lineage: Lineage | None = None
    narrowing: list[Narrowing] = field(default_factory=list)
    resume_pending: bool = False
    resume_marked_time: int | None = None
    suspended: bool = False
    resume_holder: str = ""
    reply_target: bytes = b""  # sealed by a gateway; opaque here


@dataclass(slots=True, kw_only=True)
class ToolCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(slots=True, kw_only=True)
class Message:
    role: Role = Role.UNSPECIFIED
    content: str = ""
    sender: str = ""
    message_ref: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class Task:
    task_id: str = ""
    description: str = ""


@dataclass(slots=True, kw_only=True)
class QueuedMessage:
    sequence: int = 0
    message: Message | None = None
    abandoned: bool = False


@dataclass(slots=True, kw_only=True)
class SessionState:
    session: Session | None = None
    inbox: list[QueuedMessage] = field(default_factory=list)
    outbox: list[QueuedMessage] = field(default_factory=list)
    current_task: Task | None = None
    temp_state: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class Checkpoint:
    label: str = ""
    sequence: int = 0
    create_time: int | None = None  # nanoseconds since the epoch


# -- events ---------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class EventBody:
    """What an event says; `kind` is its `Event.body` oneof field's name."""

    kind: ClassVar[str] = ""


@dataclass(slots=True, kw_only=True)
class AgentCreated(EventBody):
    kind: ClassVar[str] = "agent_created"
    agent: Agent | None = None


@dataclass(slots=True, kw_only=True)
class AgentUpdated(EventBody):
    kind: ClassVar[str] = "agent_updated"
    agent: Agent | None = None
    update_mask: list[str] | None = None  # a FieldMask's paths


@dataclass(slots=True, kw_only=True)
class MemoryPut(EventBody):
    kind: ClassVar[str] = "memory_put"
    key: str = ""
    value: str = ""


@dataclass(slots=True, kw_only=True)
class MemoryDeleted(EventBody):
    kind: ClassVar[str] = "memory_deleted"
    key: str = ""


@dataclass(slots=True, kw_only=True)
class AgentArchived(EventBody):
    kind: ClassVar[str] = "agent_archived"


@dataclass(slots=True, kw_only=True)
class SessionOpened(EventBody):
    kind: ClassVar[str] = "session_opened"
    session_id: str = ""
    routing_key: str = ""
    source: Source | None = None
    temp_state: dict[str, str] = field(default_factory=dict)
    lineage: Lineage | None = None
    narrowing: list[Narrowing] = field(default_factory=list)
    task: Task | None = None
    inherited_message_count: int = 0


@dataclass(slots=True, kw_only=True)
class SessionEnded(EventBody):
    kind: ClassVar[str] = "session_ended"
    reason: str = ""


@dataclass(slots=True, kw_only=True)
class MessageAppended(EventBody):
    kind: ClassVar[str] = "message_appended"
    message: Message | None = None


@dataclass(slots=True, kw_only=True)
class InboxPosted(EventBody):
    kind: ClassVar[str] = "inbox_posted"
    message: Message | None = None


@dataclass(slots=True, kw_only=True)
class InboxDrained(EventBody):
    kind: ClassVar[str] = "inbox_drained"
    through_sequence: int = 0


@dataclass(slots=True, kw_only=True)
class OutboxQueued(EventBody):
    kind: ClassVar[str] = "outbox_queued"
    message: Message | None = None


@dataclass(slots=True, kw_only=True)
class OutboxAcked(EventBody):
    kind: ClassVar[str] = "outbox_acked"
    through_sequence: int = 0


@dataclass(slots=True, kw_only=True)
class TaskSet(EventBody):
    kind: ClassVar[str] = "task_set"
    task: Task | None = None


@dataclass(slots=True, kw_only=True)
class TaskCleared(EventBody):
    kind: ClassVar[str] = "task_cleared"


@dataclass(slots=True, kw_only=True)
class TempStateChanged(EventBody):
    kind: ClassVar[str] = "temp_state_changed"
    set: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class Rewound(EventBody):
    kind: ClassVar[str] = "rewound"
    to_sequence: int = 0
    checkout: bool = False
    checkpoint: str = ""
    principal: str = ""


@dataclass(slots=True, kw_only=True)
class PermissionChecked(EventBody):
    kind: ClassVar[str] = "permission_checked"
    action: str = ""
    resource: str = ""
    allowed: bool = False
    rule: str = ""
    reason: str = ""


@dataclass(slots=True, kw_only=True)
class ResumeMarked(EventBody):
    kind: ClassVar[str] = "resume_marked"
    pending: bool = False
    holder: str = ""
    reply_target: bytes = b""


@dataclass(slots=True, kw_only=True)
class SuspensionChanged(EventBody):
    kind: ClassVar[str] = "suspension_changed"
    suspended: bool = False


@dataclass(slots=True, kw_only=True)
class RewindApplied(EventBody):
    kind: ClassVar[str] = "rewind_applied"
    rewind_sequence: int = 0


@dataclass(slots=True, kw_only=True)
class OperatorAction(EventBody):
    kind: ClassVar[str] = "operator_action"
    principal: str = ""
    action: str = ""
    subject: str = ""
    detail: str = ""


@dataclass(slots=True, kw_only=True)
class MessagesRetracted(EventBody):
    kind: ClassVar[str] = "messages_retracted"
    sequences: list[int] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class StateChanged(EventBody):
    kind: ClassVar[str] = "state_changed"
    scope: StateScope = StateScope.UNSPECIFIED
    user_id: str = ""
    set: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class StoredRecord:
    kind: str = ""
    namespace: str = ""
    key: str = ""
    parent_key: str = ""
    metadata: str = ""
    payload: bytes = b""
    labels: dict[str, str] = field(default_factory=dict)
    erased: bool = False
    session_id: str = ""
    sequence: int = 0
    payload_size: int = 0


@dataclass(slots=True, kw_only=True)
class RecordsPut(EventBody):
    kind: ClassVar[str] = "records_put"
    records: list[StoredRecord] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class Erased(EventBody):
    kind: ClassVar[str] = "erased"


@dataclass(slots=True, kw_only=True)
class Erasure(EventBody):
    kind: ClassVar[str] = "erasure"
    agent: str = ""
    session_id: str = ""
    whole_session: bool = False
    record_kind: str = ""
    erased_events: int = 0
    erased_records: int = 0
    principal: str = ""


#: Every body kind, as `Event.body` may hold it (the converter maps exactly these).
EVENT_BODIES: tuple[type[EventBody], ...] = (
    AgentCreated, AgentUpdated, MemoryPut, MemoryDeleted, AgentArchived,
    SessionOpened, SessionEnded, MessageAppended, InboxPosted, InboxDrained,
    OutboxQueued, OutboxAcked, TaskSet, TaskCleared, TempStateChanged,
    Rewound, PermissionChecked, ResumeMarked, SuspensionChanged, RewindApplied,
    OperatorAction, MessagesRetracted, StateChanged, RecordsPut, Erased, Erasure,
)  # fmt: skip

#: The bodies that carry a message (whose sender may be a person's id).
CARRYING_MESSAGES = (MessageAppended, InboxPosted, OutboxQueued)


@dataclass(slots=True, kw_only=True)
class Event:
    """One logged change: the envelope the log gives it, and its body."""

    body: EventBody
    sequence: int = 0
    agent: str = ""
    session_id: str = ""
    session_version: int = 0
    time: int | None = None  # nanoseconds since the epoch, set when logged
    agent_version: int = 0


@dataclass(slots=True, frozen=True)
class EventInput:
    """One input of an append, as the edge received it: its body (None: it gave none)
    and its size encoded, which bounds the answer echoing it."""

    body: EventBody | None
    size: int
