"""`switchboard console`: the operator console, a web UI over the two services."""

from __future__ import annotations

import click

from switchboard_cli.options import DEFAULT_DELIVERY_LISTEN, DEFAULT_SESSION_LISTEN
from switchboard_console.server import run, split_listen
from switchboard_console.web import ConsoleSettings


@click.command()
@click.option(
    "--session",
    "session_address",
    default=DEFAULT_SESSION_LISTEN,
    envvar="SWITCHBOARD_SESSION_ADDRESS",
    show_default=True,
    help="The SessionService's host:port.",
)
@click.option(
    "--delivery",
    "delivery_address",
    default=DEFAULT_DELIVERY_LISTEN,
    envvar="SWITCHBOARD_DELIVERY_ADDRESS",
    show_default=True,
    help="The DeliveryService's host:port.",
)
@click.option(
    "--listen",
    default="127.0.0.1:8233",
    envvar="SWITCHBOARD_CONSOLE_LISTEN",
    show_default=True,
    help="host:port the console serves on (loopback unless told otherwise).",
)
@click.option(
    "--read-only",
    is_flag=True,
    envvar="SWITCHBOARD_CONSOLE_READ_ONLY",
    help="Refuse every write (rewinds, checkouts, delivery actions).",
)
def console(session_address: str, delivery_address: str, listen: str, read_only: bool) -> None:
    """Serve the operator console: a web UI over the two services, as one more client.

    It asks each operator for a token and calls the services with it."""
    try:
        split_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from exc
    settings = ConsoleSettings(session_address, delivery_address, listen, read_only)
    run(settings, lambda url: click.echo(f"switchboard: console on {url}", err=False))
