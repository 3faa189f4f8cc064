"""Follow-ups of the fuzzer's huge values: state built from values that are each within
their field's limit could grow an answer past what a default gRPC client receives
(4 MiB), and the client got RESOURCE_EXHAUSTED instead of the answer.

Every call here is valid. The contract is the fuzz tests' one: a success the caller
can read, or a clear status with an ErrorInfo. These were server bugs; each test
is now a regression test that also checks nothing is lost on the way (every row or
message is still reached by paging on).
"""

from __future__ import annotations

from typing import Any, Final

import pytest
from google.protobuf.message import Message

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as spb
from tests.fuzz.checks import Answer, call, check_answer
from tests.harness import EventLoopThread, Gateway, delivery_server, session_server

pytestmark = [pytest.mark.fuzz]

SESSION: Final = spb.DESCRIPTOR.services_by_name["SessionService"]
DELIVERY: Final = dpb.DESCRIPTOR.services_by_name["DeliveryService"]
#: The largest memory value PutMemory accepts (64 Ki characters), 4 bytes each.
BIG_VALUE: Final = "\N{GRINNING FACE}" * (64 * 1024)
#: A reply just under the 256 KiB content limit.
BIG_REPLY: Final = "x" * 250_000


def _answer(stub: Any, service: Any, rpc: str, request: Message) -> Answer:
    """Calls; asserts the answer is readable or a clear refusal."""
    answer = call(stub, service.methods_by_name[rpc], request)
    check_answer(rpc, request, answer)
    return answer


def _answered(stub: Any, service: Any, rpc: str, request: Message) -> bool:
    """Calls; asserts the answer is readable or a clear refusal; whether it succeeded."""
    return _answer(stub, service, rpc, request).error is None


def test_agent_memory_cannot_outgrow_its_answers(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with session_server(loop_thread, database_url) as service:
        stub = service.stub
        stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")))
        stored = 0
        for index in range(20):
            put = spb.PutMemoryRequest(agent="main", key=f"k{index}", value=BIG_VALUE)
            if not _answered(stub, SESSION, "PutMemory", put):
                break  # refused clearly: the agent must still be readable
            stored += 1
        assert 0 < stored < 17, "PutMemory must refuse before the agent outgrows 4 MiB"
        assert _answered(stub, SESSION, "GetAgent", spb.GetAgentRequest(name="main"))
        agent = stub.GetAgent(spb.GetAgentRequest(name="main")).agent
        assert sorted(agent.memory) == sorted(f"k{index}" for index in range(stored))


def test_default_history_page_is_readable(database_url: str, loop_thread: EventLoopThread) -> None:
    with session_server(loop_thread, database_url) as service:
        stub = service.stub
        stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")))
        session_id = stub.SpawnSession(spb.SpawnSessionRequest(agent="main")).session.session_id
        message = spb.Message(role=spb.ROLE_USER, content=BIG_REPLY)
        event = spb.SessionEventInput(message_appended=spb.MessageAppended(message=message))
        for _ in range(2):
            stub.AppendEvents(
                spb.AppendEventsRequest(agent="main", session_id=session_id, events=[event] * 9)
            )
        history = spb.GetHistoryRequest(agent="main", session_id=session_id)
        assert _answered(stub, SESSION, "GetHistory", history)
        newest = spb.GetHistoryRequest(agent="main", session_id=session_id, newest=True)
        assert _answered(stub, SESSION, "GetHistory", newest)
        # Paging on after the last sequence served reaches every message exactly once.
        sequences: list[int] = []
        while True:
            page = stub.GetHistory(
                spb.GetHistoryRequest(
                    agent="main", session_id=session_id, after_sequence=max(sequences, default=0)
                )
            ).messages
            if not page:
                break
            assert len(page) < 18, "a page of 18 such messages cannot fit one answer"
            sequences += [message.sequence for message in page]
        assert len(sequences) == len(set(sequences)) == 18
        tail = stub.GetHistory(newest).messages
        assert tail[-1].sequence == sequences[-1], "a newest page keeps the newest message"


def test_session_state_cannot_outgrow_its_answer(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    """GetSessionState carries the whole inbox next to the agent: unanswered posts of
    large messages are refused before it would pass 4 MiB, and draining makes room."""
    with session_server(loop_thread, database_url) as service:
        stub = service.stub
        stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")))
        session_id = stub.SpawnSession(spb.SpawnSessionRequest(agent="main")).session.session_id
        message = spb.Message(role=spb.ROLE_USER, content=BIG_REPLY)
        post = spb.PostToInboxRequest(agent="main", session_id=session_id, message=message)
        accepted = 0
        while _answered(stub, SESSION, "PostToInbox", post):
            accepted += 1
            assert accepted < 17, "the inbox outgrew what GetSessionState can answer"
        state_request = spb.GetSessionStateRequest(agent="main", session_id=session_id)
        assert _answered(stub, SESSION, "GetSessionState", state_request)
        inbox = stub.GetSessionState(state_request).state.inbox
        assert len(inbox) == accepted > 1, "every accepted post is in the inbox"
        drained = spb.SessionEventInput(
            inbox_drained=spb.InboxDrained(through_sequence=inbox[-1].sequence)
        )
        stub.AppendEvents(
            spb.AppendEventsRequest(agent="main", session_id=session_id, events=[drained])
        )
        assert _answered(stub, SESSION, "PostToInbox", post), "draining made room"


def _orphans(stub: Any, count: int) -> Gateway:
    """`count` big replies recorded by an instance that then died; a live claimer."""
    dead = Gateway(stub)
    for index in range(count):
        dead.record(content=f"{index}{BIG_REPLY}", message_ref=f"m{index}")
    dead.die()
    return Gateway(stub)


def test_claimed_rows_reach_the_claimer(database_url: str, loop_thread: EventLoopThread) -> None:
    with delivery_server(loop_thread, database_url) as delivery:
        claimer = _orphans(delivery.stub, 18)
        claim = dpb.ClaimRecoverableRequest(instance_id=claimer.instance_id)
        answer = _answer(delivery.stub, DELIVERY, "ClaimRecoverable", claim)
        assert isinstance(answer.response, dpb.ClaimRecoverableResponse)
        first = [row.id for row in answer.response.obligations]
        assert 0 < len(first) < 18, "18 such rows cannot fit one answer"
        # What did not fit stays claimable: calling again reaches every row once.
        claimed = list(first)
        while batch := [row.id for row in claimer.claim().obligations]:
            claimed += batch
        assert len(claimed) == len(set(claimed)) == 18


def test_default_obligation_page_is_readable(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with delivery_server(loop_thread, database_url) as delivery:
        _orphans(delivery.stub, 18)
        listing = dpb.ListObligationsRequest()
        assert _answered(delivery.stub, DELIVERY, "ListObligations", listing)
        ids: list[str] = []
        while True:
            page = delivery.stub.ListObligations(listing)
            assert len(page.obligations) < 18, "18 such rows cannot fit one answer"
            ids += [row.id for row in page.obligations]
            if not page.next_page_token:
                break
            listing.page_token = page.next_page_token
        assert len(ids) == len(set(ids)) == 18
