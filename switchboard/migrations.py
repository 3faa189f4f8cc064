"""Versioned schema migrations: each component's ordered list, applied once, under a lock.

A component (the SessionService's tables, the DeliveryService's) has an ordered
list of migration functions: `session_service/migrations.py` and
`delivery_service/migrations.py`. Migration N is the N-th function; the
database's version of a component is the highest N recorded in the
component's history table (`session_schema_history`, `ledger_schema_history`;
one row per migration applied, with when and by which process). Both
components may share one Postgres database or each have its own SQLite file.

At start (`prepare`) a process compares the database's version with its own:

- equal: nothing to do (no lock, no DDL);
- the database is newer: `SchemaNewerThanCode`, and nothing is touched;
- the database is behind: the pending migrations run in ONE transaction that
  first takes the component's lock (a Postgres advisory transaction lock with a
  fixed key per component; SQLite's write lock, `BEGIN IMMEDIATE`) and reads
  the version again, so of N replicas starting together exactly one migrates
  and the others find the work done. Postgres and SQLite DDL is transactional:
  a failing migration leaves the database as it was. With `migrate=False`
  (`serve --no-migrate`) a behind schema is `SchemaBehind` instead.

A database created before versioning existed (the component's tables, no
history table) is adopted: the component's `adopt` function adds what the
baseline has and it lacks (peewee's `playhouse.schema_diff` finds the missing
tables, columns and indexes; `playhouse.migrate` adds them), then the
database is stamped at version 1 ("adopted") and later migrations run as usual.

How to add a migration
----------------------
1. Write a function `def add_something(schema: Schema) -> None` in the
   component's migrations module, with a one-line docstring saying what it
   does (`switchboard db status` shows it), and append it to the component's
   `MIGRATIONS` tuple. Never edit, reorder or remove a migration that has
   shipped: databases out there already record it.
2. In it, change the schema with peewee's own tools:
   - a new table: declare a frozen copy of its model in the migrations module
     (not the store's model, which will keep changing) and call
     `schema.create_tables(NewTableRow)`; seed rows with `schema.seed(...)`;
   - a new column, index, rename or drop: `schema.run(schema.migrator.add_column(
     "session_session", "pinned", peewee.BooleanField(default=False)))` and the
     other `playhouse.migrate` operations (`add_index`, `rename_column`, ...);
   - data: `schema.execute("UPDATE ...", params)` (`?` placeholders).
3. Make the store's model match (the tests check that the migrated schema
   equals what the store's models declare, on both backends).

Everything runs inside the transaction that holds the lock: do not commit, and
do not use statements Postgres refuses inside a transaction (e.g. `CREATE INDEX
CONCURRENTLY`). A table created today with `create_tables(..., safe=True)` in a
store becomes a migration by moving its frozen model here and calling
`schema.create_tables` from a new last function.
"""

from __future__ import annotations

import logging
import os
import socket
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import peewee
from playhouse.migrate import SchemaMigrator
from playhouse.schema_diff import diff_models

from switchboard.database import Backend, bind_model, tuples

log = logging.getLogger(__name__)

ADOPTED = "adopted"
APPLIED = "applied"


class SchemaError(Exception):
    """This code cannot use the database's schema as it is; the process must not start."""


class SchemaNewerThanCode(SchemaError):
    def __init__(self, component: str, database_version: int, code_version: int) -> None:
        super().__init__(
            f"the {component} schema of this database is at version {database_version}, "
            f"newer than this code knows (version {code_version}): a newer release migrated "
            f"it. Run that release (or a newer one); this one will not touch the schema."
        )
        self.database_version, self.code_version = database_version, code_version


class SchemaBehind(SchemaError):
    def __init__(self, component: str, database_version: int, code_version: int) -> None:
        super().__init__(
            f"the {component} schema of this database is at version {database_version}, "
            f"behind this code (version {code_version}), and migrating at start is off "
            f"(--no-migrate): run `switchboard db migrate` first."
        )
        self.database_version, self.code_version = database_version, code_version


class Schema:
    """What a migration function gets: the database, peewee's migrator and a few helpers.
    Everything it does runs inside the transaction holding the component's lock."""

    def __init__(self, database: peewee.Database, sql: Callable[[str], str]) -> None:
        self.database: Any = database
        self._sql = sql  # `?` placeholders in the dialect (`Backend.sql`)
        self.migrator: SchemaMigrator = SchemaMigrator.from_database(database)

    def create_tables(self, *models: type[peewee.Model]) -> None:
        """Creates the tables of (frozen, unbound) models, with their indexes."""
        with self.database.bind_ctx(models):
            self.database.create_tables(models, safe=False)

    def seed(self, model: type[peewee.Model], **values: Any) -> None:
        """Inserts a row unless one with its key exists."""
        with self.database.bind_ctx([model]):
            model.insert(**values).on_conflict_ignore().execute()

    def run(self, *operations: Any) -> None:
        """Runs `playhouse.migrate` operations (`schema.migrator.add_column(...)`, ...)."""
        self.migrator.migrate(*operations)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Runs one statement, `?` placeholders."""
        return self.database.execute_sql(self._sql(sql), params)

    def complete(self, *models: type[peewee.Model]) -> list[str]:
        """Adds the tables, columns and indexes of `models` the database lacks (never
        drops anything); returns what it added. For adopting pre-versioning databases."""
        diff = diff_models(self.database, models)
        if diff.create_tables:
            self.create_tables(*diff.create_tables)
        for column in diff.add_columns:
            table = column.model._meta.table_name
            self.run(self.migrator.add_column(table, column.column_name, column))
        for index in diff.add_indexes:
            self.run(self.migrator.add_index(index.table, index.columns, index.unique))
        added = [f"create table {model._meta.table_name}" for model in diff.create_tables]
        added += [
            f"add column {f.model._meta.table_name}.{f.column_name}" for f in diff.add_columns
        ]
        added += [index.display("add") for index in diff.add_indexes]
        if added:
            log.info("schema: added what an older database lacked: %s", "; ".join(added))
        return added


Migration = Callable[[Schema], None]


@dataclass(frozen=True)
class Component:
    """One service's tables and their ordered migrations."""

    name: str
    #: Where the applied migrations are recorded (in the component's own prefix).
    history_table: str
    #: Migration N is `migrations[N - 1]`; the first is the baseline schema.
    migrations: tuple[Migration, ...]
    #: Brings a database created before versioning up to the baseline.
    adopt: Migration
    #: Tables whose presence (without a history table) marks such a database.
    legacy_tables: tuple[str, ...]

    @property
    def code_version(self) -> int:
        return len(self.migrations)

    @property
    def lock_key(self) -> int:
        """The Postgres advisory lock key: fixed per component, the same in every replica."""
        return zlib.crc32(f"switchboard.schema.{self.name}".encode())

    def title(self, version: int) -> str:
        migration = self.migrations[version - 1]
        doc = (migration.__doc__ or "").strip().splitlines()
        return f"{version} {migration.__name__}" + (f": {doc[0]}" if doc else "")


