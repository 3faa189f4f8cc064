"""`switchboard chat`: talk to an agent from the terminal, through the reference gateway."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
from switchboard_client import DeliveryClient, SessionClient, SwitchboardError
from switchboard_client.gateway import Gateway
from switchboard_client.transports import ReplPlatform, run_repl

from switchboard.observability import (
    configure_logging,
)
from switchboard_cli.agent import create_missing_agent
from switchboard_cli.errors import chat_failure
from switchboard_cli.options import (
    DEFAULT_DELIVERY_LISTEN,
    DEFAULT_SESSION_LISTEN,
    no_placeholder_token,
)
from switchboard_cli.replies import echo_agent, load_callback


@click.command()
@click.option("--agent", required=True, help="The agent to talk to (created if missing).")
@click.option(
    "--session-address",
    default=DEFAULT_SESSION_LISTEN,
    envvar="SWITCHBOARD_SESSION_ADDRESS",
    show_default=True,
)
@click.option(
    "--delivery-address",
    default=DEFAULT_DELIVERY_LISTEN,
    envvar="SWITCHBOARD_DELIVERY_ADDRESS",
    show_default=True,
)
@click.option(
    "--token",
    default=None,
    envvar="SWITCHBOARD_TOKEN",
    callback=no_placeholder_token,
    help="Bearer token for both services (when they run with --auth-tokens): admin, or "
    "one whose agents include --agent (it cannot create a missing agent).",
)
@click.option("--conversation", default="default", show_default=True, help="REPL conversation id.")
@click.option(
    "--callback",
    default="",
    help="module:function taking a switchboard_client.gateway.Turn and returning the reply, "
    "imported from the current directory first [default: an echo agent]",
)
def chat(
    agent: str,
    session_address: str,
    delivery_address: str,
    token: str | None,
    conversation: str,
    callback: str,
) -> None:
    """Talk to an agent from the terminal ("/help" lists the commands)."""
    chosen = click.get_current_context().find_object(dict) or {}
    if not chosen.get("log_chosen"):
        # A person's terminal: the client's warnings as short text lines, no INFO.
        configure_logging("WARNING", json_format=False)
    reply = load_callback(callback) if callback else echo_agent
    try:
        _chat(agent, session_address, delivery_address, token, conversation, reply)
    except SwitchboardError as error:
        shown = chat_failure(error, session_address, delivery_address)
        raise click.ClickException(shown) from None


def _chat(
    agent: str,
    session_address: str,
    delivery_address: str,
    token: str | None,
    conversation: str,
    reply: Callable[[Any], str],
) -> None:
    with (
        SessionClient(session_address, token=token) as sessions,
        DeliveryClient(delivery_address, token=token) as ledger,
    ):
        try:
            sessions.get_agent(agent)
        except SwitchboardError as missing:
            if missing.code.name != "NOT_FOUND":
                raise
            create_missing_agent(sessions, agent)
        gateway = Gateway("repl", agent, sessions, ledger, [ReplPlatform(sys.stdout)], reply)
        gateway.start()
        interactive = sys.stdin.isatty()
        click.echo(
            f"switchboard chat: agent {agent!r}, conversation {conversation!r} "
            f"(sessions {session_address}, delivery {delivery_address})"
        )
        click.echo('type a message; "/help" lists the commands, "/quit" or Ctrl-D leaves')

        def failed(error: Exception) -> None:
            if isinstance(error, SwitchboardError):
                shown = chat_failure(error, session_address, delivery_address)
            else:
                shown = f"the agent's callback failed: {type(error).__name__}: {error}"
            click.echo(f"error: {shown}", err=True)

        try:
            run_repl(
                gateway,
                sys.stdin,
                conversation,
                out=sys.stdout,
                interactive=interactive,
                on_error=failed,
            )
        except KeyboardInterrupt:
            click.echo()
        finally:
            gateway.stop()
