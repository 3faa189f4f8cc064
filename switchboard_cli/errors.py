"""A failed call or command as one line saying what to do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from switchboard_client import SwitchboardError


@contextmanager
def reported() -> Iterator[None]:
    try:
        yield
    except SwitchboardError as error:
        raise click.ClickException(f"{error.code.name}: {error.message}") from error


def chat_failure(error: Any, session_address: str, delivery_address: str) -> str:
    """One line saying what went wrong and what to do, for a person."""
    code = error.code.name
    if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return (
            f"cannot reach the services at {session_address} and {delivery_address} "
            f"({code}); start them with `switchboard serve` (or `python3 dev.py serve`), "
            "or pass --session-address/--delivery-address"
        )
    if code == "UNAUTHENTICATED":
        return (
            "the services refused the token (UNAUTHENTICATED); pass --token or set "
            "SWITCHBOARD_TOKEN to one of the server's --auth-tokens"
        )
    if code == "PERMISSION_DENIED":
        return f"this token may not do that (PERMISSION_DENIED): {error.message}"
    return f"{code}: {error.message}"
