"""Bad input through the ADK adapter: ADK's own exception types (ValueError and its
subclasses) with a message naming what is wrong, and nothing written (the log's head
does not move, the session object is unchanged)."""

from __future__ import annotations

from typing import Any

import pytest
from google.adk.sessions.base_session_service import GetSessionConfig
from pydantic import ValidationError
from switchboard_client.frameworks.adk import SwitchboardSessionService

from tests.frameworks.adk.conftest import APP, USER, drive, event, log_head
from tests.harness import InProcessSession


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"app_name": "", "user_id": USER}, "app_name must be a non-empty string"),
        ({"app_name": APP, "user_id": None}, "user_id must be a non-empty string"),
        ({"app_name": APP, "user_id": USER, "state": {"x" * 300: 1}}, "1-256 printable"),
        ({"app_name": APP, "user_id": USER, "state": {"user:": 1}}, "after its app:/user:"),
        (
            {"app_name": APP, "user_id": USER, "session_id": "s" * 600},
            "conversation_id: is 600 characters long; the limit is 256",
        ),
        ({"app_name": APP, "user_id": "u\x00"}, "user_id"),
    ],
)
def test_a_refused_create_session_raises_value_error_and_writes_nothing(
    server: InProcessSession, arguments: dict[str, Any], match: str
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        before = log_head(server)
        with pytest.raises(ValueError, match=match):
            await service.create_session(**arguments)
        assert log_head(server) == before
        assert await service.get_session(app_name=APP, user_id=USER, session_id="s") is None

    drive(server.address, scenario)


def test_a_state_value_past_the_service_limit_is_refused_and_leaves_no_session(
    server: InProcessSession,
) -> None:
    """The service's value limit is a deployment's choice (--max-state-value-bytes), so
    it is the service that refuses; the session opened for the call is taken back out."""

    async def scenario(service: SwitchboardSessionService) -> None:
        with pytest.raises(ValueError, match="state"):
            await service.create_session(
                app_name=APP, user_id=USER, session_id="big", state={"blob": "x" * 300_000}
            )
        assert await service.get_session(app_name=APP, user_id=USER, session_id="big") is None
        assert (await service.list_sessions(app_name=APP)).sessions == []

    drive(server.address, scenario)


@pytest.mark.parametrize(
    ("delta", "text", "match"),
    [
        ({"": 1}, "hi", "1-256 printable"),
        ({"app:\n": 1}, "hi", "printable"),
        ({}, "x" * 300_000, "content"),
    ],
)
def test_a_refused_append_raises_value_error_and_writes_nothing(
    server: InProcessSession, delta: dict[str, Any], text: str, match: str
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        before = log_head(server)
        with pytest.raises(ValueError, match=match):
            await service.append_event(session, event(text, state=delta))
        assert log_head(server) == before
        assert session.events == []
        # The session object is still good: the refusal moved nothing.
        await service.append_event(session, event("fine"))

    drive(server.address, scenario)


def test_bad_reads_raise_value_error(server: InProcessSession) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        with pytest.raises(ValueError, match="app_name"):
            await service.list_sessions(app_name="")
        with pytest.raises(ValueError, match="user_id"):
            await service.get_session(app_name=APP, user_id="", session_id="s")
        with pytest.raises(ValueError, match="user_id"):
            await service.get_user_state(app_name=APP, user_id="")
        with pytest.raises(ValidationError, match="num_recent_events"):
            GetSessionConfig(num_recent_events=-1)

    drive(server.address, scenario)
