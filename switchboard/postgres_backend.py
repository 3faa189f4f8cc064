"""The PostgreSQL backend: a connection pool; the database's clock is "now"."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from playhouse.pool import PooledPostgresqlDatabase

from switchboard.database import DatabaseSettings
from switchboard.errors import DomainError


class PostgresBackend:
    name = "postgres"
    try_lock_sql = "pg_try_advisory_xact_lock(?)"
    for_update = " FOR UPDATE"
    skip_locked = True

    def __init__(self, url: str, settings: DatabaseSettings) -> None:
        parsed = urlparse(url)
        options = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
        self.writer_threads = settings.writer_threads
        self.database = PooledPostgresqlDatabase(
            unquote(parsed.path.lstrip("/")) or "postgres",
            user=unquote(parsed.username) if parsed.username else None,
            password=unquote(parsed.password) if parsed.password else None,
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 5432,
            max_connections=settings.pool_size,
            stale_timeout=300,
            **options,
        )

    def write_transaction(self) -> AbstractContextManager[Any]:
        transaction: AbstractContextManager[Any] = self.database.atomic()
        return transaction

    @contextmanager
    def migration_lock(self, key: int) -> Iterator[None]:
        # A transaction-level advisory lock: released by the commit (or rollback)
        # of the transaction whose DDL it guards, never left behind by a crash.
        with self.database.atomic():
            self.database.execute_sql("SELECT pg_advisory_xact_lock(%s)", (key,))
            yield

    def now(self) -> float:
        # The database's clock, so replicas with skewed clocks agree on leases.
        row = self.database.execute_sql("SELECT extract(epoch from clock_timestamp())").fetchone()
        return float(row[0])

    def probe(self) -> None:
        # Placeholder until the fault-handling work: a plain round trip.
        with self.database.connection_context():
            self.database.execute_sql("SELECT 1")

    def translate(self, exc: BaseException) -> DomainError | None:
        # Placeholder until the Postgres fault-handling work classifies connection errors.
        return None
