"""A real compiled LangGraph graph on `SwitchboardSaver`, both backends: a human-in-the-
loop interrupt and its resume, `get_state_history`, an `update_state` fork that runs on
while the original branch stays, a DeltaChannel that `prune` keeps whole; sync and async."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from switchboard_client.frameworks.langgraph import SwitchboardSaver


class Chat(TypedDict):
    said: Annotated[list[str], operator.add]


def _ask(state: Chat) -> dict[str, Any]:
    answer = interrupt("name?")
    return {"said": [f"name={answer}"]}


def _greet(state: Chat) -> dict[str, Any]:
    name = state["said"][-1].removeprefix("name=")
    return {"said": [f"hello {name}"]}


def _graph(saver: SwitchboardSaver) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("ask", _ask)
    builder.add_node("greet", _greet)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "greet")
    builder.add_edge("greet", END)
    return builder.compile(checkpointer=saver)


def test_interrupt_resume_history_and_fork(saver: SwitchboardSaver) -> None:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "t-1"}}

    first = graph.invoke({"said": ["hi"]}, config)
    assert [i.value for i in first["__interrupt__"]] == ["name?"]
    paused = graph.get_state(config)
    assert paused.next == ("ask",)
    assert [i.value for task in paused.tasks for i in task.interrupts] == ["name?"]

    done = graph.invoke(Command(resume="ada"), config)
    assert done["said"] == ["hi", "name=ada", "hello ada"]

    history = list(graph.get_state_history(config))
    assert [snapshot.next for snapshot in history] == [(), ("greet",), ("ask",), ("__start__",)]
    assert history[0].values["said"] == ["hi", "name=ada", "hello ada"]

    # Fork: rewrite what `ask` answered and run `greet` again from there.
    before_greet = history[1]
    fork = graph.update_state(before_greet.config, {"said": ["name=bob"]}, as_node="ask")
    assert (
        fork["configurable"]["checkpoint_id"]
        != before_greet.config["configurable"]["checkpoint_id"]
    )
    forked = graph.invoke(None, fork)
    assert forked["said"] == ["hi", "name=ada", "name=bob", "hello bob"]

    # The thread's head is the fork; the original branch is still there, unchanged.
    assert graph.get_state(config).values == forked
    assert graph.get_state(history[0].config).values["said"] == ["hi", "name=ada", "hello ada"]
    sources = [s.metadata["source"] for s in graph.get_state_history(config)]
    assert sources.count("update") == 1 and len(sources) == len(history) + 2
    # The fork's parent chain leads back through the original checkpoints.
    fork_state = graph.get_state(fork)
    assert (
        fork_state.parent_config["configurable"]["checkpoint_id"]
        == (before_greet.config["configurable"]["checkpoint_id"])
    )


def test_the_async_graph_runs_the_same_flow(saver: SwitchboardSaver) -> None:
    async def run() -> None:
        graph = _graph(saver)
        config = {"configurable": {"thread_id": "t-async"}}
        await graph.ainvoke({"said": ["hi"]}, config)
        assert (await graph.aget_state(config)).next == ("ask",)
        done = await graph.ainvoke(Command(resume="eve"), config)
        assert done["said"] == ["hi", "name=eve", "hello eve"]
        history = [snapshot async for snapshot in graph.aget_state_history(config)]
        assert len(history) == 4
        fork = await graph.aupdate_state(history[1].config, {"said": ["name=max"]}, as_node="ask")
        forked = await graph.ainvoke(None, fork)
        assert forked["said"][-1] == "hello max"
        await saver.adelete_thread("t-async")
        assert (await graph.aget_state(config)).values == {}

    asyncio.run(run())


def _concat(state: list[str] | None, writes: list[list[str]]) -> list[str]:
    merged = list(state or [])
    for write in writes:
        merged.extend(write)
    return merged


class Log(TypedDict):
    lines: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=3)]


def _delta_graph(saver: SwitchboardSaver) -> Any:
    builder = StateGraph(Log)
    builder.add_node("note", lambda state: {"lines": [f"line {len(state['lines'])}"]})
    builder.add_edge(START, "note")
    builder.add_edge("note", END)
    return builder.compile(checkpointer=saver)


def test_the_delta_history_walk_answers_as_langgraphs_default(saver: SwitchboardSaver) -> None:
    graph = _delta_graph(saver)
    config = {"configurable": {"thread_id": "delta-walk"}}
    for turn in range(4):
        graph.invoke({"lines": [f"turn {turn}"]}, config)
    history = list(graph.get_state_history(config))
    fork = graph.update_state(history[5].config, {"lines": ["forked"]}, as_node="note")
    graph.invoke({"lines": ["after fork"]}, fork)
    targets = [config, fork, *(snapshot.config for snapshot in history)]
    for target in targets:
        ours = saver.get_delta_channel_history(config=target, channels=["lines", "none"])
        default = BaseCheckpointSaver.get_delta_channel_history(
            saver, config=target, channels=["lines", "none"]
        )
        assert ours == default
    assert asyncio.run(saver.aget_delta_channel_history(config=config, channels=["lines"])) == (
        saver.get_delta_channel_history(config=config, channels=["lines"])
    )
    assert graph.get_state(config).values["lines"][-3:] == ["forked", "after fork", "line 6"]


def test_prune_keeps_what_a_delta_channel_needs(saver: SwitchboardSaver) -> None:
    graph = _delta_graph(saver)
    config = {"configurable": {"thread_id": "delta"}}
    for turn in range(5):
        graph.invoke({"lines": [f"turn {turn}"]}, config)
    whole = graph.get_state(config).values["lines"]
    assert len(whole) == 10
    before = len(list(saver.list(config)))

    saver.prune(["delta"], strategy="keep_latest")

    kept = list(saver.list(config))
    # Kept: the head and its ancestors back to the channel's last snapshot, no more.
    assert 1 < len(kept) < before
    assert graph.get_state(config).values["lines"] == whole
    graph.invoke({"lines": ["turn 5"]}, config)
    assert graph.get_state(config).values["lines"] == [*whole, "turn 5", "line 11"]


def test_a_subgraph_interrupt_resumes_from_its_own_namespace(saver: SwitchboardSaver) -> None:
    inner = StateGraph(Chat)
    inner.add_node("ask", _ask)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    outer = StateGraph(Chat)
    outer.add_node("inner", inner.compile())
    outer.add_node("greet", _greet)
    outer.add_edge(START, "inner")
    outer.add_edge("inner", "greet")
    outer.add_edge("greet", END)
    graph = outer.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "nested"}}

    graph.invoke({"said": ["hi"]}, config)
    paused = graph.get_state(config, subgraphs=True)
    [task] = paused.tasks
    assert task.name == "inner" and task.state is not None
    assert task.state.next == ("ask",)
    assert task.state.config["configurable"]["checkpoint_ns"].startswith("inner:")
    namespaces = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(config)}
    assert len(namespaces) == 2  # without a namespace, list takes the root and the subgraph
    done = graph.invoke(Command(resume="kim"), config)
    assert done["said"][-1] == "hello kim"
