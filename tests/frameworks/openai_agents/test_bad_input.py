"""Bad input through the adapter: the exception SQLiteSession raises for it (TypeError
or ValueError) with a message naming what is wrong, and nothing written."""

from __future__ import annotations

import math
from typing import Any

import pytest
from switchboard_client.frameworks._openai_agents_items import ITEM_MARK
from switchboard_client.frameworks.openai_agents import SwitchboardSession
from switchboard_client.session import SessionClient

from switchboard.session.v1 import session_service_pb2 as pb
from tests.frameworks.openai_agents.conftest import AGENT, log_head, run, session
from tests.harness import ServerProcess

GOOD = {"role": "user", "content": "hello"}

BAD_BATCHES: list[tuple[Any, type[Exception], str]] = [
    ("not a list", TypeError, "items must be a list of items, not a str"),
    (GOOD, TypeError, "items must be a list of items, not a dict"),
    ([GOOD, 42], TypeError, r"items\[1\] is a int; a session item is a dict"),
    ([GOOD, {"content": object()}], TypeError, r"items\[1\] is not JSON-serialisable"),
    ([GOOD, {"content": math.nan}], ValueError, r"items\[1\] is not valid JSON"),
    (
        [GOOD, {"role": "user", "content": "x" * 300_000}],
        ValueError,
        r"Switchboard refused the write \(events\[1\]\.message_appended\.message\.content\)"
        r".*this server accepts at most 262144",
    ),
]


@pytest.mark.parametrize(("items", "error", "message"), BAD_BATCHES)
def test_a_bad_batch_is_refused_whole(
    client: SessionClient, server: ServerProcess, items: Any, error: type[Exception], message: str
) -> None:
    conversation = session(client)
    run(conversation.add_items([GOOD]))
    before = log_head(server)
    with pytest.raises(error, match=message):
        run(conversation.add_items(items))
    assert log_head(server) == before
    assert run(conversation.get_items()) == [GOOD]


def test_a_bad_session_id_or_settings_are_refused(
    client: SessionClient, server: ServerProcess
) -> None:
    before = log_head(server)
    with pytest.raises(ValueError, match="session_id must be a non-empty string"):
        SwitchboardSession("", client, agent=AGENT)
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        SwitchboardSession("chat-1", client, agent=AGENT, session_settings={"limitt": 1})
    too_long = session(client, "c" * 300)
    with pytest.raises(ValueError, match=r"source\.conversation_id.*300 characters"):
        run(too_long.add_items([GOOD]))
    with pytest.raises(ValueError, match=r"source\.conversation_id"):
        run(too_long.get_items())
    assert log_head(server) == before


def test_a_message_holding_no_item_is_skipped_as_a_corrupt_row(client: SessionClient) -> None:
    """SQLiteSession skips rows whose JSON does not load, in get_items (limits count
    valid items) and pop_item (dropped, the next one popped); so does the adapter."""
    conversation = session(client)
    run(conversation.add_items([GOOD]))
    [opened] = list(client.list_sessions(AGENT))
    corrupt = _item_message("{not json")
    client.append(AGENT, opened.session_id, corrupt, corrupt)
    assert run(conversation.get_items()) == [GOOD]
    assert run(conversation.get_items(limit=1)) == [GOOD]
    assert run(conversation.pop_item()) == GOOD
    assert run(conversation.get_items()) == []
    assert run(conversation.pop_item()) is None


def test_a_message_written_by_someone_else_reads_as_an_input_message(
    client: SessionClient,
) -> None:
    conversation = session(client)
    run(conversation.add_items([GOOD]))
    [opened] = list(client.list_sessions(AGENT))
    plain = pb.SessionEventInput(
        message_appended=pb.MessageAppended(
            message=pb.Message(role=pb.ROLE_ASSISTANT, content="from a gateway")
        )
    )
    client.append(AGENT, opened.session_id, plain)
    assert run(conversation.get_items()) == [
        GOOD,
        {"role": "assistant", "content": "from a gateway"},
    ]


def _item_message(content: str) -> pb.SessionEventInput:
    message = pb.Message(role=pb.ROLE_USER, content=content, metadata=dict([ITEM_MARK]))
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))
