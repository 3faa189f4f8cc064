"""Bad input through `SwitchboardSaver` raises what LangGraph's own savers raise (the
in-memory saver is the reference, same call), with a message naming what to change,
and stores nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from switchboard_client import SessionClient
from switchboard_client.frameworks.langgraph import SwitchboardSaver

from switchboard.session.v1 import session_service_pb2 as pb

THREAD = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}


def _with_value(value: Any) -> dict[str, Any]:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"x": value}
    checkpoint["channel_versions"] = {"x": 1}
    return dict(checkpoint)


CASES: dict[str, tuple[Callable[[Any], Any], type[Exception], str]] = {
    "a config without thread_id": (
        lambda s: s.put({"configurable": {}}, empty_checkpoint(), {}, {}),
        KeyError,
        "thread_id",
    ),
    "a channel value the serializer refuses": (
        lambda s: s.put(THREAD, _with_value(object()), {}, {"x": 1}),
        TypeError,
        "not msgpack serializable",
    ),
    "writes without the checkpoint they belong to": (
        lambda s: s.put_writes(THREAD, [("x", 1)], "task-1"),
        KeyError,
        "checkpoint_id",
    ),
    "a write value the serializer refuses": (
        lambda s: s.put_writes(
            {"configurable": {**THREAD["configurable"], "checkpoint_id": "c-1"}},
            [("x", object())],
            "task-1",
        ),
        TypeError,
        "not msgpack serializable",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_raises_langgraphs_own_error_and_stores_nothing(
    case: str, saver: SwitchboardSaver, client: SessionClient
) -> None:
    call, error, said = CASES[case]
    with pytest.raises(error) as reference:
        call(InMemorySaver())
    with pytest.raises(error, match=said) as ours:
        call(saver)
    assert type(ours.value) is type(reference.value)
    assert list(saver.list(None)) == []
    _assert_no_records(client, saver.agent)


def _assert_no_records(client: SessionClient, agent: str) -> None:
    if not _has_agent(client, agent):
        return
    for kind in ("checkpoint", "writes"):
        assert list(client.list_records(agent, kind)) == []


def test_metadata_that_is_not_json_is_a_type_error_as_in_sqlite_saver(
    saver: SwitchboardSaver, client: SessionClient
) -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        saver.put(THREAD, empty_checkpoint(), {"source": "loop", "when": object()}, {})
    _assert_no_records(client, saver.agent)


def test_a_checkpoint_over_the_servers_record_limit_is_a_value_error(
    saver: SwitchboardSaver, client: SessionClient
) -> None:
    kept = saver.put(THREAD, empty_checkpoint(), {"step": 0}, {})
    huge = _with_value("x" * (2 * 1024 * 1024))
    with pytest.raises(
        ValueError, match=r"accepts at most 1048576 per record \(--max-record-bytes\)"
    ):
        saver.put(kept, huge, {"step": 1}, {"x": 1})
    listed = list(saver.list(THREAD))
    assert [t.config["configurable"]["checkpoint_id"] for t in listed] == [
        kept["configurable"]["checkpoint_id"]
    ]
    records = list(client.list_records(saver.agent, "checkpoint"))
    assert [r.key for r in records] == [kept["configurable"]["checkpoint_id"]]


def test_a_thread_id_too_long_for_a_label_is_a_value_error(
    saver: SwitchboardSaver, client: SessionClient
) -> None:
    config = {"configurable": {"thread_id": "t" * 300, "checkpoint_ns": ""}}
    with pytest.raises(ValueError, match="thread_id is 300 characters; at most 256"):
        saver.put(config, empty_checkpoint(), {}, {})
    with pytest.raises(ValueError, match="conversation_id"):
        saver.get_tuple(config)
    _assert_no_records(client, saver.agent)
    sessions = list(client.list_sessions(saver.agent)) if _has_agent(client, saver.agent) else []
    assert [s for s in sessions if s.status == pb.SESSION_STATUS_OPEN] == []


def test_an_unknown_prune_strategy_is_a_value_error(saver: SwitchboardSaver) -> None:
    kept = saver.put(THREAD, empty_checkpoint(), {}, {})
    with pytest.raises(ValueError, match="keep_latest"):
        saver.prune(["t-1"], strategy="keep_some")
    assert saver.get_tuple(THREAD).config == kept  # type: ignore[union-attr]


def _has_agent(client: SessionClient, agent: str) -> bool:
    return agent in {a.name for a in client.list_agents()}
