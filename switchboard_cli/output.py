"""What the commands print for people: rich tables, clipped text, times."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    shown = Table(title=title)
    for column in columns:
        shown.add_column(column)
    for row in rows:
        shown.add_row(*(str(value) for value in row))
    # Piped output gets wide lines rather than wrapped ids.
    Console(width=None if sys.stdout.isatty() else 200).print(shown)


def clipped(text: str, width: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def time_text(stamp: Any) -> str:
    """A Timestamp as UTC seconds; "-" when unset."""
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return str(stamp.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"))
