"""What one racing process runs (imported by the spawned children of test_races.py):
a compiled graph on `SwitchboardSaver`, `turns` invocations on one shared thread."""

from __future__ import annotations

import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from switchboard_client import SessionClient
from switchboard_client.frameworks.langgraph import SwitchboardSaver


def _append(state: list[str], writes: list[str]) -> list[str]:
    return [*state, *writes]


class Notes(TypedDict):
    said: Annotated[list[str], _append]


def graph(saver: SwitchboardSaver) -> Any:
    builder = StateGraph(Notes)
    builder.add_node("echo", lambda state: {"said": [f"echo of {state['said'][-1]}"]})
    builder.add_edge(START, "echo")
    builder.add_edge("echo", END)
    return builder.compile(checkpointer=saver)


def run(address: str, worker: str, thread_id: str, turns: int, start_at: float) -> int:
    """Invokes the graph `turns` times; answers how many checkpoints it put."""
    with SessionClient(address, timeout_s=30.0) as client:
        compiled = graph(SwitchboardSaver(client))
        config = {"configurable": {"thread_id": thread_id}}
        time.sleep(max(0.0, start_at - time.time()))
        for turn in range(turns):
            compiled.invoke({"said": [f"{worker}-{turn}"]}, config)
    # Each invocation puts three checkpoints: its input, the step before `echo`, after it.
    return turns * 3
