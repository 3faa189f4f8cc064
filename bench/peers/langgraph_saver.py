"""LangGraph's `SqliteSaver.put` with growing chat state, in process, one thread.

What a LangGraph chat graph writes per turn step: a full checkpoint whose
`messages` channel holds the whole conversation so far, one more user message
(the benchmark's payload, as a langchain `HumanMessage`) each put, each put its
own commit. Conversations are `THREAD_MESSAGES` long; the next starts a new
thread, so the figure does not depend on the window's length. Storage: the
saver's `setup()` sets WAL; the connection is ours, so it gets synchronous=FULL.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from bench.peers.common import PeerResult, sqlite_settings, timed_sync, user_message

#: Messages per conversation thread before the next thread starts.
THREAD_MESSAGES = 100


def measure(directory: Path, seconds: float, warmup_s: float) -> list[PeerResult]:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = directory / "langgraph.sqlite3"
    connection = sqlite3.connect(str(path), check_same_thread=False)
    try:
        connection.execute("PRAGMA synchronous=FULL")
        saver = SqliteSaver(connection)
        saver.setup()
        state: dict[str, Any] = {"config": None, "messages": []}

        def put(i: int) -> None:
            step = i % THREAD_MESSAGES
            if step == 0:
                thread = f"thread-{i // THREAD_MESSAGES}"
                state["config"] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
                state["messages"] = []
            state["messages"] = [*state["messages"], HumanMessage(content=user_message(i))]
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"messages": state["messages"]}
            checkpoint["channel_versions"] = {"messages": step + 1}
            metadata = {"source": "loop", "step": step}
            state["config"] = saver.put(
                state["config"], checkpoint, metadata, {"messages": step + 1}
            )

        measurement = timed_sync("LangGraph SqliteSaver.put", put, seconds, warmup_s)
        settings = sqlite_settings(connection)
    finally:
        connection.close()
    return [
        PeerResult(
            "langgraph-put",
            f"LangGraph SqliteSaver.put, growing state ({THREAD_MESSAGES}-message threads)",
            "rate",
            measurement,
            settings=settings,
            extra={"thread_messages": THREAD_MESSAGES, "db_bytes": path.stat().st_size},
        )
    ]
