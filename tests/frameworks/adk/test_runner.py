"""ADK's own `Runner` on the adapter: turns persist, `Runner.rewind_async` (ADK's per-
session rewind) works, the blocking `Runner.run` works (its loop runs in a thread), and
two runners racing on one session end with one winner and ADK's StaleSessionError for
the other, nothing lost or duplicated."""

from __future__ import annotations

import asyncio

import pytest
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.events import Event
from google.adk.runners import Runner
from google.genai import types
from switchboard_client.frameworks.adk import STALE_SESSION_MESSAGE, SwitchboardSessionService

from tests.frameworks.adk.conftest import APP, USER, drive, texts
from tests.frameworks.adk.scripted_model import ScriptedModel
from tests.harness import InProcessSession


def _runner(service: SwitchboardSessionService, model: ScriptedModel) -> Runner:
    agent = LlmAgent(name="shop_agent", model=model, instruction="Be brief.", output_key="reply")
    return Runner(agent=agent, app_name=APP, session_service=service)


async def _turn(runner: Runner, text: str, session_id: str = "s1") -> list[Event]:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    return [
        event
        async for event in runner.run_async(
            user_id=USER, session_id=session_id, new_message=message
        )
    ]


def test_turns_persist_and_rewind_async_takes_a_turn_back(server: InProcessSession) -> None:
    model = ScriptedModel(model="scripted", replies=["r1", "r2", "r3"])

    async def scenario(service: SwitchboardSessionService) -> None:
        runner = _runner(service, model)
        await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        await _turn(runner, "hello")
        second = await _turn(runner, "again")
        stored = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert stored is not None and stored.state["reply"] == "r2"
        assert texts(stored.events) == ["hello", "r1", "again", "r2"]

        await runner.rewind_async(
            user_id=USER, session_id="s1", rewind_before_invocation_id=second[0].invocation_id
        )
        rewound = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert rewound is not None and rewound.state["reply"] == "r1"
        assert rewound.events[-1].actions.rewind_before_invocation_id == second[0].invocation_id

        await _turn(runner, "third")
        # The model no longer sees the rewound turn; the log still holds it (ADK's
        # rewind is an event of its own, not Switchboard's global rewind).
        assert model.asked[-1] == ["hello", "r1", "third"]
        final = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert final is not None and final.state["reply"] == "r3"
        assert texts(final.events) == ["hello", "r1", "again", "r2", "third", "r3"]

    drive(server.address, scenario)


def test_the_blocking_runner_works_through_the_same_service(server: InProcessSession) -> None:
    """`Runner.run` drives its own event loop in a thread; the service gives each loop
    its own channel, so one service object serves both."""
    service = SwitchboardSessionService(server.address)
    runner = _runner(service, ScriptedModel(model="scripted", replies=["sync reply"]))
    asyncio.run(service.create_session(app_name=APP, user_id=USER, session_id="s1"))
    message = types.Content(role="user", parts=[types.Part(text="hi")])
    events = list(runner.run(user_id=USER, session_id="s1", new_message=message))
    assert texts(events) == ["sync reply"]
    stored = asyncio.run(service.get_session(app_name=APP, user_id=USER, session_id="s1"))
    assert stored is not None and texts(stored.events) == ["hi", "sync reply"]


def test_two_runners_on_one_session_one_wins_the_other_gets_stale_session(
    server: InProcessSession,
) -> None:
    """Runner A stores its user message, then waits in its model; runner B runs a whole
    turn meanwhile. A's reply would be written on a session that moved on: ADK's
    StaleSessionError, nothing of it stored, B's turn whole, nothing twice."""
    gate = asyncio.Event()
    slow = ScriptedModel(model="scripted", replies=["a reply"], gate=gate)
    fast = ScriptedModel(model="scripted", replies=["b reply"])

    async def scenario(service: SwitchboardSessionService) -> None:
        other = SwitchboardSessionService(server.address)
        try:
            await service.create_session(app_name=APP, user_id=USER, session_id="s1")
            turn_a = asyncio.create_task(_turn(_runner(service, slow), "from a"))
            while not slow.asked:
                await asyncio.sleep(0.01)
            await _turn(_runner(other, fast), "from b")
            gate.set()
            with pytest.raises(StaleSessionError, match="modified in storage") as lost:
                await turn_a
            assert str(lost.value) == STALE_SESSION_MESSAGE
        finally:
            await other.close()
        stored = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert stored is not None
        assert texts(stored.events) == ["from a", "from b", "b reply"]
        assert len({e.id for e in stored.events}) == 3
        assert stored.state["reply"] == "b reply"

    drive(server.address, scenario)
