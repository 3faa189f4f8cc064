"""Which database a command opens, and how its URL is shown and checked."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import click

from switchboard import secret_checks


def real_database_password(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    """A database URL whose password is a placeholder (the manifest's `CHANGE-ME`) or a
    well-known default is refused before anything connects with it (click names the
    option and, when it came from there, the environment variable)."""
    if not value:
        return value
    parsed = urlparse(value)
    passwords = [parsed.password or "", *parse_qs(parsed.query).get("password", [])]
    for password in filter(None, passwords):
        problem = secret_checks.weakness(unquote(password))
        if problem is not None:
            raise click.BadParameter(
                f"the database password in this URL is not a secret: {problem}; "
                "set the database user's real password in the URL (percent-encoded)"
            )
    return value


def refuse_missing_sqlite(url: str, options: str) -> None:
    """A command that reads a database must not create an empty one where none was
    (e.g. run from another directory than `serve`, whose --data-dir is relative)."""
    if not url.startswith("sqlite:///"):
        return
    path = Path(url.removeprefix("sqlite:///").split("?", 1)[0])
    if not path.exists():
        raise click.ClickException(
            f"no database file at {path}: nothing to rebuild. Name the database with "
            f"{options} (a relative --data-dir is taken from the current directory, "
            f"{Path.cwd()})"
        )


def redacted(url: str) -> str:
    """The database URL without its password, for printing."""
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        scheme, rest = url.split("//", 1)
        credentials, host = rest.split("@", 1)
        return f"{scheme}//{credentials.split(':', 1)[0]}:***@{host}"
    return url
