"""What a graph run through `SwitchboardSaver` leaves in Switchboard: one session per
thread, checkpoints and writes as labelled records found by index, and a session version
the checkpointer's puts never move (LangGraph writes a step's tasks in parallel)."""

from __future__ import annotations

import json

from switchboard_client import SessionClient
from switchboard_client.frameworks.langgraph import SwitchboardSaver

from tests.frameworks.langgraph import race_worker


def test_a_run_is_records_of_one_session_whose_version_never_moves(
    saver: SwitchboardSaver, client: SessionClient
) -> None:
    graph = race_worker.graph(saver)
    config = {"configurable": {"thread_id": "mapped"}}
    graph.invoke({"said": ["one"]}, config)
    [session] = client.list_sessions(saver.agent)
    version = session.version

    graph.invoke({"said": ["two"]}, config)

    assert client.get_session(saver.agent, session.session_id).version == version
    checkpoints = list(
        client.list_records(saver.agent, "checkpoint", session_id=session.session_id)
    )
    assert len(checkpoints) == 6
    assert {c.labels["thread_id"] for c in checkpoints} == {"mapped"}
    assert all(c.session_id == session.session_id for c in checkpoints)
    steps = [json.loads(c.metadata)["step"] for c in checkpoints]
    assert steps == [4, 3, 2, 1, 0, -1], "newest first, steps counting on across runs"
    assert [c.parent_key for c in checkpoints[:-1]] == [c.key for c in checkpoints[1:]]
    writes = list(client.list_records(saver.agent, "writes", session_id=session.session_id))
    assert writes and {w.labels["checkpoint_id"] for w in writes} <= {c.key for c in checkpoints}
    assert all(w.parent_key == w.labels["checkpoint_id"] for w in writes)
