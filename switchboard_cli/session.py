"""`switchboard session ...`: look into agents and sessions, move the log, rebuild projections."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any, TypeVar

import click
from rich.progress import Progress
from switchboard_client import SessionClient

from session_service import key_migration, recovery
from session_service.composition import build_core
from session_service.migrations import SESSION_SCHEMA, injective_routing_keys
from session_service.storage.store import SessionStore
from switchboard import migrations
from switchboard.backends import open_backend
from switchboard.database import DatabaseSettings
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_cli import agent as agent_commands
from switchboard_cli.databases import (
    DataDir,
    data_dir_option,
    database_url_option,
    locate,
    opened,
    require_existing,
)
from switchboard_cli.options import session_address_option, token_option
from switchboard_cli.output import (
    Output,
    clipped,
    fields_table,
    mapping_text,
    output_option,
    print_json_lines,
    table,
    time_text,
)

T = TypeVar("T")


@click.group()
def session() -> None:
    """Operate on the SessionService's storage."""


@session.command()
@database_url_option("session", "--database-url")
@data_dir_option
@output_option
def rebuild(database_url: str | None, data_dir: DataDir | None, output: Output) -> None:
    """Replay the whole log into fresh projections and report what differed."""
    location = locate("session", database_url, data_dir, url_flag="--database-url")
    require_existing(location, url_flag="--database-url")
    settings = DatabaseSettings(url=location.url)
    backend = open_backend(settings)
    try:
        migrations.prepare(backend, SESSION_SCHEMA)
    except migrations.SchemaError as refused:
        raise click.ClickException(str(refused)) from refused
    core = build_core(backend, settings)
    try:
        # The progress bar is for people: scripts get the report alone.
        with Progress(disable=output == "json") as bar:
            task = bar.add_task("replaying the log", total=None)
            report = recovery.rebuild(
                core, lambda done, total: bar.update(task, completed=done, total=total)
            )
    finally:
        core.runner.close()
    if output == "json":
        found = {"events": report.events, "differences": report.differences}
        print_json_lines([{**found, "repaired": report.differed}])
        return
    click.echo(f"replayed {report.events} events")
    for name, count in report.differences.items():
        click.echo(f"  {name}: {count} row(s) differed" if count else f"  {name}: identical")
    if report.differed:
        click.echo("projections were repaired from the log")


@session.command("key-report")
@database_url_option("session", "--database-url")
@data_dir_option
@output_option
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also the ambiguous sessions: another source could have made their old key, "
    "but nothing in their history says one did.",
)
def key_report(
    database_url: str | None, data_dir: DataDir | None, output: Output, show_all: bool
) -> None:
    """The sessions two conversations may have shared under one old routing key, as
    the upgrade to injective keys found them, with the evidence (reads the database)."""
    location = locate("session", database_url, data_dir, url_flag="--database-url")
    require_existing(location, url_flag="--database-url")
    with opened(location.url) as backend:
        version = migrations.status(backend, SESSION_SCHEMA).database_version
        upgrade = SESSION_SCHEMA.migrations.index(injective_routing_keys) + 1
        if version < upgrade:
            raise click.ClickException(
                f"the session schema is at version {version}: routing keys are upgraded "
                f"(and the report written) by migration {upgrade}; run `switchboard db "
                "migrate session` or start the service first"
            )
        found = key_migration.reported(SessionStore(backend))
    shown = [f for f in found if show_all or f.finding != key_migration.AMBIGUOUS]
    if output == "json":
        print_json_lines(dataclasses.asdict(row) for row in shown)
        return
    if not found:
        click.echo("the upgrade to injective routing keys reported no session")
        return
    click.echo(key_migration.summary_line(key_migration.counts(found)))
    if len(shown) < len(found):
        click.echo(f"({len(found) - len(shown)} ambiguous session(s) not shown: --all lists them)")
    table(
        "sessions reported by the routing-key upgrade",
        ["finding", "agent", "session", "status", "old key", "new key", "evidence"],
        [
            [f.finding, f.agent, f.session_id, f.status, f.old_key, f.new_key, f.evidence]
            for f in shown
        ],
    )


