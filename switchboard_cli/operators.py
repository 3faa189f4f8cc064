"""Operators' commands: look into agents, sessions and the ledger; move the log.

They talk to running services over gRPC (tables for lists), like any client.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from google.protobuf.json_format import MessageToJson
from rich.console import Console
from rich.table import Table

from switchboard import secret_checks

T = TypeVar("T")

_session_address = click.option(
    "--address",
    default="127.0.0.1:50051",
    envvar="SWITCHBOARD_SESSION_ADDRESS",
    show_default=True,
    help="SessionService host:port.",
)
_delivery_address = click.option(
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


_token = click.option(
    "--token",
    default=None,
    envvar="SWITCHBOARD_TOKEN",
    callback=no_placeholder_token,
    help="Bearer token (admin for most).",
)


@contextmanager
def _reported() -> Iterator[None]:
    from switchboard_client import SwitchboardError

    try:
        yield
    except SwitchboardError as error:
        raise click.ClickException(f"{error.code.name}: {error.message}") from error


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(value) for value in row))
    # Piped output gets wide lines rather than wrapped ids.
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def _with_sessions(address: str, token: str | None, use: Callable[[Any], T]) -> T:
    from switchboard_client import SessionClient

    with _reported(), SessionClient(address, token=token) as client:
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
    address: str, token: str | None, preview: Callable[[Any], Any], yes: bool
) -> bool:
    """Shows a rewind's or checkout's preview; True when it should go ahead."""
    answer = _with_sessions(address, token, preview)
    if answer.unchanged:
        click.echo(f"the log is already at {answer.to_sequence}: nothing would change")
        return False
    summary = answer.summary
    _table(
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


def _with_ledger(address: str, token: str | None, use: Callable[[Any], T]) -> T:
    from switchboard_client import DeliveryClient

    with _reported(), DeliveryClient(address, token=token) as client:
        return use(client)


def _role(value: int) -> str:
    from switchboard.session.v1 import session_service_pb2 as pb

    return pb.Role.Name(value).removeprefix("ROLE_").lower()  # type: ignore[arg-type]


def _clipped(text: str, width: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _event_line(event: Any) -> str:
    """One line per event: sequence, time, agent/session, type and its body, clipped."""
    kind = event.WhichOneof("body") or "?"
    body = MessageToJson(getattr(event, kind), indent=None) if kind != "?" else ""
    where = f"{event.agent}/{event.session_id}" if event.session_id else event.agent or "-"
    return f"{event.sequence} {_time(event.time)} {where} {kind} {_clipped(body)}"


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


STATES = ("PENDING", "ATTEMPTING", "DELIVERED", "FAILED", "ABANDONED")


def _state_name(value: int) -> str:
    from switchboard.delivery.v1 import delivery_service_pb2 as dpb

    return dpb.ObligationState.Name(value).removeprefix("OBLIGATION_STATE_")  # type: ignore[arg-type]


def _shown_error(row: Any) -> str:
    """A delivered row's error is history (rows delivered before the server cleared it
    on delivery still carry one): not shown."""
    return "" if _state_name(row.state) == "DELIVERED" else str(row.last_error)


def _time(stamp: Any) -> str:
    """A Timestamp as UTC seconds; "-" when unset."""
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return str(stamp.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"))


def _ended(instance: Any) -> str:
    return "no (deregistered)" if instance.HasField("deregister_time") else "no (lease ran out)"


def register(session: click.Group, main: click.Group) -> None:
    """Adds the operators' commands to the `session` group and a `delivery` group."""

    @session.command("agents")
    @_session_address
    @_token
    def agents(address: str, token: str | None) -> None:
        """List agents."""
        rows = _with_sessions(address, token, lambda c: list(c.list_agents()))
        _table(
            "agents",
            ["name", "version", "peers", "rules", "archived"],
            [[a.name, a.version, ",".join(a.peers), len(a.permissions), a.archived] for a in rows],
        )

    @session.command("agent")
    @click.argument("name")
    @_session_address
    @_token
    def agent(name: str, address: str, token: str | None) -> None:
        """Show one agent: memory, permissions, peers, settings."""
        shown = _with_sessions(address, token, lambda c: c.get_agent(name))
        click.echo(MessageToJson(shown))

    @session.command("show")
    @click.argument("agent")
    @click.argument("session_id")
    @_session_address
    @_token
    def show(agent: str, session_id: str, address: str, token: str | None) -> None:
        """Show one session's state (inbox, outbox, task, temp state)."""
        state = _with_sessions(address, token, lambda c: c.state(agent, session_id))
        click.echo(MessageToJson(state.state))

    @session.command("sessions")
    @click.argument("agent")
    @_session_address
    @_token
    def sessions(agent: str, address: str, token: str | None) -> None:
        """List an agent's sessions, newest first."""
        rows = _with_sessions(address, token, lambda c: list(c.list_sessions(agent)))
        _table(
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
    @_session_address
    @_token
    def checkpoint(label: str, address: str, token: str | None) -> None:
        """Name the current head of the log."""
        made = _with_sessions(address, token, lambda c: c.create_checkpoint(label))
        click.echo(f"checkpoint {made.label} at sequence {made.sequence}")

    @session.command("checkpoints")
    @_session_address
    @_token
    def checkpoints(address: str, token: str | None) -> None:
        """List checkpoints."""
        rows = _with_sessions(address, token, lambda c: c.list_checkpoints())
        _table("checkpoints", ["label", "sequence"], [[c.label, c.sequence] for c in rows])

    @session.command("log")
    @click.option("--after", type=click.IntRange(min=0), default=0, help="After this sequence.")
    @click.option("--before", type=click.IntRange(min=0), default=0, help="Before this sequence.")
    @click.option("--agent", default="", help="Only this agent's events.")
    @click.option("--session-id", default="", help="Only this session's events.")
    @click.option(
        "--type", "event_types", multiple=True, help="e.g. message_appended (repeatable)."
    )
    @click.option(
        "--branch",
        type=click.Choice(["any", "active", "abandoned"]),
        default="any",
        show_default=True,
    )
    @click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
    @click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
    @_session_address
    @_token
    def log(
        after: int,
        before: int,
        agent: str,
        session_id: str,
        event_types: tuple[str, ...],
        branch: str,
        limit: int,
        as_json: bool,
        address: str,
        token: str | None,
    ) -> None:
        """Read the global log in sequence order, filtered (admin token)."""
        from itertools import islice

        from switchboard.session.v1 import session_service_pb2 as pb

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
        if as_json:
            for entry in entries:
                click.echo(MessageToJson(entry, indent=None))
            return
        _table(
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
    @click.option("--json", "as_json", is_flag=True, help="One JSON message per line.")
    @_session_address
    @_token
    def history(
        agent: str,
        session_id: str,
        limit: int,
        oldest: bool,
        page_token: str,
        every_page: bool,
        abandoned: bool,
        as_json: bool,
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
                messages = (
                    [*page.messages, *messages] if not oldest else [*messages, *page.messages]
                )
                cursor = page.next_page_token
                if not every_page or not cursor:
                    return messages, cursor

        messages, more = _with_sessions(address, token, read)
        if as_json:
            for queued in messages:
                click.echo(MessageToJson(queued, indent=None))
        else:
            _table(
                f"history of {agent}/{session_id}",
                ["sequence", "role", "sender", "content", "abandoned"],
                [
                    [m.sequence, _role(m.message.role), m.message.sender,
                     _clipped(m.message.content), "yes" if m.abandoned else ""]
                    for m in messages
                ],
            )  # fmt: skip
        if more:
            which = "newer" if oldest else "older"
            flags = " --oldest" if oldest else ""
            click.echo(
                f"{which} messages: switchboard session history {agent} {session_id}"
                f"{flags} --limit {limit} --page-token {more}",
                err=as_json,
            )

    @session.command("rewind")
    @click.argument("target")
    @_empty_log
    @_yes
    @_session_address
    @_token
    def rewind(target: str, empty_log: bool, yes: bool, address: str, token: str | None) -> None:
        """Move every agent and session back to a sequence or a checkpoint label.

        Shows what it would abandon first and asks before doing it."""
        to: int | str = int(target) if target.isdigit() else target
        _checked_empty_log(to, empty_log)

        def preview(client: Any) -> Any:
            return client.preview_rewind(to, empty_log=empty_log)

        if not _confirmed_move(address, token, preview, yes):
            return
        record = _with_sessions(address, token, lambda c: c.rewind(to, empty_log=empty_log))
        if not record.sequence:
            click.echo("nothing to abandon: nothing written")
            return
        click.echo(f"rewound to {record.rewound.to_sequence} (record {record.sequence})")

    @session.command("checkout")
    @click.argument("sequence", type=click.IntRange(min=0))
    @_empty_log
    @_yes
    @_session_address
    @_token
    def checkout(
        sequence: int, empty_log: bool, yes: bool, address: str, token: str | None
    ) -> None:
        """Move to any sequence, abandoned branches included (undoes a rewind).

        Shows what it would abandon and restore first and asks before doing it."""
        _checked_empty_log(sequence, empty_log)

        def preview(client: Any) -> Any:
            return client.preview_checkout(sequence, empty_log=empty_log)

        if not _confirmed_move(address, token, preview, yes):
            return
        record = _with_sessions(address, token, lambda c: c.checkout(sequence, empty_log=empty_log))
        if not record.sequence:
            click.echo("nothing to change: nothing written")
            return
        click.echo(f"checked out {record.rewound.to_sequence} (record {record.sequence})")

    @main.group("log")
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
    @click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
    @_session_address
    @_token
    def tail(
        lines: int,
        agent: str,
        session_id: str,
        follow: bool,
        after: int | None,
        as_json: bool,
        address: str,
        token: str | None,
    ) -> None:
        """The latest events of the log, then with --follow new ones as they commit.

        The latest events need an admin token (the log is every agent's). An agent
        token follows its agent: --follow --agent NAME, from --after SEQ or from the
        agent's first event."""
        from switchboard_client import SessionClient, SwitchboardError

        def printed(event: Any) -> None:
            click.echo(MessageToJson(event, indent=None) if as_json else _event_line(event))

        with _reported(), SessionClient(address, token=token) as client:
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

    @main.group()
    def delivery() -> None:
        """Look into and repair the delivery ledger."""

    @delivery.command("obligations")
    @click.option(
        "--state",
        type=click.Choice([s.lower() for s in STATES]),
        default=None,
        help="Only rows in this state [default: any].",
    )
    @click.option("--platform", default="", help="Only rows for this platform.")
    @click.option("--session-key", default="", help="Only rows of this session key.")
    @click.option("--gateway", default="", help="Only rows bound to this gateway name.")
    @click.option(
        "--limit",
        type=click.IntRange(min=1),
        default=100,
        show_default=True,
        help="At most this many rows (the oldest first).",
    )
    @_delivery_address
    @_token
    def obligations(
        state: str | None,
        platform: str,
        session_key: str,
        gateway: str,
        limit: int,
        address: str,
        token: str | None,
    ) -> None:
        """List obligations, oldest first (an agent token sees its agents' only)."""
        from itertools import islice

        from switchboard.delivery.v1 import delivery_service_pb2 as dpb

        wanted = dpb.ObligationState.Value(f"OBLIGATION_STATE_{state.upper()}") if state else 0

        def read(client: Any) -> list[Any]:
            rows = client.list(
                state=wanted,
                platform=platform,
                session_key=session_key,
                gateway_name=gateway,
                page_size=min(limit + 1, 1000),
            )
            return list(islice(rows, limit + 1))

        rows = _with_ledger(address, token, read)
        _table(
            "obligations",
            ["id", "state", "agent", "gateway", "platform", "chat", "attempts", "owner",
             "last error"],
            [
                [o.id, _state_name(o.state), o.agent, o.gateway_name, o.platform, o.chat_id,
                 o.attempts, o.owner_instance_id[:8], _shown_error(o)]
                for o in rows[:limit]
            ],
        )  # fmt: skip
        if len(rows) > limit:
            click.echo(f"more rows match: raise --limit (it is {limit}) or narrow the filters")

    @delivery.command("instances")
    @click.option("--gateway", default="", help="Only instances of this gateway name.")
    @click.option("--live", "live_only", is_flag=True, help="Only live instances.")
    @click.option(
        "--limit",
        type=click.IntRange(min=1),
        default=100,
        show_default=True,
        help="At most this many (the latest registered first).",
    )
    @_delivery_address
    @_token
    def instances(
        gateway: str, live_only: bool, limit: int, address: str, token: str | None
    ) -> None:
        """List gateway instances: liveness, lease, platforms, rows held (admin)."""
        from itertools import islice

        def read(client: Any) -> list[Any]:
            found = client.list_instances(
                gateway_name=gateway, live_only=live_only, page_size=min(limit + 1, 1000)
            )
            return list(islice(found, limit + 1))

        found = _with_ledger(address, token, read)
        _table(
            "gateway instances",
            ["instance", "gateway", "platforms", "live", "registered", "last heartbeat",
             "lease until", "rows held", "host", "pid"],
            [
                [s.instance.instance_id, s.instance.gateway_name,
                 ",".join(s.instance.platforms) or "-",
                 "yes" if s.instance.live else _ended(s.instance),
                 _time(s.instance.register_time), _time(s.instance.heartbeat_time),
                 _time(s.instance.lease_expire_time), s.held_count, s.instance.host,
                 s.instance.pid]
                for s in found[:limit]
            ],
        )  # fmt: skip
        if len(found) > limit:
            click.echo(f"more instances match: raise --limit (it is {limit})")

    @delivery.command("obligation")
    @click.argument("obligation_id")
    @_delivery_address
    @_token
    def obligation(obligation_id: str, address: str, token: str | None) -> None:
        """Show one obligation."""
        click.echo(MessageToJson(_with_ledger(address, token, lambda c: c.get(obligation_id))))

    @delivery.command("stats")
    @_delivery_address
    @_token
    def stats(address: str, token: str | None) -> None:
        """Rows per state, oldest pending age, rows in doubt, gated platforms."""
        from switchboard.delivery.v1 import delivery_service_pb2 as dpb

        result = _with_ledger(address, token, lambda c: c.stats())
        _table(
            "ledger",
            ["state", "rows"],
            [
                [dpb.ObligationState.Name(c.state).removeprefix("OBLIGATION_STATE_"), c.count]
                for c in result.state_counts
            ],
        )
        click.echo(
            f"oldest pending: {result.oldest_pending_age.seconds} s; in doubt: "
            f"{result.in_doubt_count}; live instances: {result.live_instance_count}"
        )
        for gate in result.gated:
            click.echo(f"waiting for {gate.platform}: {gate.count}")

    @delivery.command("prune")
    @click.option("--older-than", type=float, default=None, help="Seconds [server's retention]")
    @_delivery_address
    @_token
    def prune(older_than: float | None, address: str, token: str | None) -> None:
        """Delete old delivered and abandoned rows (never owed ones)."""
        pruned = _with_ledger(address, token, lambda c: c.prune(older_than))
        click.echo(f"pruned {pruned} row(s)")

    @delivery.command("retry")
    @click.argument("obligation_id")
    @_delivery_address
    @_token
    def retry(obligation_id: str, address: str, token: str | None) -> None:
        """Make a failed or abandoned row due again."""
        row = _with_ledger(address, token, lambda c: c.retry(obligation_id))
        click.echo(f"{row.id} is due for redelivery")

    @delivery.command("abandon")
    @click.argument("obligation_id")
    @click.option("--reason", default="")
    @_delivery_address
    @_token
    def abandon(obligation_id: str, reason: str, address: str, token: str | None) -> None:
        """Give up on an owed row."""
        row = _with_ledger(address, token, lambda c: c.abandon(obligation_id, reason))
        click.echo(f"{row.id} abandoned")

    @delivery.command("hand-over")
    @click.option("--from", "from_gateway", default="", help="Gateway name whose rows move.")
    @click.option(
        "--from-no-gateway",
        is_flag=True,
        help="Instead of --from: the rows of no known gateway (recorded before rows "
        "remembered their gateway).",
    )
    @click.option("--to", "to_gateway", required=True, help="Gateway name that claims them now.")
    @click.option("--id", "obligation_ids", multiple=True, help="Only this row (repeatable).")
    @_delivery_address
    @_token
    def hand_over(
        from_gateway: str,
        from_no_gateway: bool,
        to_gateway: str,
        obligation_ids: tuple[str, ...],
        address: str,
        token: str | None,
    ) -> None:
        """Let another gateway's instances claim one gateway's owed rows (admin)."""
        if bool(from_gateway) == from_no_gateway:
            raise click.UsageError("give the rows' gateway with --from NAME, or --from-no-gateway")
        moved = _with_ledger(
            address,
            token,
            lambda c: c.hand_over(
                from_gateway, to_gateway, obligation_ids, from_no_gateway=from_no_gateway
            ),
        )
        origin = "no gateway" if from_no_gateway else repr(from_gateway)
        click.echo(f"handed {moved} row(s) over from {origin} to {to_gateway!r}")
