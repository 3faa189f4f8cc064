"""An `Agent` run by the SDK's `Runner` with its scripted model (`agents.testing`,
shipped in the SDK) on a Switchboard session: its turns are history events, and
they survive a server restart: the same session object, on the same client, carries
the conversation into the next turn."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from switchboard_client.frameworks.openai_agents import SessionConflict, SwitchboardSession
from switchboard_client.session import SessionClient

from tests.frameworks.openai_agents.conftest import AGENT, run
from tests.harness import ServerProcess

pytestmark = pytest.mark.slow


def landmark_city(landmark: str) -> str:
    """The city a landmark is in."""
    return "San Francisco" if "Golden Gate" in landmark else "unknown"


LANDMARK_CITY = function_tool(landmark_city)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server(database_url: str, data_dir: Path, port: int) -> ServerProcess:
    # The same address before and after the restart: the client's channel reconnects.
    listen = ("--session-listen", f"127.0.0.1:{port}")
    return ServerProcess(database_url, data_dir, *listen, service="session")


def test_an_agents_turns_persist_and_survive_a_server_restart(
    database_url: str, tmp_path: Path
) -> None:
    port = _free_port()
    server = _server(database_url, tmp_path / "first", port)
    server.start()
    client = SessionClient(f"127.0.0.1:{port}", timeout_s=10)
    try:
        client.create_agent(AGENT)
        session = SwitchboardSession("trip-42", client, agent=AGENT, user_id="alice")
        model = ScriptedModel(
            steps=[
                [function_call("landmark_city", {"landmark": "Golden Gate"}, call_id="c1")],
                [assistant_message("San Francisco")],
                [assistant_message("California")],
            ]
        )
        agent = Agent(name="guide", model=model, tools=[LANDMARK_CITY])

        first = Runner.run_sync(agent, "Where is the Golden Gate Bridge?", session=session)
        assert first.final_output == "San Francisco"
        stored = run(session.get_items())
        assert [item.get("type", "message") for item in stored] == [
            "message", "function_call", "function_call_output", "message",
        ]  # fmt: skip
        assert stored[2]["output"] == "San Francisco"
        [opened] = list(client.list_sessions(AGENT))
        history = client.history(AGENT, opened.session_id)
        assert [json.loads(m.message.content) for m in history] == stored

        assert server.terminate() == 0
        server = _server(database_url, tmp_path / "second", port)
        server.start()

        second = run(Runner.run(agent, "Which state is that in?", session=session))
        assert second.final_output == "California"
        assert model.last_call is not None
        seen = model.last_call.input
        assert seen[: len(stored)] == stored, "the turn before the restart reached the model"
        assert seen[-1] == {"role": "user", "content": "Which state is that in?"}
        assert len(run(session.get_items())) == len(stored) + 2
    finally:
        client.close()
        server.stop_quietly()


class _ReadTogether(SwitchboardSession):
    """Holds each runner's first read until both runners have read: a race on purpose."""

    def __init__(self, barrier: asyncio.Barrier, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.barrier: asyncio.Barrier | None = barrier

    async def get_items(self, limit: int | None = None) -> list[Any]:
        items = await super().get_items(limit)
        if self.barrier is not None:
            barrier, self.barrier = self.barrier, None
            await barrier.wait()
        return items


def test_two_runners_racing_on_one_conversation_one_wins_the_other_retries(
    client: SessionClient,
) -> None:
    async def race() -> tuple[list[Any], list[Any]]:
        barrier = asyncio.Barrier(2)
        runners = []
        for name in ("A", "B"):
            session = _ReadTogether(barrier, "race", client, agent=AGENT, exclusive=True)
            agent = Agent(name=name, model=ScriptedModel(steps=[[assistant_message(name)]] * 2))
            runners.append((agent, session))
        outcomes = await asyncio.gather(
            *(Runner.run(agent, f"turn of {agent.name}", session=s) for agent, s in runners),
            return_exceptions=True,
        )
        [loser] = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, SessionConflict)]
        assert not isinstance(outcomes[1 - loser], BaseException), outcomes
        agent, session = runners[loser]
        retried = await Runner.run(agent, f"turn of {agent.name}", session=session)
        assert retried.final_output == agent.name
        return list(outcomes), await session.get_items()

    outcomes, items = run(race())
    winner = "AB"[1 - [isinstance(o, SessionConflict) for o in outcomes].index(True)]
    loser = "AB".replace(winner, "")
    assert [item["content"] if item.get("role") == "user" else "reply" for item in items] == [
        f"turn of {winner}", "reply", f"turn of {loser}", "reply",
    ]  # fmt: skip
