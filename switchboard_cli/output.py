"""What the commands print: tables for people, or with `--output json` one JSON object
per line for scripts (protobuf's JSON with the .proto's snake_case field names).

Every command that prints data takes `--output`; a command's table and its JSON
are made from the same records.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import click
from google.protobuf.json_format import MessageToDict, MessageToJson
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

Output = Literal["table", "json"]


def output_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--output table|json` (`-o`); `--json`, which some commands took before, is
    kept as another way to say `--output json`."""
    command = click.option("--json", "output", flag_value="json", hidden=True)(command)
    return click.option(
        "--output",
        "-o",
        "output",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="table: for people; json: one JSON object per line (snake_case field names), "
        "for scripts.",
    )(command)


def as_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def as_json(message: Message) -> str:
    return MessageToJson(message, preserving_proto_field_name=True, indent=None)


def print_json_lines(records: Iterable[Message | Mapping[str, Any]]) -> None:
    for record in records:
        shown = as_json(record) if isinstance(record, Message) else json.dumps(record)
        click.echo(shown)


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    shown = Table(title=title)
    for column in columns:
        shown.add_column(column)
    for row in rows:
        shown.add_row(*(str(value) for value in row))
    # Piped output gets wide lines rather than wrapped ids.
    Console(width=None if sys.stdout.isatty() else 200).print(shown)


def fields_table(title: str, fields: Sequence[tuple[str, Any]]) -> None:
    """One record as a table of its fields, a row each."""
    table(title, ["field", "value"], [[name, value] for name, value in fields])


def clipped(text: str, width: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def time_text(stamp: Any) -> str:
    """A Timestamp as UTC seconds; "-" when unset."""
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return str(stamp.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"))


def listed(values: Iterable[Any]) -> str:
    """A repeated field in one cell; "-" when empty."""
    return ", ".join(str(value) for value in values) or "-"


def mapping_text(values: Mapping[str, str], width: int = 60) -> str:
    """A map field in one cell, one key per line, values clipped; "-" when empty."""
    return "\n".join(f"{key}: {clipped(value, width)}" for key, value in values.items()) or "-"
