"""`switchboard console`: the operator console, a web UI over the two services."""

from __future__ import annotations

import click

from switchboard_cli.errors import DELIVERY, SESSION
from switchboard_cli.options import address_option
from switchboard_console.server import run, split_listen
from switchboard_console.web import ConsoleSettings


@click.command()
@address_option(SESSION, "session_address")
@address_option(DELIVERY, "delivery_address")
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
