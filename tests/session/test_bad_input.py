"""Bad input to the SessionService: a clear status naming the field, and nothing written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, field_mask_pb2, timestamp_pb2

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import InProcessSession
from tests.session.conftest import create_agent, resolve, user_message, web
from tests.status import error_details

Call = Callable[[pb_grpc.SessionServiceStub, str], Any]
USER = pb.Message(role=pb.ROLE_USER, content="hi")


def _append(*events: pb.SessionEventInput, **fields: Any) -> Call:
    def call(stub: pb_grpc.SessionServiceStub, session_id: str) -> Any:
        request = {"agent": "main", "session_id": session_id, **fields}
        return stub.AppendEvents(pb.AppendEventsRequest(events=events, **request))

    return call


def _span(seconds: int, nanos: int = 0) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)


def _agent_with(update: bool = False, **policies: Any) -> Call:
    """CreateAgent (a new agent) or UpdateAgent (of "main") with these settings."""
    settings = pb.AgentSettings(**policies)

    def call(stub: pb_grpc.SessionServiceStub, _session_id: str) -> Any:
        if update:
            mask = field_mask_pb2.FieldMask(paths=["settings"])
            agent = pb.Agent(name="main", settings=settings)
            return stub.UpdateAgent(pb.UpdateAgentRequest(agent=agent, update_mask=mask))
        return stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="x", settings=settings)))

    return call


INVALID: dict[str, tuple[Call, str]] = {
    "agent name with a slash": (
        lambda stub, _s: stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="../x"))),
        "agent.name",
    ),
    "agent name too long": (
        lambda stub, _s: stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="a" * 100))),
        "agent.name",
    ),
    "rule without effect": (
        lambda stub, _s: stub.CreateAgent(
            pb.CreateAgentRequest(
                agent=pb.Agent(name="x", permissions=[pb.PermissionRule(action="a")])
            )
        ),
        "agent.permissions[0].effect",
    ),
    "empty update mask": (
        lambda stub, _s: stub.UpdateAgent(pb.UpdateAgentRequest(agent=pb.Agent(name="main"))),
        "update_mask",
    ),
    "unknown transport": (
        lambda stub, _s: resolve(stub, transport="Web!", conversation_id="x"),
        "source.transport",
    ),
    "chat without chat type": (
        lambda stub, _s: resolve(stub, transport="slack", chat_id="C1"),
        "source.chat_type",
    ),
    "traversal conversation id": (
        lambda stub, _s: resolve(stub, transport="web", conversation_id="../../etc"),
        "source.conversation_id",
    ),
    "'|' in a chat id (it would reach an obligation id through the session key)": (
        lambda stub, _s: resolve(stub, transport="slack", chat_type=pb.CHAT_TYPE_DM, chat_id="a|b"),
        "source.chat_id",
    ),
    "join with traversal id": (
        lambda stub, _s: stub.ResolveSession(
            pb.ResolveSessionRequest(agent="main", session_id="../s")
        ),
        "session_id",
    ),
    "no events": (_append(), "events"),
    "event without body": (_append(pb.SessionEventInput()), "events[0]"),
    "message without role": (
        _append(
            pb.SessionEventInput(
                message_appended=pb.MessageAppended(message=pb.Message(content="x"))
            )
        ),
        "events[0].message_appended.message.role",
    ),
    "unknown role": (
        _append(
            pb.SessionEventInput(
                message_appended=pb.MessageAppended(message=pb.Message(role=42, content="x"))  # type: ignore[arg-type]
            )
        ),
        "events[0].message_appended.message.role",
    ),
    "10 MB message": (
        _append(
            pb.SessionEventInput(
                message_appended=pb.MessageAppended(
                    message=pb.Message(role=pb.ROLE_USER, content="x" * 10_000_000)
                )
            )
        ),
        "events[0].message_appended.message.content",
    ),
    "too many events": (_append(*[user_message("x")] * 101), "events"),
    "unknown status filter": (
        lambda stub, _s: stub.ListSessions(pb.ListSessionsRequest(agent="main", status=9)),  # type: ignore[arg-type]
        "status",
    ),
    "garbage page token": (
        lambda stub, _s: stub.ListSessions(pb.ListSessionsRequest(agent="main", page_token="zzz")),
        "page_token",
    ),
    "history after a sequence beyond int64": (
        lambda stub, s: stub.GetHistory(
            pb.GetHistoryRequest(agent="main", session_id=s, after_sequence=2**64 - 1)
        ),
        "after_sequence",
    ),
    "watch after a sequence beyond int64": (
        lambda stub, _s: next(stub.WatchEvents(pb.WatchEventsRequest(after_sequence=2**63))),
        "after_sequence",
    ),
    "memory without key": (
        lambda stub, _s: stub.PutMemory(pb.PutMemoryRequest(agent="main", key="", value="v")),
        "key",
    ),
    "fork narrowing rule with a control character": (
        lambda stub, s: stub.ForkSession(
            pb.ForkSessionRequest(
                agent="main",
                session_id=s,
                narrowing=pb.Narrowing(
                    rules=[pb.PermissionRule(effect=pb.PERMISSION_EFFECT_ALLOW, action="a\x07")]
                ),
            )
        ),
        "narrowing.rules[0].action",
    ),
    "chat ids giving a routing key over 512 characters": (
        lambda stub, _s: resolve(
            stub,
            transport="slack",
            chat_type=pb.CHAT_TYPE_CHANNEL,
            scope_id="T" * 200,
            chat_id="C" * 200,
            thread_id="1" * 200,
        ),
        "source",
    ),
    "rewind to a checkpoint label with NUL": (
        lambda stub, _s: stub.Rewind(pb.RewindRequest(checkpoint="cp\x00")),
        "checkpoint",
    ),
    "agent over 1 MiB": (
        lambda stub, _s: stub.CreateAgent(
            pb.CreateAgentRequest(
                agent=pb.Agent(name="big", memory={f"k{i}": "v" * 4096 for i in range(300)})
            )
        ),
        "agent",
    ),
    "inbox message without role": (
        lambda stub, s: stub.PostToInbox(
            pb.PostToInboxRequest(agent="main", session_id=s, message=pb.Message(content="x"))
        ),
        "message.role",
    ),
    # Dangerous operator calls: an unset field (which reads as 0) empties nothing.
    "checkout without a sequence": (
        lambda stub, _s: stub.Checkout(pb.CheckoutRequest()),
        "sequence",
    ),
    "checkout preview without a sequence": (
        lambda stub, _s: stub.Checkout(pb.CheckoutRequest(preview=True)),
        "sequence",
    ),
    "checkout of a sequence with empty_log": (
        lambda stub, _s: stub.Checkout(pb.CheckoutRequest(sequence=1, empty_log=True)),
        "empty_log",
    ),
    "rewind without a target": (lambda stub, _s: stub.Rewind(pb.RewindRequest()), "target"),
    "rewind to sequence 0 without empty_log": (
        lambda stub, _s: stub.Rewind(pb.RewindRequest(sequence=0)),
        "sequence",
    ),
    "rewind to a checkpoint with empty_log": (
        lambda stub, _s: stub.Rewind(pb.RewindRequest(checkpoint="cp", empty_log=True)),
        "empty_log",
    ),
    "truncate without below_sequence": (
        lambda stub, _s: stub.TruncateLog(pb.TruncateLogRequest()),
        "below_sequence",
    ),
    # Agent settings: every duration and range.
    "idle_after of -1 s": (
        _agent_with(reset=pb.ResetPolicy(mode=pb.RESET_MODE_IDLE, idle_after=_span(-1))),
        "agent.settings.reset.idle_after",
    ),
    "idle_after of 0 (a reset at every message)": (
        _agent_with(reset=pb.ResetPolicy(mode=pb.RESET_MODE_IDLE, idle_after=_span(0))),
        "agent.settings.reset.idle_after",
    ),
    "idle_after with nanos past a second": (
        _agent_with(reset=pb.ResetPolicy(idle_after=_span(60, 2_000_000_000))),
        "agent.settings.reset.idle_after",
    ),
    "idle_after of seconds and nanos with opposite signs": (
        _agent_with(reset=pb.ResetPolicy(idle_after=_span(60, -1))),
        "agent.settings.reset.idle_after",
    ),
    "idle_after over a year and a day": (
        _agent_with(reset=pb.ResetPolicy(idle_after=_span(366 * 86400 + 1))),
        "agent.settings.reset.idle_after",
    ),
    "daily_at_hour 99": (
        _agent_with(reset=pb.ResetPolicy(mode=pb.RESET_MODE_DAILY, daily_at_hour=99)),
        "agent.settings.reset.daily_at_hour",
    ),
    "daily_at_hour 24 in an update": (
        _agent_with(reset=pb.ResetPolicy(mode=pb.RESET_MODE_DAILY, daily_at_hour=24), update=True),
        "agent.settings.reset.daily_at_hour",
    ),
    "unknown reset mode": (
        _agent_with(reset=pb.ResetPolicy(mode=7)),  # type: ignore[arg-type]
        "agent.settings.reset.mode",
    ),
    "freshness_window of -1 s": (
        _agent_with(resume=pb.ResumePolicy(freshness_window=_span(-1))),
        "agent.settings.resume.freshness_window",
    ),
    "freshness_window of seconds and nanos with opposite signs": (
        _agent_with(resume=pb.ResumePolicy(freshness_window=_span(-5, 5)), update=True),
        "agent.settings.resume.freshness_window",
    ),
    "freshness_window beyond a Duration's range": (
        _agent_with(resume=pb.ResumePolicy(freshness_window=_span(2**62))),
        "agent.settings.resume.freshness_window",
    ),
    "an update's ignored create_time beyond the year 9999": (
        lambda stub, _s: stub.UpdateAgent(
            pb.UpdateAgentRequest(
                agent=pb.Agent(name="main", create_time=timestamp_pb2.Timestamp(seconds=10**12)),
                update_mask=field_mask_pb2.FieldMask(paths=["display_name"]),
            )
        ),
        "agent.create_time",
    ),
}


def _head(service: InProcessSession) -> int:
    store = service.unit.store
    with store.database.connection_context():
        return store.log.head()


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_argument_names_the_field_and_writes_nothing(
    service: InProcessSession, case: str
) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    before = _head(service)
    call, field = INVALID[case]
    with pytest.raises(grpc.RpcError) as refused:
        call(service.stub, session_id)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert error_details(refused.value)[1] == [field]
    assert _head(service) == before


def test_settings_at_the_edges_of_their_ranges_are_accepted(service: InProcessSession) -> None:
    shortest = pb.AgentSettings(
        resume=pb.ResumePolicy(freshness_window=_span(0)),
        reset=pb.ResetPolicy(mode=pb.RESET_MODE_DAILY, idle_after=_span(1), daily_at_hour=23),
    )
    assert create_agent(service.stub, "edges", settings=shortest).settings == shortest
    year_and_day = _span(366 * 86400)
    longest = pb.AgentSettings(
        resume=pb.ResumePolicy(freshness_window=year_and_day),
        reset=pb.ResetPolicy(mode=pb.RESET_MODE_IDLE, idle_after=year_and_day),
    )
    updated = service.stub.UpdateAgent(
        pb.UpdateAgentRequest(
            agent=pb.Agent(name="edges", settings=longest),
            update_mask=field_mask_pb2.FieldMask(paths=["settings"]),
        )
    ).agent
    assert updated.settings == longest


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (
            lambda stub: stub.AppendEvents(
                pb.AppendEventsRequest(
                    agent="main", session_id="s_unknown", events=[user_message("x")]
                )
            ),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            lambda stub: stub.GetHistory(pb.GetHistoryRequest(agent="main", session_id="nope")),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            lambda stub: stub.UpdateAgent(
                pb.UpdateAgentRequest(
                    agent=pb.Agent(name="ghost"),
                    update_mask=field_mask_pb2.FieldMask(paths=["display_name"]),
                )
            ),
            grpc.StatusCode.NOT_FOUND,
        ),
    ],
)
def test_unknown_things_are_not_found(
    service: InProcessSession, call: Callable[[Any], Any], code: grpc.StatusCode
) -> None:
    create_agent(service.stub)
    before = _head(service)
    with pytest.raises(grpc.RpcError) as refused:
        call(service.stub)
    assert refused.value.code() == code
    assert _head(service) == before


def test_appending_to_an_ended_session_is_failed_precondition(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    service.stub.EndSession(pb.EndSessionRequest(agent="main", session_id=session_id))
    before = _head(service)
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.AppendEvents(
            pb.AppendEventsRequest(agent="main", session_id=session_id, events=[user_message("x")])
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_details(refused.value)[0].reason == "SESSION_ENDED"
    assert _head(service) == before


def test_an_error_quoting_huge_input_is_cut_to_fit_the_trailers(
    service: InProcessSession,
) -> None:
    """gRPC refuses trailers over 16 KiB: a message quoting the request in full would
    reach the caller as RESOURCE_EXHAUSTED without its reason."""
    create_agent(service.stub)
    path = "\N{GRINNING FACE}" * 5000
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.UpdateAgent(
            pb.UpdateAgentRequest(
                agent=pb.Agent(name="main"), update_mask=field_mask_pb2.FieldMask(paths=[path])
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(refused.value)[1] == ["update_mask"]
    message = str(refused.value.details())
    assert message.startswith("update_mask: ")
    assert len(message.encode()) <= 1100 and "more characters)" in message


def test_memory_that_would_outgrow_the_agent_is_refused_and_kept_readable(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    value = "v" * 60_000
    puts = 0
    with pytest.raises(grpc.RpcError) as refused:
        for puts in range(40):
            service.stub.PutMemory(pb.PutMemoryRequest(agent="main", key=f"k{puts}", value=value))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_details(refused.value)[0].reason == "AGENT_TOO_LARGE"
    memory = service.stub.GetAgent(pb.GetAgentRequest(name="main")).agent.memory
    assert sorted(memory) == sorted(f"k{i}" for i in range(puts))
    # Deleting makes room again.
    service.stub.DeleteMemory(pb.DeleteMemoryRequest(agent="main", key="k0"))
    service.stub.PutMemory(pb.PutMemoryRequest(agent="main", key="again", value=value))
