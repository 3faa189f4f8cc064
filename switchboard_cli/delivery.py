"""`switchboard delivery ...`: look into and repair the delivery ledger."""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import Any, TypeVar

import click
from switchboard_client import DeliveryClient

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard_cli.options import delivery_address_option, token_option
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


def _with_ledger(address: str, token: str | None, use: Callable[[Any], T]) -> T:
    with DeliveryClient(address, token=token) as client:
        return use(client)


STATES = ("PENDING", "ATTEMPTING", "DELIVERED", "FAILED", "ABANDONED")


def _state_name(value: int) -> str:
    return dpb.ObligationState.Name(value).removeprefix("OBLIGATION_STATE_")  # type: ignore[arg-type]


def _shown_error(row: Any) -> str:
    """A delivered row's error is history (rows delivered before the server cleared it
    on delivery still carry one): not shown."""
    return "" if _state_name(row.state) == "DELIVERED" else str(row.last_error)


def _ended(instance: Any) -> str:
    return "no (deregistered)" if instance.HasField("deregister_time") else "no (lease ran out)"


@click.group()
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
@output_option
@delivery_address_option
@token_option
def obligations(
    state: str | None,
    platform: str,
    session_key: str,
    gateway: str,
    limit: int,
    output: Output,
    address: str,
    token: str | None,
) -> None:
    """List obligations, oldest first (an agent token sees its agents' only)."""
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
    if output == "json":
        print_json_lines(rows[:limit])
    else:
        _obligations_table(rows[:limit])
    if len(rows) > limit:
        click.echo(
            f"more rows match: raise --limit (it is {limit}) or narrow the filters",
            err=output == "json",
        )


def _obligations_table(rows: list[Any]) -> None:
    table(
        "obligations",
        ["id", "state", "agent", "gateway", "platform", "chat", "attempts", "owner",
         "last error"],
        [
            [o.id, _state_name(o.state), o.agent, o.gateway_name, o.platform, o.chat_id,
             o.attempts, o.owner_instance_id[:8], _shown_error(o)]
            for o in rows
        ],
    )  # fmt: skip


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
@output_option
@delivery_address_option
@token_option
def instances(
    gateway: str, live_only: bool, limit: int, output: Output, address: str, token: str | None
) -> None:
    """List gateway instances: liveness, lease, platforms, rows held (admin)."""

    def read(client: Any) -> list[Any]:
        found = client.list_instances(
            gateway_name=gateway, live_only=live_only, page_size=min(limit + 1, 1000)
        )
        return list(islice(found, limit + 1))

    found = _with_ledger(address, token, read)
    if output == "json":
        print_json_lines(found[:limit])
    else:
        _instances_table(found[:limit])
    if len(found) > limit:
        click.echo(f"more instances match: raise --limit (it is {limit})", err=output == "json")


def _instances_table(found: list[Any]) -> None:
    table(
        "gateway instances",
        ["instance", "gateway", "platforms", "live", "registered", "last heartbeat",
         "lease until", "rows held", "host", "pid"],
        [
            [s.instance.instance_id, s.instance.gateway_name,
             ",".join(s.instance.platforms) or "-",
             "yes" if s.instance.live else _ended(s.instance),
             time_text(s.instance.register_time), time_text(s.instance.heartbeat_time),
             time_text(s.instance.lease_expire_time), s.held_count, s.instance.host,
             s.instance.pid]
            for s in found
        ],
    )  # fmt: skip


@delivery.command("obligation")
@click.argument("obligation_id")
@output_option
@delivery_address_option
@token_option
def obligation(obligation_id: str, output: Output, address: str, token: str | None) -> None:
    """Show one obligation."""
    _print_obligation(_with_ledger(address, token, lambda c: c.get(obligation_id)), output)


def _print_obligation(row: dpb.Obligation, output: Output) -> None:
    if output == "json":
        print_json_lines([row])
        return
    fields_table(
        f"obligation {row.id}",
        [
            ("id", row.id),
            ("state", _state_name(row.state)),
            ("agent", row.agent or "-"),
            ("session key", row.session_key),
            ("gateway", row.gateway_name or "-"),
            ("platform", row.platform),
            ("chat", row.chat_id or ("(sealed)" if row.sealed_target else "-")),
            ("thread", row.thread_id or "-"),
            ("message ref", row.message_ref or "-"),
            ("content", clipped(row.content)),
            ("attempts", row.attempts),
            ("owner", row.owner_instance_id or "-"),
            ("last error", _shown_error(row) or "-"),
            ("platform message", row.platform_message_id or "-"),
            ("recorded", time_text(row.create_time)),
            ("updated", time_text(row.update_time)),
            ("next attempt", time_text(row.next_attempt_time)),
            ("delivered", time_text(row.deliver_time)),
            ("metadata", mapping_text(row.metadata)),
        ],
    )


@delivery.command("stats")
@output_option
@delivery_address_option
@token_option
def stats(output: Output, address: str, token: str | None) -> None:
    """Rows per state, oldest pending age, rows in doubt, gated platforms."""
    result = _with_ledger(address, token, lambda c: c.stats())
    if output == "json":
        print_json_lines([result])
        return
    table(
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
@output_option
@delivery_address_option
@token_option
def prune(older_than: float | None, output: Output, address: str, token: str | None) -> None:
    """Delete old delivered and abandoned rows (never owed ones)."""
    pruned = _with_ledger(address, token, lambda c: c.prune(older_than))
    if output == "json":
        print_json_lines([{"pruned_count": pruned}])
        return
    click.echo(f"pruned {pruned} row(s)")


@delivery.command("retry")
@click.argument("obligation_id")
@output_option
@delivery_address_option
@token_option
def retry(obligation_id: str, output: Output, address: str, token: str | None) -> None:
    """Make a failed or abandoned row due again."""
    row = _with_ledger(address, token, lambda c: c.retry(obligation_id))
    if output == "json":
        print_json_lines([row])
        return
    click.echo(f"{row.id} is due for redelivery")


@delivery.command("abandon")
@click.argument("obligation_id")
@click.option("--reason", default="")
@output_option
@delivery_address_option
@token_option
def abandon(
    obligation_id: str, reason: str, output: Output, address: str, token: str | None
) -> None:
    """Give up on an owed row."""
    row = _with_ledger(address, token, lambda c: c.abandon(obligation_id, reason))
    if output == "json":
        print_json_lines([row])
        return
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
@output_option
@delivery_address_option
@token_option
def hand_over(
    from_gateway: str,
    from_no_gateway: bool,
    to_gateway: str,
    obligation_ids: tuple[str, ...],
    output: Output,
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
    if output == "json":
        print_json_lines([{"handed_over_count": moved}])
        return
    origin = "no gateway" if from_no_gateway else repr(from_gateway)
    click.echo(f"handed {moved} row(s) over from {origin} to {to_gateway!r}")