def _with_sessions(address: str, token: str | None, use: Callable[[Any], T]) -> T:
    with SessionClient(address, token=token) as client:
        return use(client)


_yes = click.option("--yes", is_flag=True, help="Do not ask for confirmation.")


_empty_log = click.option(
    "--empty-log",
    is_flag=True,
    help="Mean sequence 0, the empty log (every agent and session abandoned); "
    "needed with 0, refused with any other target.",
)


def _checked_empty_log(target: int | str, empty_log: bool) -> None:
    """Sequence 0 empties the whole deployment: an operator says so with --empty-log
    (a 0 from a script's unset variable must not do it)."""
    if target == 0 and not empty_log:
        raise click.UsageError(
            "sequence 0 is the empty log (every agent and session abandoned): "
            "add --empty-log if that is what you mean"
        )
    if empty_log and target != 0:
        raise click.UsageError("--empty-log goes with sequence 0 only")


def _confirmed_move(
    address: str, token: str | None, preview: Callable[[Any], Any], yes: bool, output: Output
) -> bool:
    """Shows a rewind's or checkout's preview; True when it should go ahead."""
    answer = _with_sessions(address, token, preview)
    if output == "json":  # the preview is the first line; the question goes to stderr
        print_json_lines([answer])
        return not answer.unchanged and (yes or click.confirm("Go ahead?", err=True))
    if answer.unchanged:
        click.echo(f"the log is already at {answer.to_sequence}: nothing would change")
        return False
    summary = answer.summary
    table(
        f"moving to {answer.to_sequence}",
        ["agent", "session", "abandoned", "restored"],
        [
            [e.agent, e.session_id or "(agent)", e.abandoned_count, e.restored_count]
            for e in summary.effects
        ],
    )
    more = (
        f" ({summary.changed_count - len(summary.effects)} more not listed)"
        if summary.truncated
        else ""
    )
    click.echo(
        f"{summary.abandoned_count} event(s) abandoned, {summary.restored_count} restored, "
        f"over {summary.changed_count} agent(s)/session(s){more}"
    )
    return yes or click.confirm("Go ahead?", default=False)


def _role(value: int) -> str:
    return pb.Role.Name(value).removeprefix("ROLE_").lower()  # type: ignore[arg-type]


@session.command("show")
@click.argument("agent")
@click.argument("session_id")
@output_option
@session_address_option
@token_option
def show(agent: str, session_id: str, output: Output, address: str, token: str | None) -> None:
    """Show one session's state (inbox, outbox, task, temp state)."""
    state = _with_sessions(address, token, lambda c: c.state(agent, session_id)).state
    if output == "json":
        print_json_lines([state])
        return
    summary = state.session
    fields_table(
        f"session {summary.agent}/{summary.session_id}",
        [
            ("session", summary.session_id),
            ("agent", summary.agent),
            ("routing key", summary.routing_key or "-"),
            ("status", _status(summary)),
            ("version", summary.version),
            ("messages", summary.message_count),
            ("created", time_text(summary.create_time)),
            ("updated", time_text(summary.update_time)),
            ("resume pending", "yes" if summary.resume_pending else "no"),
            ("task", _task(state.current_task)),
            ("temp state", mapping_text(state.temp_state)),
            ("inbox", _queued(state.inbox)),
            ("outbox", _queued(state.outbox)),
        ],
    )


def _status(summary: pb.Session) -> str:
    if summary.status == pb.SESSION_STATUS_OPEN:
        return "suspended" if summary.suspended else "open"
    return f"ended ({summary.end_reason})" if summary.end_reason else "ended"


