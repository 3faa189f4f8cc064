"""The adapter's contract on a real server, both backends: items round-trip as the
SDK's sessions keep them, `pop_item` is a retraction a rewind undoes, `clear_session`
a reset a rewind undoes, and each item is a history event of the log."""

from __future__ import annotations

import asyncio
import json

import pytest
from agents.memory import Session
from switchboard_client.session import SessionClient

from switchboard.session.v1 import session_service_pb2 as pb
from tests.frameworks.openai_agents.conftest import AGENT, log_head, run, session
from tests.harness import ServerProcess

ITEMS = [
    {"role": "user", "content": "What city is the Golden Gate Bridge in?"},
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "San Francisco"},
    {"role": "assistant", "content": "San Francisco ✓"},
]


def test_items_round_trip_with_limits(client: SessionClient) -> None:
    conversation = session(client)
    assert isinstance(conversation, Session)  # the SDK's protocol, runtime-checkable
    assert run(conversation.get_items()) == []
    run(conversation.add_items(ITEMS))

    assert run(conversation.get_items()) == ITEMS
    assert run(conversation.get_items(limit=2)) == ITEMS[-2:]
    assert run(conversation.get_items(limit=10)) == ITEMS
    assert run(conversation.get_items(limit=0)) == []
    limited = session(client, session_settings={"limit": 3})
    assert run(limited.get_items()) == ITEMS[-3:]
    assert run(limited.get_items(limit=1)) == ITEMS[-1:]


def test_a_read_never_creates_the_conversation(
    client: SessionClient, server: ServerProcess
) -> None:
    before = log_head(server)
    conversation = session(client, "never-written")
    assert run(conversation.get_items()) == []
    assert run(conversation.pop_item()) is None
    run(conversation.clear_session())
    assert log_head(server) == before


def test_items_are_history_events_of_the_log(client: SessionClient) -> None:
    conversation = session(client)
    run(conversation.add_items(ITEMS))
    [switchboard_session] = list(client.list_sessions(AGENT))
    history = client.history(AGENT, switchboard_session.session_id)
    assert [json.loads(m.message.content) for m in history] == ITEMS
    roles = [m.message.role for m in history]
    assert roles == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_ASSISTANT]
    assert switchboard_session.source.transport == "openai_agents"
    assert switchboard_session.source.conversation_id == "chat-1"


def test_pop_item_is_a_retraction_that_a_rewind_undoes(
    client: SessionClient, server: ServerProcess
) -> None:
    conversation = session(client)
    run(conversation.add_items(ITEMS))
    before_pop = log_head(server)

    assert run(conversation.pop_item()) == ITEMS[-1]
    assert run(conversation.pop_item()) == ITEMS[-2]
    assert run(conversation.get_items()) == ITEMS[:-2]

    client.rewind(before_pop)
    assert run(conversation.get_items()) == ITEMS


def test_pop_item_of_an_emptied_session_answers_none(client: SessionClient) -> None:
    conversation = session(client)
    run(conversation.add_items(ITEMS[:1]))
    assert run(conversation.pop_item()) == ITEMS[0]
    assert run(conversation.pop_item()) is None


def test_clear_session_is_a_reset_that_a_rewind_undoes(
    client: SessionClient, server: ServerProcess
) -> None:
    conversation = session(client)
    run(conversation.add_items(ITEMS))
    before_clear = log_head(server)

    run(conversation.clear_session())
    assert run(conversation.get_items()) == []
    run(conversation.add_items(ITEMS[:1]))
    assert run(conversation.get_items()) == ITEMS[:1]
    ended, current = sorted(client.list_sessions(AGENT), key=lambda s: s.create_sequence)
    assert ended.status == pb.SESSION_STATUS_ENDED and ended.end_reason == "clear_session"

    client.rewind(before_clear)
    assert run(conversation.get_items()) == ITEMS
    assert current.session_id not in {s.session_id for s in client.list_sessions(AGENT)}


def test_conversations_are_apart_by_id_and_by_user(client: SessionClient) -> None:
    alice = session(client, "chat-1", user_id="alice")
    bob = session(client, "chat-1", user_id="bob")
    other = session(client, "chat-2", user_id="alice")
    run(alice.add_items(ITEMS[:1]))
    run(bob.add_items(ITEMS[1:2]))
    assert run(alice.get_items()) == ITEMS[:1]
    assert run(bob.get_items()) == ITEMS[1:2]
    assert run(other.get_items()) == []
    assert run(bob.pop_item()) == ITEMS[1]
    assert run(alice.get_items()) == ITEMS[:1]


def test_many_items_page_and_split_in_order(client: SessionClient) -> None:
    conversation = session(client)
    many = [{"role": "user", "content": f"message {n}"} for n in range(2_345)]
    run(conversation.add_items(many))
    assert run(conversation.get_items()) == many
    assert run(conversation.get_items(limit=1_500)) == many[-1_500:]


def test_a_cancelled_write_settles_before_the_cancellation_is_raised(
    client: SessionClient,
) -> None:
    """As the SDK's sessions: the caller that sees CancelledError knows the outcome
    (here: stored), so it never retries a write that happened."""
    conversation = session(client)

    async def cancel_while_writing() -> None:
        write = asyncio.create_task(conversation.add_items(ITEMS[:1]))
        await asyncio.sleep(0)  # the write is under way in its worker thread
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        assert await conversation.get_items() == ITEMS[:1]

    run(cancel_while_writing())
