"""Every command's failed call ends with one line saying what to do, exit code 1 and
no traceback: the services' ports swapped, nothing listening, a missing or refused
token, a token without the scope the call needs. Against real services (with
authentication on) on SQLite and PostgreSQL, through the real command."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from click.testing import CliRunner
from switchboard_client import SessionClient

from switchboard.auth import parse_tokens
from switchboard_cli.main import main
from tests.harness import EventLoopThread, delivery_server, session_server

ADMIN, MAIN_ONLY = "errors-admin", "errors-main"
GRANTS = parse_tokens(f"{ADMIN}=admin;{MAIN_ONLY}=agents:main")


@dataclass
class Services:
    session: str
    delivery: str


@pytest.fixture
def services(database_url: str, loop_thread: EventLoopThread) -> Iterator[Services]:
    with (
        session_server(loop_thread, database_url, auth=GRANTS) as session,
        delivery_server(loop_thread, database_url, auth=GRANTS) as delivery,
    ):
        with SessionClient(session.address, token=ADMIN) as client:
            client.create_agent("main")
        yield Services(session.address, delivery.address)


def _failed(*args: str, env: dict[str, str | None] | None = None) -> str:
    """What a command that must fail printed: exactly one `Error:` line, exit code 1."""
    result = CliRunner().invoke(
        main, ["--log-level", "ERROR", *args], env={"SWITCHBOARD_TOKEN": None, **(env or {})}
    )
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def _closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_the_ports_swapped_name_the_service_that_answers_and_where_to_look(
    services: Services,
) -> None:
    token = ["--token", ADMIN]
    said = _failed("session", "agents", "--session", services.delivery, *token)
    assert said == (
        f"Error: {services.delivery} answers but is not a SessionService: is it the "
        "DeliveryService? the SessionService is usually on :50051 "
        "(--session / SWITCHBOARD_SESSION_ADDRESS)"
    )
    said = _failed("delivery", "stats", "--address", services.session, *token)
    assert said == (
        f"Error: {services.session} answers but is not a DeliveryService: is it the "
        "SessionService? the DeliveryService is usually on :50052 "
        "(--delivery / SWITCHBOARD_DELIVERY_ADDRESS)"
    )
    # Both swapped: the chat names both.
    said = _failed(
        "chat", "--agent", "main", "--session", services.delivery,
        "--delivery", services.session, *token,
    )  # fmt: skip
    assert f"{services.delivery} answers but is not a SessionService" in said
    assert f"{services.session} answers but is not a DeliveryService" in said


def test_nothing_listening_says_to_start_the_services_or_point_elsewhere(
    services: Services,
) -> None:
    nowhere = _closed_port()
    for command in (["session", "agents"], ["log", "tail"], ["agent", "list"]):
        said = _failed(*command, "--session", nowhere, "--token", ADMIN)
        assert said == (
            f"Error: nothing answers at {nowhere} (the SessionService): start it with "
            "`switchboard serve` (or `python3 dev.py serve`), or pass --session / set "
            "SWITCHBOARD_SESSION_ADDRESS"
        )
    said = _failed(
        "chat", "--agent", "main", "--session", services.session, "--delivery", nowhere,
        "--token", ADMIN,
    )  # fmt: skip
    assert f"nothing answers at {nowhere} (the DeliveryService)" in said
    assert services.session not in said, "the one that answers is not blamed"


def test_a_missing_or_refused_token_names_the_flag_and_the_variable(services: Services) -> None:
    at = f"the SessionService at {services.session}"
    missing = _failed("session", "agents", "--session", services.session)
    assert missing == (
        f"Error: {at} needs a token (UNAUTHENTICATED): pass --token or set "
        "SWITCHBOARD_TOKEN to one of the services' --auth-tokens"
    )
    refused = _failed(
        "agent", "show", "main", "--session", services.session,
        env={"SWITCHBOARD_TOKEN": "not-a-token"},
    )  # fmt: skip
    assert refused.startswith(f"Error: {at} refused the token (UNAUTHENTICATED)")
    assert "--token" in refused and "SWITCHBOARD_TOKEN" in refused
    ledger = _failed("delivery", "obligations", "--delivery", services.delivery, "--token", "x")
    assert f"the DeliveryService at {services.delivery} refused the token" in ledger


def test_a_token_without_the_scope_says_which_scope_the_call_needs(services: Services) -> None:
    said = _failed("session", "agents", "--session", services.session, "--token", MAIN_ONLY)
    assert said == (
        "Error: this token may not do that (PERMISSION_DENIED: ListAgents needs an admin "
        "token): use an admin token, with --token or SWITCHBOARD_TOKEN"
    )
    other = _failed("agent", "show", "other", "--session", services.session,
                    "--token", MAIN_ONLY)  # fmt: skip
    assert "PERMISSION_DENIED: this token may not act for agent 'other'" in other
    assert "use an admin token, or one whose agents include the agent" in other


def test_other_refusals_keep_the_status_and_the_servers_words(services: Services) -> None:
    said = _failed("session", "show", "main", "nope", "--session", services.session,
                   "--token", ADMIN)  # fmt: skip
    assert said == "Error: NOT_FOUND SESSION_NOT_FOUND: agent 'main' has no session 'nope'"
