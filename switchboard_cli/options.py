"""Options many commands share: where the services are, the token, logging."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from switchboard import secret_checks
from switchboard.observability import configure_logging
from switchboard_cli.errors import DELIVERY, SESSION, Service, remember_address, remember_token

DEFAULT_SESSION_LISTEN = "127.0.0.1:50051"
DEFAULT_DELIVERY_LISTEN = "127.0.0.1:50052"
_DEFAULT_ADDRESSES = {SESSION: DEFAULT_SESSION_LISTEN, DELIVERY: DEFAULT_DELIVERY_LISTEN}


def log_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--log-level and --log-format, taken before the command (`switchboard
    --log-format text serve`) and by `serve` itself (`switchboard serve --log-format
    text`, which is what `python3 dev.py serve --log-format text` runs)."""
    command = click.option(
        "--log-format",
        default=None,
        envvar="SWITCHBOARD_LOG_FORMAT",
        type=click.Choice(["json", "text"]),
        help="json: one structured line per event; access lines carry method, status, "
        "duration, request id and principal; text: the same, for people [default: json].",
    )(command)
    return click.option(
        "--log-level",
        default=None,
        envvar="SWITCHBOARD_LOG_LEVEL",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        help="WARNING also silences the access lines of calls that ended OK [default: INFO].",
    )(command)


def relog(ctx: click.Context, log_level: str | None, log_format: str | None) -> None:
    """A command's own --log-level/--log-format win over the group's."""
    if log_level is None and log_format is None:
        return
    chosen = ctx.find_object(dict) or {}
    level = log_level or chosen.get("log_level", "INFO")
    shape = log_format or chosen.get("log_format", "json")
    configure_logging(level, json_format=shape == "json")


def address_option(service: Service, param: str, *older: str) -> Callable[..., Any]:
    """`--session` or `--delivery` (and the spellings commands took before), from the
    service's variable too; remembered for the error messages."""

    def remembered(ctx: click.Context, _param: click.Parameter, value: str) -> str:
        remember_address(ctx, service, value)
        return value

    return click.option(
        service.flag,
        *older,
        param,
        default=_DEFAULT_ADDRESSES[service],
        envvar=service.variable,
        show_default=True,
        callback=remembered,
        help=f"The {service.name}'s host:port.",
    )


session_address_option = address_option(SESSION, "address", "--address")
delivery_address_option = address_option(DELIVERY, "address", "--address")


def no_placeholder_token(
    ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    """A client's token that is a manifest placeholder (`CHANGE-ME-ADMIN`) is refused
    here, with what to do, rather than sent: a server refuses to start with one."""
    word = secret_checks.placeholder_word(value) if value else None
    if word is not None:
        raise click.BadParameter(
            f"the token is a placeholder (it contains {word!r}): use one of the "
            "services' real --auth-tokens"
        )
    remember_token(ctx, value)
    return value


def token_option_saying(help_text: str) -> Callable[..., Any]:
    return click.option(
        "--token",
        default=None,
        envvar="SWITCHBOARD_TOKEN",
        callback=no_placeholder_token,
        help=help_text,
    )


token_option = token_option_saying("Bearer token (admin for most).")
