"""`switchboard gateway`: the reference gateway as a process, on the loopback platform."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import click
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import Gateway
from switchboard_client.loopback import LoopbackPlatform
from switchboard_client.loopback_http import LoopbackDoor

from switchboard_cli.agent import ensure_agent
from switchboard_cli.errors import DELIVERY, SESSION
from switchboard_cli.options import address_option, token_option_saying
from switchboard_cli.replies import echo_agent, load_callback


@click.command()
@click.option(
    "--platform",
    type=click.Choice(["loopback"]),
    default="loopback",
    show_default=True,
    help="The chat platform. loopback: a stand-in whose inbound messages are POSTed to "
    "--listen and whose sends are answered back (POST /messages, GET /healthz).",
)
@click.option("--agent", required=True, help="The agent every turn runs as.")
@click.option(
    "--create-agent", is_flag=True, help="Create --agent when it does not exist (an admin token)."
)
@click.option(
    "--name",
    default="loopback-gateway",
    show_default=True,
    help="The gateway's (bot account's) name: its instances take over each other's replies.",
)
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    envvar="SWITCHBOARD_GATEWAY_LISTEN",
    show_default=True,
    help="host:port of the platform's HTTP door.",
)
@address_option(SESSION, "session_address", "--session-address")
@address_option(DELIVERY, "delivery_address", "--delivery-address")
@token_option_saying("Bearer token for both services (when they run with --auth-tokens).")
@click.option(
    "--callback",
    default="",
    help="module:function taking a switchboard_client.gateway.Turn and returning the reply "
    "[default: an echo agent]",
)
def gateway(
    platform: str,
    agent: str,
    create_agent: bool,
    name: str,
    listen: str,
    session_address: str,
    delivery_address: str,
    token: str | None,
    callback: str,
) -> None:
    """Run the reference gateway until SIGTERM or Ctrl-C."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter("use host:port, e.g. 127.0.0.1:8080", param_hint="--listen")
    reply = load_callback(callback) if callback else echo_agent
    addresses = (session_address, delivery_address)
    try:
        _gateway(platform, agent, create_agent, name, (host, int(port)), addresses, token, reply)
    except OSError as error:  # the door's address: in use, or not this host's
        raise click.ClickException(f"cannot listen on {listen}: {error.strerror}") from None


def _gateway(
    platform: str,
    agent: str,
    create_agent: bool,
    name: str,
    listen: tuple[str, int],
    addresses: tuple[str, str],
    token: str | None,
    reply: Callable[[Any], str],
) -> None:
    with (
        SessionClient(addresses[0], token=token) as sessions,
        DeliveryClient(addresses[1], token=token) as ledger,
    ):
        ensure_agent(sessions, agent, create=create_agent, ask=False, create_flag="--create-agent")
        adapter = LoopbackPlatform(name=platform)
        running = Gateway(name, agent, sessions, ledger, [adapter], reply)
        running.start()
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        try:
            with LoopbackDoor(listen, running, adapter.name) as door:
                threading.Thread(target=door.serve_forever, daemon=True).start()
                click.echo(
                    f"switchboard gateway: {name} on the {platform} platform, agent {agent!r}, "
                    f"listening on http://{listen[0]}:{door.server_port}; ready",
                )
                stop.wait()
                door.shutdown()
        finally:
            running.stop()