@dataclass(frozen=True)
class Applied:
    """One row of a component's history."""

    version: int
    name: str
    action: str  # APPLIED or ADOPTED
    applied_at: float
    applied_by: str


@dataclass(frozen=True)
class SchemaStatus:
    component: str
    database_version: int
    code_version: int
    #: The database has the component's tables but no history: migrating adopts it.
    unversioned: bool
    pending: list[str]
    history: list[Applied] = field(default_factory=list)


@dataclass(frozen=True)
class MigrationReport:
    component: str
    from_version: int
    to_version: int
    #: "1 baseline", ... in the order they ran.
    applied: list[str]
    adopted: bool = False


def _history_model(component: Component, database: peewee.Database) -> Any:
    class History(peewee.Model):
        id = peewee.AutoField()
        version = peewee.IntegerField()
        name = peewee.CharField(max_length=128)
        action = peewee.CharField(max_length=16)
        applied_at = peewee.DoubleField()
        applied_by = peewee.CharField(max_length=255)

        class Meta:
            table_name = component.history_table

    return bind_model(History, database)


def _applier() -> str:
    return f"{socket.gethostname()} pid {os.getpid()}"


def _history(component: Component, database: peewee.Database) -> list[Applied]:
    if component.history_table not in database.get_tables():
        return []
    history = _history_model(component, database)
    query = history.select(
        history.version, history.name, history.action, history.applied_at, history.applied_by
    ).order_by(history.id)
    return [Applied(*row) for row in tuples(query)]


def _version(history: list[Applied]) -> int:
    return max((row.version for row in history), default=0)


def _unversioned(component: Component, database: peewee.Database, history: list[Applied]) -> bool:
    return not history and bool(set(component.legacy_tables) & set(database.get_tables()))


def status(backend: Backend, component: Component) -> SchemaStatus:
    """The database's version of `component` against this code's; reads only."""
    database: Any = backend.database
    with database.connection_context():
        history = _history(component, database)
        unversioned = _unversioned(component, database, history)
    version = _version(history)
    pending = [component.title(v) for v in range(version + 1, component.code_version + 1)]
    return SchemaStatus(
        component.name, version, component.code_version, unversioned, pending, history
    )


def migrate(backend: Backend, component: Component) -> MigrationReport:
    """Applies the pending migrations under the component's lock (see the module doc)."""
    database: Any = backend.database
    with database.connection_context(), backend.migration_lock(component.lock_key):
        # Under the lock: whoever held it before may have migrated already.
        schema = Schema(database, backend.sql)
        history_model = _history_model(component, database)
        history = _history(component, database)
        version = _version(history)
        if version > component.code_version:
            raise SchemaNewerThanCode(component.name, version, component.code_version)
        adopted = _unversioned(component, database, history)
        if component.history_table not in database.get_tables():
            database.create_tables([history_model])
        applied: list[str] = []

        def record(number: int, action: str) -> None:
            history_model.insert(
                version=number,
                name=component.migrations[number - 1].__name__,
                action=action,
                applied_at=backend.now(),
                applied_by=_applier(),
            ).execute()
            applied.append(component.title(number))

        start = version
        if adopted:
            component.adopt(schema)
            record(1, ADOPTED)
            start = 1
        for number in range(start + 1, component.code_version + 1):
            component.migrations[number - 1](schema)
            record(number, APPLIED)
    report = MigrationReport(component.name, version, component.code_version, applied, adopted)
    if applied:
        log.info(
            "schema %s: migrated from version %d to %d: %s",
            component.name, version, component.code_version, "; ".join(applied),
        )  # fmt: skip
    return report


def prepare(backend: Backend, component: Component, *, migrate_behind: bool = True) -> None:
    """At start: refuses a newer schema; migrates a behind one (or refuses it when
    `migrate_behind` is off); does nothing, without a lock, when they agree."""
    current = status(backend, component)
    if current.database_version > current.code_version:
        raise SchemaNewerThanCode(component.name, current.database_version, current.code_version)
    if current.database_version == current.code_version:
        return
    if not migrate_behind:
        raise SchemaBehind(component.name, current.database_version, current.code_version)
    migrate(backend, component)
