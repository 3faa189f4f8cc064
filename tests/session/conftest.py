from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from session_service import convert, records
from session_service.core import SessionLimits
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, InProcessSession, session_server

StartSession = Callable[..., InProcessSession]


@pytest.fixture
def start_session(database_url: str, loop_thread: EventLoopThread) -> Iterator[StartSession]:
    """Starts SessionService servers on the test's database (several may share it)."""
    with ExitStack() as stack:

        def start(limits: SessionLimits | None = None) -> InProcessSession:
            return stack.enter_context(session_server(loop_thread, database_url, limits))

        yield start


@pytest.fixture
def service(start_session: StartSession) -> InProcessSession:
    return start_session()


def create_agent(stub: pb_grpc.SessionServiceStub, name: str = "main", **fields: Any) -> pb.Agent:
    return stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name=name, **fields))).agent


def resolve(
    stub: pb_grpc.SessionServiceStub, agent: str = "main", **source: Any
) -> pb.ResolveSessionResponse:
    return stub.ResolveSession(pb.ResolveSessionRequest(agent=agent, source=pb.Source(**source)))


def web(conversation_id: str = "tab-1") -> dict[str, Any]:
    return {"transport": "web", "conversation_id": conversation_id}


def user_message(text: str) -> pb.SessionEventInput:
    return pb.SessionEventInput(
        message_appended=pb.MessageAppended(message=pb.Message(role=pb.ROLE_USER, content=text))
    )


def append(
    stub: pb_grpc.SessionServiceStub,
    session_id: str,
    *events: pb.SessionEventInput,
    agent: str = "main",
    expected_version: int | None = None,
) -> pb.AppendEventsResponse:
    request = pb.AppendEventsRequest(agent=agent, session_id=session_id, events=events)
    if expected_version is not None:
        request.expected_version = expected_version
    return stub.AppendEvents(request)


def as_record(message: Any) -> Any:
    """The core's record of a message (for tests calling the core's pure functions)."""
    return convert.to_record(getattr(records, type(message).__name__), message)
