"""`switchboard agent create|list|show`, and the agent a chat or a gateway runs as,
created only when a person says so."""

from __future__ import annotations

from itertools import islice
from typing import Any

import click
import grpc
from google.protobuf.duration_pb2 import Duration
from switchboard_client import SessionClient, SwitchboardError

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_cli.options import session_address_option, token_option
from switchboard_cli.output import (
    Output,
    as_dict,
    fields_table,
    listed,
    mapping_text,
    output_option,
    print_json_lines,
    table,
    time_text,
)

#: The most agents one ListAgents page holds.
PAGE_SIZE_LIMIT = 1000


@click.group()
def agent() -> None:
    """Create agents and look at them."""


def _seconds(value: float) -> Duration:
    duration = Duration()
    duration.FromNanoseconds(round(value * 1e9))
    return duration


def _settings(
    redact_pii: bool,
    shared_group_sessions: bool,
    per_user_thread_sessions: bool,
    resume_window: float | None,
    never_resume: bool,
    reset_idle_after: float | None,
    reset_daily_at_hour: int | None,
) -> pb.AgentSettings:
    if reset_idle_after is not None and reset_daily_at_hour is not None:
        raise click.UsageError("an agent resets when idle or daily, not both: give one")
    if never_resume and resume_window is not None:
        raise click.UsageError("--never-resume and --resume-window contradict: give one")
    settings = pb.AgentSettings(redact_pii=redact_pii)
    if shared_group_sessions or per_user_thread_sessions:
        settings.routing.shared_group_sessions = shared_group_sessions
        settings.routing.per_user_thread_sessions = per_user_thread_sessions
    if resume_window is not None:
        settings.resume.freshness_window.CopyFrom(_seconds(resume_window))
    if never_resume:
        settings.resume.never_resume = True
    if reset_idle_after is not None:
        settings.reset.mode = pb.RESET_MODE_IDLE
        settings.reset.idle_after.CopyFrom(_seconds(reset_idle_after))
    if reset_daily_at_hour is not None:
        settings.reset.mode = pb.RESET_MODE_DAILY
        settings.reset.daily_at_hour = reset_daily_at_hour
    return settings


@agent.command("create")
@click.argument("name")
@click.option("--display-name", default="", help="A human-readable name.")
@click.option("--parent", default="", help="Make it a sub-agent of this agent (bounded by it).")
@click.option("--workspace-root", default="", help="The root of the agent's workspace.")
@click.option("--peer", "peers", multiple=True, help="An agent it may address (repeatable).")
@click.option("--redact-pii", is_flag=True, help="Store user and chat ids hashed.")
@click.option(
    "--shared-group-sessions",
    is_flag=True,
    help="One session per group or channel, shared by its members (default: one each).",
)
@click.option(
    "--per-user-thread-sessions",
    is_flag=True,
    help="One session per member in threads (default: one per thread).",
)
@click.option(
    "--resume-window",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds an interrupted turn stays resumable (0: always) [default: 1 hour].",
)
@click.option("--never-resume", is_flag=True, help="Never resume interrupted turns.")
@click.option(
    "--reset-idle-after",
    type=click.FloatRange(min=1),
    default=None,
    help="Start a fresh session when a message comes after this many idle seconds.",
)
@click.option(
    "--reset-daily-at-hour",
    type=click.IntRange(min=0, max=23),
    default=None,
    help="Start a fresh session at the first message after this hour (UTC) each day.",
)
@output_option
@session_address_option
@token_option
def create(
    name: str,
    display_name: str,
    parent: str,
    workspace_root: str,
    peers: tuple[str, ...],
    redact_pii: bool,
    shared_group_sessions: bool,
    per_user_thread_sessions: bool,
    resume_window: float | None,
    never_resume: bool,
    reset_idle_after: float | None,
    reset_daily_at_hour: int | None,
    output: Output,
    address: str,
    token: str | None,
) -> None:
    """Create an agent (an admin token); it prints the agent as stored."""
    settings = _settings(
        redact_pii, shared_group_sessions, per_user_thread_sessions, resume_window,
        never_resume, reset_idle_after, reset_daily_at_hour,
    )  # fmt: skip
    with SessionClient(address, token=token) as sessions:
        made = sessions.create_agent(
            name, display_name=display_name, parent=parent, workspace_root=workspace_root,
            peers=list(peers), settings=settings,
        )  # fmt: skip
    _print_agent(made, output)