def _task(task: pb.Task) -> str:
    if not task.task_id:
        return "-"
    return f"{task.task_id}: {clipped(task.description, 60)}" if task.description else task.task_id


def _queued(messages: Sequence[pb.QueuedMessage]) -> str:
    """Queued messages, one a line: sequence, role and content, clipped."""
    lines = [
        f"{m.sequence} {_role(m.message.role)}: {clipped(m.message.content, 60)}" for m in messages
    ]
    return "\n".join(lines) or "-"


@session.command("sessions")
@click.argument("agent")
@output_option
@session_address_option
@token_option
def sessions(agent: str, output: Output, address: str, token: str | None) -> None:
    """List an agent's sessions, newest first."""
    rows = _with_sessions(address, token, lambda c: list(c.list_sessions(agent)))
    if output == "json":
        print_json_lines(rows)
        return
    table(
        f"sessions of {agent}",
        ["session", "routing key", "status", "version", "messages", "ended because"],
        [
            [s.session_id, s.routing_key, "open" if s.status == 1 else "ended", s.version,
             s.message_count, s.end_reason]
            for s in rows
        ],
    )  # fmt: skip


@session.command("checkpoint")
@click.argument("label")
@output_option
@session_address_option
@token_option
def checkpoint(label: str, output: Output, address: str, token: str | None) -> None:
    """Name the current head of the log."""
    made = _with_sessions(address, token, lambda c: c.create_checkpoint(label))
    if output == "json":
        print_json_lines([made])
        return
    click.echo(f"checkpoint {made.label} at sequence {made.sequence}")


@session.command("checkpoints")
@output_option
@session_address_option
@token_option
def checkpoints(output: Output, address: str, token: str | None) -> None:
    """List checkpoints."""
    rows = _with_sessions(address, token, lambda c: c.list_checkpoints())
    if output == "json":
        print_json_lines(rows)
        return
    table("checkpoints", ["label", "sequence"], [[c.label, c.sequence] for c in rows])


@session.command("log")
@click.option("--after", type=click.IntRange(min=0), default=0, help="After this sequence.")
@click.option("--before", type=click.IntRange(min=0), default=0, help="Before this sequence.")
@click.option("--agent", default="", help="Only this agent's events.")
@click.option("--session-id", default="", help="Only this session's events.")
@click.option("--type", "event_types", multiple=True, help="e.g. message_appended (repeatable).")
@click.option(
    "--branch",
    type=click.Choice(["any", "active", "abandoned"]),
    default="any",
    show_default=True,
)
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@output_option
@session_address_option
@token_option
def log(
    after: int,
    before: int,
    agent: str,
    session_id: str,
    event_types: tuple[str, ...],
    branch: str,
    limit: int,
    output: Output,
    address: str,
    token: str | None,
) -> None:
    """Read the global log in sequence order, filtered (admin token)."""

    def read(client: Any) -> list[Any]:
        entries = client.list_log_events(
            after=after,
            before=before,
            agent=agent,
            session_id=session_id,
            event_types=event_types,
            branch=pb.LogBranch.Value(f"LOG_BRANCH_{branch.upper()}")
            if branch != "any"
            else pb.LOG_BRANCH_UNSPECIFIED,
            page_size=min(limit, 1000),
        )
        return list(islice(entries, limit))

    entries = _with_sessions(address, token, read)
    if output == "json":
        print_json_lines(entries)
        return
    table(
        "log",
        ["sequence", "agent", "session", "type", "abandoned"],
        [
            [e.event.sequence, e.event.agent, e.event.session_id,
             e.event.WhichOneof("body"), "yes" if e.abandoned else ""]
            for e in entries
        ],
    )  # fmt: skip


