"""`switchboard chat`: talk to an agent from the terminal, through the reference gateway."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
from switchboard_client import DeliveryClient, SessionClient, SwitchboardError
from switchboard_client.gateway import Gateway
from switchboard_client.transports import ReplPlatform, run_repl

from switchboard.observability import configure_logging
from switchboard_cli.agent import ensure_agent
from switchboard_cli.errors import DELIVERY, SESSION, explain
from switchboard_cli.options import address_option, token_option_saying
from switchboard_cli.replies import echo_agent, load_callback


@click.command()
@click.option("--agent", required=True, help="The agent to talk to.")
@click.option(
    "--create",
    is_flag=True,
    help="Create --agent when it does not exist (an admin token); on a terminal chat "
    "asks instead, elsewhere a missing agent is an error without this flag.",
)
@address_option(SESSION, "session_address", "--session-address")
@address_option(DELIVERY, "delivery_address", "--delivery-address")
@token_option_saying(
    "Bearer token for both services (when they run with --auth-tokens): admin, or "
    "one whose agents include --agent (it cannot create a missing agent)."
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
    create: bool,
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
    _chat(agent, create, session_address, delivery_address, token, conversation, reply)


def _chat(
    agent: str,
    create: bool,
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
        interactive = sys.stdin.isatty()
        ensure_agent(sessions, agent, create=create, ask=interactive, create_flag="--create")
        gateway = Gateway("repl", agent, sessions, ledger, [ReplPlatform(sys.stdout)], reply)
        gateway.start()
        click.echo(
            f"switchboard chat: agent {agent!r}, conversation {conversation!r} "
            f"(sessions {session_address}, delivery {delivery_address})"
        )
        click.echo('type a message; "/help" lists the commands, "/quit" or Ctrl-D leaves')

        command = click.get_current_context()

        def failed(error: Exception) -> None:
            if isinstance(error, SwitchboardError):
                shown = explain(error, command)
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
