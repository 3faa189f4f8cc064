"""Which database a command opens, and how its URL is shown and checked.

The SQLite files live in a data directory that a person names: `--data-dir`, else
SWITCHBOARD_DATA_DIR, else `data_dir` in the config file. Never the current
directory unasked: a command run from elsewhere would silently find no database,
or make an empty one.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlparse

import click
import peewee

from switchboard import migrations, secret_checks
from switchboard.backends import open_backend
from switchboard.database import Backend, DatabaseSettings

Service = Literal["session", "delivery"]
FILE_NAMES: dict[Service, str] = {"session": "session.sqlite3", "delivery": "delivery.sqlite3"}
SQLITE_PREFIX = "sqlite:///"
#: The settings the config file may hold.
CONFIG_KEYS = frozenset({"data_dir"})


@dataclass(frozen=True)
class DataDir:
    """A data directory and who named it ("--data-dir", "SWITCHBOARD_DATA_DIR", ...)."""

    path: Path
    origin: str


@dataclass(frozen=True)
class Location:
    """One service's database URL and what named it, for messages."""

    service: Service
    url: str
    named_by: str


def config_file() -> Path:
    """`$XDG_CONFIG_HOME/switchboard/config.toml` (~/.config when the variable is unset)."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "switchboard" / "config.toml"


def configured_data_dir(config: Path) -> DataDir | None:
    """`data_dir` of the config file (a relative one is taken from the file's folder);
    None when there is no file or it names none."""
    if not config.is_file():
        return None
    try:
        settings = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as unreadable:
        raise click.UsageError(f"cannot read the config file {config}: {unreadable}") from None
    unknown = sorted(set(settings) - CONFIG_KEYS)
    if unknown:
        raise click.UsageError(
            f"the config file {config} has unknown settings ({', '.join(unknown)}): "
            f"it may hold {', '.join(sorted(CONFIG_KEYS))} only"
        )
    value = settings.get("data_dir")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise click.UsageError(f'the config file {config}: write data_dir = "/a/path"')
    path = Path(value).expanduser()
    return DataDir((config.parent / path).resolve(), f"data_dir in {config}")


def _chosen_data_dir(ctx: click.Context, param: click.Parameter, value: Path | None) -> Any:
    """The flag or the variable; the config file is read only when a command needs it."""
    if value is None:
        return None
    source = ctx.get_parameter_source(str(param.name))
    origin = (
        "SWITCHBOARD_DATA_DIR" if source == click.core.ParameterSource.ENVIRONMENT else "--data-dir"
    )
    return DataDir(value.resolve(), origin)


def data_dir_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--data-dir",
        default=None,
        envvar="SWITCHBOARD_DATA_DIR",
        type=click.Path(file_okay=False, path_type=Path),
        callback=_chosen_data_dir,
        help="Where the SQLite files live when no database URL is given [default: "
        "data_dir in $XDG_CONFIG_HOME/switchboard/config.toml (~/.config/...); never the "
        "current directory unless named].",
    )(command)


def sqlite_url(path: Path) -> str:
    return f"{SQLITE_PREFIX}{path}"


def sqlite_path(url: str) -> Path | None:
    """The file a sqlite:/// URL names (as the SQLite backend opens it); None for
    another database or an in-memory one."""
    if not url.startswith(SQLITE_PREFIX) or url == SQLITE_PREFIX:
        return None
    return Path(url.removeprefix(SQLITE_PREFIX))


def _where_to_point(services: Sequence[Service], url_flag: str) -> str:
    flags = " / ".join(url_flag or f"--{service}-database-url" for service in services)
    return (
        f'give --data-dir DIR, set SWITCHBOARD_DATA_DIR, or write data_dir = "DIR" in '
        f"{config_file()}; or name the {' and '.join(services)} "
        f"database{'s' if len(services) > 1 else ''} with {flags}"
    )


def locate(
    service: Service, url: str | None, data_dir: DataDir | None, url_flag: str = ""
) -> Location:
    """The database a command opens: its URL when given, else its file in the data
    directory; no data directory anywhere is a usage error saying how to name one."""
    url_flag = url_flag or f"--{service}-database-url"
    if url:
        return Location(service, url, url_flag)
    chosen = data_dir or configured_data_dir(config_file())
    if chosen is None:
        raise click.UsageError(
            f"no data directory for the {service} database: "
            f"{_where_to_point([service], url_flag)}"
            " (`python3 dev.py serve` uses the checkout's var/)"
        )
    path = chosen.path / FILE_NAMES[service]
    return Location(service, sqlite_url(path), f"the data directory from {chosen.origin}")


def is_absent(location: Location) -> bool:
    """A SQLite file that is not there (reading it would make an empty one)."""
    path = sqlite_path(location.url)
    return path is not None and not path.exists()


def absence(missing: Sequence[Location], url_flag: str = "") -> str:
    """Where the commands looked for the databases that are not there, and how to
    point elsewhere."""
    looked = "; ".join(
        f"no {location.service} database at {sqlite_path(location.url)} ({location.named_by})"
        for location in missing
    )
    where = _where_to_point([location.service for location in missing], url_flag)
    return f"{looked}. Point elsewhere: {where}. `switchboard db migrate` makes a new, empty one."


def require_existing(location: Location, url_flag: str = "") -> None:
    if is_absent(location):
        raise click.ClickException(absence([location], url_flag))


@contextmanager
def opened(url: str) -> Iterator[Backend]:
    """A database for a command that reads or migrates it (`db status|migrate`), closed
    after; a refused schema or an unreachable database ends the command with one line,
    no traceback."""
    backend = open_backend(DatabaseSettings(url=url))
    try:
        yield backend
    except migrations.SchemaError as refused:
        raise click.ClickException(str(refused)) from refused
    except peewee.OperationalError as unreachable:
        raise click.ClickException(f"{redacted(url)}: {unreachable}") from unreachable
    finally:
        backend.database.close()


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


def redacted(url: str) -> str:
    """The database URL without its password, for printing."""
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        scheme, rest = url.split("//", 1)
        credentials, host = rest.split("@", 1)
        return f"{scheme}//{credentials.split(':', 1)[0]}:***@{host}"
    return url


def database_url_option(service: Service, flag: str = "") -> Callable[..., Any]:
    """`--SERVICE-database-url` (or `flag`), from SWITCHBOARD_SERVICE_DATABASE_URL too."""
    return click.option(
        flag or f"--{service}-database-url",
        default=None,
        envvar=f"SWITCHBOARD_{service.upper()}_DATABASE_URL",
        help=f"sqlite:///PATH or postgresql://USER@HOST:PORT/DB "
        f"[default: sqlite:///DATA_DIR/{FILE_NAMES[service]}]",
        callback=real_database_password,
    )