@session.command("history")
@click.argument("agent")
@click.argument("session_id")
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=1000),
    default=50,
    show_default=True,
    help="Messages per page.",
)
@click.option("--oldest", is_flag=True, help="Start from the first message, not the newest.")
@click.option("--page-token", default="", help="The token a previous page printed.")
@click.option("--all", "every_page", is_flag=True, help="Print every page, not one.")
@click.option("--abandoned", is_flag=True, help="Also messages a rewind abandoned.")
@output_option
@session_address_option
@token_option
def history(
    agent: str,
    session_id: str,
    limit: int,
    oldest: bool,
    page_token: str,
    every_page: bool,
    abandoned: bool,
    output: Output,
    address: str,
    token: str | None,
) -> None:
    """A session's messages, a page at a time (the newest page first, unless
    --oldest); each page is printed oldest message first."""

    def read(client: Any) -> tuple[list[Any], str]:
        messages: list[Any] = []
        cursor = page_token
        while True:
            page = client.history_page(
                agent, session_id, limit=limit, newest=not oldest,
                include_abandoned=abandoned, page_token=cursor,
            )  # fmt: skip
            # Newest first: an older page goes before the ones already read.
            messages = [*page.messages, *messages] if not oldest else [*messages, *page.messages]
            cursor = page.next_page_token
            if not every_page or not cursor:
                return messages, cursor

    messages, more = _with_sessions(address, token, read)
    if output == "json":
        print_json_lines(messages)
    else:
        table(
            f"history of {agent}/{session_id}",
            ["sequence", "role", "sender", "content", "abandoned"],
            [
                [m.sequence, _role(m.message.role), m.message.sender,
                 clipped(m.message.content), "yes" if m.abandoned else ""]
                for m in messages
            ],
        )  # fmt: skip
    if more:
        which = "newer" if oldest else "older"
        flags = " --oldest" if oldest else ""
        click.echo(
            f"{which} messages: switchboard session history {agent} {session_id}"
            f"{flags} --limit {limit} --page-token {more}",
            err=output == "json",
        )


@session.command("rewind")
@click.argument("target")
@_empty_log
@_yes
@output_option
@session_address_option
@token_option
def rewind(
    target: str, empty_log: bool, yes: bool, output: Output, address: str, token: str | None
) -> None:
    """Move every agent and session back to a sequence or a checkpoint label.

    Shows what it would abandon first and asks before doing it."""
    to: int | str = int(target) if target.isdigit() else target
    _checked_empty_log(to, empty_log)

    def preview(client: Any) -> Any:
        return client.preview_rewind(to, empty_log=empty_log)

    if not _confirmed_move(address, token, preview, yes, output):
        return
    record = _with_sessions(address, token, lambda c: c.rewind(to, empty_log=empty_log))
    if output == "json":  # the record written ({} when nothing was)
        print_json_lines([record])
        return
    if not record.sequence:
        click.echo("nothing to abandon: nothing written")
        return
    click.echo(f"rewound to {record.rewound.to_sequence} (record {record.sequence})")


@session.command("checkout")
@click.argument("sequence", type=click.IntRange(min=0))
@_empty_log
@_yes
@output_option
@session_address_option
@token_option
def checkout(
    sequence: int, empty_log: bool, yes: bool, output: Output, address: str, token: str | None
) -> None:
    """Move to any sequence, abandoned branches included (undoes a rewind).

    Shows what it would abandon and restore first and asks before doing it."""
    _checked_empty_log(sequence, empty_log)

    def preview(client: Any) -> Any:
        return client.preview_checkout(sequence, empty_log=empty_log)

    if not _confirmed_move(address, token, preview, yes, output):
        return
    record = _with_sessions(address, token, lambda c: c.checkout(sequence, empty_log=empty_log))
    if output == "json":  # the record written ({} when nothing was)
        print_json_lines([record])
        return
    if not record.sequence:
        click.echo("nothing to change: nothing written")
        return
    click.echo(f"checked out {record.rewound.to_sequence} (record {record.sequence})")


# The agent commands under their older names.
session.add_command(agent_commands.list_agents, "agents")
session.add_command(agent_commands.show, "agent")
