"""`switchboard` command line: run the services, operate on their storage and schemas."""

from __future__ import annotations

import logging
from typing import Any

import click
from switchboard_client import SwitchboardError

from switchboard.database import StartupRefused
from switchboard.observability import configure_logging
from switchboard_cli import agent, chat, console, db, delivery, gateway, log, serve, session
from switchboard_cli.errors import explain
from switchboard_cli.options import log_options


class _Commands(click.Group):
    """The command group; a database that must not be served, or a call a service
    refused, ends the command with one line saying what to do and exit code 1, not a
    traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StartupRefused as refused:
            logging.getLogger("switchboard").error("refusing to start: %s", refused)
            raise click.ClickException(str(refused)) from refused
        except SwitchboardError as failed:
            raise click.ClickException(explain(failed, ctx)) from None


_ENVIRONMENT = """\b
Environment (each option's own variable is shown in its command's --help):
  SWITCHBOARD_TOKEN             bearer token of the operator commands and chat
  SWITCHBOARD_SESSION_ADDRESS   SessionService host:port the commands call
                                [127.0.0.1:50051]
  SWITCHBOARD_DELIVERY_ADDRESS  DeliveryService host:port the commands call
                                [127.0.0.1:50052]
  SWITCHBOARD_LOG_LEVEL, SWITCHBOARD_LOG_FORMAT   --log-level, --log-format
  SWITCHBOARD_DATA_DIR          where SQLite files live (serve, rebuild, db);
                                else data_dir in the config file,
                                $XDG_CONFIG_HOME/switchboard/config.toml
"""


@click.group(cls=_Commands, epilog=_ENVIRONMENT)
@click.version_option(package_name="switchboard", prog_name="switchboard")
@log_options
@click.pass_context
def main(ctx: click.Context, log_level: str | None, log_format: str | None) -> None:
    """Switchboard: session and delivery backbone for AI-agent gateways."""
    ctx.obj = {
        "log_level": log_level or "INFO",
        "log_format": log_format or "json",
        "log_chosen": log_level is not None or log_format is not None,
    }
    configure_logging(ctx.obj["log_level"], json_format=ctx.obj["log_format"] == "json")


def _show_environment(group: click.Group) -> None:
    """Every option's environment variable in its command's --help."""
    for command in [group, *group.commands.values()]:
        for param in command.params:
            if isinstance(param, click.Option) and param.envvar and not param.hidden:
                param.show_envvar = True
        if isinstance(command, click.Group) and command is not group:
            _show_environment(command)


# The order of `switchboard --help` is click's (by name), whatever the order here.
for command in (
    serve.serve,
    agent.agent,
    session.session,
    log.log_group,
    delivery.delivery,
    db.db,
    chat.chat,
    gateway.gateway,
    console.console,
):
    main.add_command(command)
_show_environment(main)
