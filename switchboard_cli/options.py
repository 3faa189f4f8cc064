"""Options many commands share: where the services are, the token, logging."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from switchboard import secret_checks
from switchboard.observability import (
    configure_logging,
)

DEFAULT_SESSION_LISTEN = "127.0.0.1:50051"


DEFAULT_DELIVERY_LISTEN = "127.0.0.1:50052"


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


session_address_option = click.option(
    "--address",
    default="127.0.0.1:50051",
    envvar="SWITCHBOARD_SESSION_ADDRESS",
    show_default=True,
    help="SessionService host:port.",
)


delivery_address_option = click.option(
    "--address",
    default="127.0.0.1:50052",
    envvar="SWITCHBOARD_DELIVERY_ADDRESS",
    show_default=True,
    help="DeliveryService host:port.",
)


def no_placeholder_token(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    """A client's token that is a manifest placeholder (`CHANGE-ME-ADMIN`) is refused
    here, with what to do, rather than sent: a server refuses to start with one."""
    word = secret_checks.placeholder_word(value) if value else None
    if word is not None:
        raise click.BadParameter(
            f"the token is a placeholder (it contains {word!r}): use one of the "
            "services' real --auth-tokens"
        )
    return value


token_option = click.option(
    "--token",
    default=None,
    envvar="SWITCHBOARD_TOKEN",
    callback=no_placeholder_token,
    help="Bearer token (admin for most).",
)
