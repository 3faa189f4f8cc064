"""`switchboard log tail`: the latest events of the global log, then new ones."""

from __future__ import annotations

from typing import Any

import click
from switchboard_client import SessionClient, SwitchboardError

from switchboard_cli.options import session_address_option, token_option
from switchboard_cli.output import Output, as_json, clipped, output_option, time_text


def _event_line(event: Any) -> str:
    """One line per event: sequence, time, agent/session, type and its body, clipped."""
    kind = event.WhichOneof("body") or "?"
    body = as_json(getattr(event, kind)) if kind != "?" else ""
    where = f"{event.agent}/{event.session_id}" if event.session_id else event.agent or "-"
    return f"{event.sequence} {time_text(event.time)} {where} {kind} {clipped(body)}"


def _has_events_after(client: Any, sequence: int) -> bool:
    return next(iter(client.list_log_events(after=sequence, page_size=1)), None) is not None


def _head(client: Any) -> int:
    """The log's latest sequence (0 for none), found in O(log head) one-event reads:
    no RPC answers it directly, and reading the log to its end costs O(log)."""
    if not _has_events_after(client, 0):
        return 0
    # Events lie after `low` and none after `high`: the head is in (low, high].
    low, high = 0, 1
    while _has_events_after(client, high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if _has_events_after(client, middle):
            low = middle
        else:
            high = middle
    return high


def _latest_events(client: Any, count: int, agent: str, session_id: str) -> list[Any]:
    """The latest `count` events matching the filters: windows before the head,
    widened until they hold enough or reach the start."""
    head = _head(client)
    if not count or not head:
        return []
    window = count
    while True:
        start = max(0, head - window)
        found = list(
            client.list_log_events(after=start, agent=agent, session_id=session_id, page_size=1000)
        )
        if len(found) >= count or start == 0:
            return found[-count:]
        window *= 8


@click.group("log")
def log_group() -> None:
    """Read the SessionService's global log."""


@log_group.command("tail")
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(min=0, max=1000),
    default=20,
    show_default=True,
    help="How many of the latest events to print first.",
)
@click.option("--agent", default="", help="Only this agent's events.")
@click.option("--session-id", default="", help="Only this session's events.")
@click.option(
    "-f", "--follow", is_flag=True, help="Then print events as they are written, until Ctrl-C."
)
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=None,
    help="Follow from this sequence on (instead of the latest events).",
)
@output_option
@session_address_option
@token_option
def tail(
    lines: int,
    agent: str,
    session_id: str,
    follow: bool,
    after: int | None,
    output: Output,
    address: str,
    token: str | None,
) -> None:
    """The latest events of the log, then with --follow new ones as they commit.

    The latest events need an admin token (the log is every agent's). An agent
    token follows its agent: --follow --agent NAME, from --after SEQ or from the
    agent's first event. For people each event is a line (a table cannot grow as
    events come)."""

    def printed(event: Any) -> None:
        click.echo(as_json(event) if output == "json" else _event_line(event))

    with SessionClient(address, token=token) as client:
        if after is None:
            try:
                latest = _latest_events(client, lines, agent, session_id)
                head = latest[-1].event.sequence if latest else _head(client)
            except SwitchboardError as refused:
                if not (follow and agent and refused.code.name == "PERMISSION_DENIED"):
                    raise
                click.echo("(reading the latest events needs an admin token: following "
                           f"{agent}'s events from its first)", err=True)  # fmt: skip
                latest, head = [], 0
            for entry in latest:
                printed(entry.event)
            after = head
        if not follow:
            return
        stream = client.watch(after, agent=agent, session_id=session_id)
        try:
            for event in stream:
                printed(event)
        except KeyboardInterrupt:
            stream.cancel()
