"""What each racing process runs (tests/frameworks/adk/test_races.py): its own adapter
on a fresh event loop, started by `multiprocessing` (spawn), so the processes share
nothing but the server."""

from __future__ import annotations

import asyncio
from multiprocessing.synchronize import Barrier
from typing import Any

from google.adk.errors import StaleSessionError
from google.adk.events import Event, EventActions
from google.genai import types
from switchboard_client.frameworks.adk import SwitchboardSessionService

APP = "shop"
USER = "ada"


def _event(text: str, state: dict[str, Any]) -> Event:
    content = types.Content(role="user", parts=[types.Part(text=text)])
    return Event(
        invocation_id=text, author="user", content=content, actions=EventActions(state_delta=state)
    )


def append_once(address: str, name: str, barrier: Barrier) -> str:
    """Loads the session, waits for the other process to have loaded it too, appends
    once: "won" or "stale" (ADK's StaleSessionError)."""

    async def main() -> str:
        service = SwitchboardSessionService(address)
        try:
            session = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
            assert session is not None
            barrier.wait(timeout=60)
            try:
                await service.append_event(session, _event(name, {"winner": name}))
            except StaleSessionError:
                return "stale"
            return "won"
        finally:
            await service.close()

    return asyncio.run(main())


def count_up(address: str, name: str, times: int, barrier: Barrier) -> int:
    """Read-modify-write of a counter `times` times, reloading on StaleSessionError as
    ADK asks; answers how many stale errors it met."""

    async def main() -> int:
        service = SwitchboardSessionService(address)
        stale = 0
        try:
            barrier.wait(timeout=60)
            done = 0
            while done < times:
                session = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
                assert session is not None
                count = session.state.get("count", 0) + 1
                try:
                    await service.append_event(session, _event(f"{name}-{done}", {"count": count}))
                except StaleSessionError:
                    stale += 1
                    continue
                done += 1
            return stale
        finally:
            await service.close()

    return asyncio.run(main())