@agent.command("show")
@click.argument("name")
@output_option
@session_address_option
@token_option
def show(name: str, output: Output, address: str, token: str | None) -> None:
    """Show one agent: settings, permissions, peers, memory."""
    with SessionClient(address, token=token) as sessions:
        _print_agent(sessions.get_agent(name), output)


@agent.command("list")
@click.option("--archived", is_flag=True, help="Archived agents too.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many, by name (read a page of the service at a time).",
)
@output_option
@session_address_option
@token_option
def list_agents(
    archived: bool, limit: int, output: Output, address: str, token: str | None
) -> None:
    """List agents by name (an admin token)."""
    with SessionClient(address, token=token) as sessions:
        pages = sessions.list_agents(
            include_archived=archived, page_size=min(limit + 1, PAGE_SIZE_LIMIT)
        )
        found = list(islice(pages, limit + 1))
    if output == "json":
        print_json_lines(found[:limit])
    else:
        table(
            "agents",
            ["name", "display name", "parent", "version", "peers", "rules", "archived"],
            [
                [a.name, a.display_name or "-", a.parent or "-", a.version, listed(a.peers),
                 len(a.permissions), "yes" if a.archived else ""]
                for a in found[:limit]
            ],
        )  # fmt: skip
    if len(found) > limit:
        click.echo(f"more agents: raise --limit (it is {limit})", err=output == "json")


def _print_agent(shown: pb.Agent, output: Output) -> None:
    if output == "json":
        print_json_lines([shown])
        return
    fields_table(
        f"agent {shown.name}",
        [
            ("name", shown.name),
            ("display name", shown.display_name or "-"),
            ("parent", shown.parent or "-"),
            ("workspace root", shown.workspace_root or "-"),
            ("peers", listed(shown.peers)),
            ("archived", "yes" if shown.archived else "no"),
            ("version", shown.version),
            ("last sequence", shown.last_sequence),
            ("created", time_text(shown.create_time)),
            ("updated", time_text(shown.update_time)),
            ("permissions", _rules(shown.permissions)),
            ("settings", _settings_text(shown.settings)),
            ("memory", mapping_text(shown.memory)),
        ],
    )


def _rules(rules: Any) -> str:
    lines = [
        f"{pb.PermissionEffect.Name(rule.effect).removeprefix('PERMISSION_EFFECT_').lower()} "
        f"{rule.action} on {rule.resource or '*'}"
        for rule in rules
    ]
    return "\n".join(lines) or "-"


def _settings_text(settings: pb.AgentSettings) -> str:
    """Only what differs from the defaults, one setting a line."""
    chosen = as_dict(settings)
    lines = [f"{key}: {_shown(value)}" for key, value in _flattened(chosen)]
    return "\n".join(lines) or "defaults"


def _shown(value: Any) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else str(value)


def _flattened(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for key, value in values.items():
        if isinstance(value, dict):
            found += _flattened(value, f"{prefix}{key}.")
        else:
            found.append((f"{prefix}{key}", value))
    return found


def ensure_agent(
    sessions: SessionClient, name: str, *, create: bool, ask: bool, create_flag: str
) -> None:
    """The agent a chat or a gateway runs as. A missing one is created only when the
    person said so: the flag, or (on a terminal) yes to the question."""
    try:
        sessions.get_agent(name)
        return
    except SwitchboardError as missing:
        if missing.code != grpc.StatusCode.NOT_FOUND:
            raise
    if not create and not ask:
        raise click.ClickException(
            f"agent {name!r} does not exist: pass {create_flag} to create it, or create it "
            f"with `switchboard agent create {name}`"
        )
    if not create and not click.confirm(f"agent {name!r} does not exist; create it?"):
        raise click.ClickException(f"agent {name!r} does not exist; nothing was created")
    try:
        sessions.create_agent(name)
    except SwitchboardError as refused:
        if refused.code != grpc.StatusCode.PERMISSION_DENIED:
            raise
        raise click.ClickException(
            f"agent {name!r} does not exist and this token may not create it "
            "(PERMISSION_DENIED): create it with an admin token, e.g. "
            f"`switchboard agent create {name} --token ADMIN_TOKEN`"
        ) from None
