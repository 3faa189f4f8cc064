"""An `Agent` run by the SDK's `Runner` with its scripted model (`agents.testing`,
shipped in the SDK) on a Switchboard session: its turns are history events, and
they survive a server restart: the same session object, on the same client, carries
the conversation into the next turn."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from agents import Agent, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from switchboard_client.frameworks.openai_agents import SwitchboardSession
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
