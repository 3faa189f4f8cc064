"""`switchboard db status|migrate`: the services' schema versions, and migrating them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime

import click

from delivery_service.migrations import DELIVERY_SCHEMA
from session_service.migrations import SESSION_SCHEMA
from switchboard import migrations
from switchboard_cli.databases import (
    DataDir,
    Location,
    absence,
    data_dir_option,
    database_url_option,
    is_absent,
    locate,
    opened,
    redacted,
)
from switchboard_cli.output import Output, output_option, print_json_lines


@click.group()
def db() -> None:
    """Inspect and migrate the services' database schemas."""


def _schema_options(command: Callable[..., None]) -> Callable[..., None]:
    """The database options of `serve`, for the schema commands, and --output."""
    command = output_option(command)
    command = database_url_option("delivery")(command)
    command = database_url_option("session")(command)
    command = data_dir_option(command)
    return click.argument(
        "which", type=click.Choice(["all", "session", "delivery"]), default="all", required=False
    )(command)


def _schemas(
    which: str, data_dir: DataDir | None, session_url: str | None, delivery_url: str | None
) -> list[tuple[migrations.Component, Location]]:
    chosen = []
    if which in ("all", "session"):
        chosen.append((SESSION_SCHEMA, locate("session", session_url, data_dir)))
    if which in ("all", "delivery"):
        chosen.append((DELIVERY_SCHEMA, locate("delivery", delivery_url, data_dir)))
    return chosen


@db.command(name="status")
@_schema_options
def status_command(
    which: str,
    data_dir: DataDir | None,
    session_database_url: str | None,
    delivery_database_url: str | None,
    output: Output,
) -> None:
    """Per component: the database's schema version, this code's, and what is pending.

    A database file that is not there is an error (after the others are shown)."""
    chosen = _schemas(which, data_dir, session_database_url, delivery_database_url)
    missing = [location for _, location in chosen if is_absent(location)]
    for component, location in chosen:
        if location not in missing:  # reading a missing file would make it
            with opened(location.url) as backend:
                found = migrations.status(backend, component)
            if output == "json":
                print_json_lines([{"url": redacted(location.url), **asdict(found)}])
            else:
                _print_status(component, location.url, found)
    if missing:
        raise click.ClickException(absence(missing))


def _print_status(
    component: migrations.Component, url: str, found: migrations.SchemaStatus
) -> None:
    verdict = (
        "up to date"
        if found.database_version == found.code_version
        else f"{len(found.pending)} pending"
        if found.database_version < found.code_version
        else "NEWER than this code: run the release that migrated it"
    )
    click.echo(f"{component.name} ({redacted(url)}): {verdict}")
    unversioned = " (tables of a release before versioning: adopted on migrate)"
    click.echo(
        f"  database version: {found.database_version}" + (unversioned if found.unversioned else "")
    )
    click.echo(f"  code version:     {found.code_version}")
    for row in found.history:
        when = datetime.fromtimestamp(row.applied_at, UTC).isoformat(timespec="seconds")
        click.echo(f"  {row.action} {row.version} {row.name} at {when} by {row.applied_by}")
    for title in found.pending:
        click.echo(f"  pending {title}")


@db.command(name="migrate")
@_schema_options
def migrate_command(
    which: str,
    data_dir: DataDir | None,
    session_database_url: str | None,
    delivery_database_url: str | None,
    output: Output,
) -> None:
    """Apply the pending migrations (what `serve` does at start unless --no-migrate)."""
    chosen = _schemas(which, data_dir, session_database_url, delivery_database_url)
    for component, location in chosen:
        with opened(location.url) as backend:
            report = migrations.migrate(backend, component)
        if output == "json":
            print_json_lines([{"url": redacted(location.url), **asdict(report)}])
            continue
        if not report.applied:
            click.echo(f"{component.name}: already at version {report.to_version}")
            continue
        how = " (adopted a database from before versioning)" if report.adopted else ""
        click.echo(
            f"{component.name}: migrated from version {report.from_version} "
            f"to {report.to_version}{how}"
        )
        for title in report.applied:
            click.echo(f"  applied {title}")
