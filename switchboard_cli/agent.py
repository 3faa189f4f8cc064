"""Agents, as the commands that need one find or create them."""

from __future__ import annotations

from typing import Any

import click
from switchboard_client import SwitchboardError


def create_missing_agent(sessions: Any, agent: str) -> None:
    try:
        sessions.create_agent(agent)
    except SwitchboardError as refused:
        if refused.code.name != "PERMISSION_DENIED":
            raise
        raise click.ClickException(
            f"agent {agent!r} does not exist and this token may not create it "
            "(PERMISSION_DENIED): create it with an admin token, e.g. "
            f"`switchboard chat --agent {agent} --token ADMIN_TOKEN` once"
        ) from None
