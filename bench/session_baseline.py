"""The SessionService's insert floor: one log row per transaction through peewee, in-process.

A peewee model shaped like the server's log row (`session_service.log_store.
EventRow`: seq BIGINT primary key, agent, session_id, kind, payload BLOB, and
the same three secondary indexes), and one INSERT per transaction of a row
whose payload is a serialized `Event` carrying the benchmark's 100-byte USER
message: `db.atomic('IMMEDIATE')` on SQLite (WAL, synchronous=FULL), plain
`db.atomic()` on Postgres. One thread, no gRPC, no log head, no projections:
what a durable append costs at the least through the ORM the server uses.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import peewee

from bench.baseline import SqliteSync
from bench.session_load import message_content
from bench.stats import Measurement, timed_loop
from switchboard.session.v1 import session_service_pb2 as pb


class FloorLogRow(peewee.Model):
    seq = peewee.BigIntegerField(primary_key=True)
    agent = peewee.CharField(max_length=64)
    session_id = peewee.CharField(max_length=128, null=True)
    kind = peewee.CharField(max_length=32)
    payload = peewee.BlobField()

    class Meta:
        table_name = "session_log"
        indexes = (
            (("session_id", "seq"), False),
            (("agent", "session_id", "seq"), False),
            (("session_id", "kind", "seq"), False),
        )


AGENT = "bench-floor"
SESSION_ID = "s_benchfloor0000000000000000000000"


def _payload(seq: int) -> bytes:
    """The serialized Event the server would log for append number `seq`."""
    event = pb.Event(
        sequence=seq,
        agent=AGENT,
        session_id=SESSION_ID,
        session_version=seq + 1,
        message_appended=pb.MessageAppended(
            message=pb.Message(role=pb.ROLE_USER, content=message_content(0, seq))
        ),
    )
    event.time.FromNanoseconds(time.time_ns())
    return event.SerializeToString()


def _insert_loop(
    database: peewee.Database, atomic: Callable[[], Any], name: str, seconds: float, warmup_s: float
) -> Measurement:
    model = FloorLogRow
    with database.bind_ctx([model]):
        database.create_tables([model])
        try:

            def insert(i: int) -> None:
                seq = i + 1
                with atomic():
                    model.insert(
                        seq=seq,
                        agent=AGENT,
                        session_id=SESSION_ID,
                        kind="message_appended",
                        payload=_payload(seq),
                    ).execute()

            measurement = timed_loop(name, insert, seconds, warmup_s)
        finally:
            database.drop_tables([model])
    measurement.rpcs_per_cycle = 1
    return measurement


def sqlite_floor(sync: SqliteSync, seconds: float, warmup_s: float = 0.5) -> Measurement:
    """Inserts on peewee's SqliteDatabase (WAL, synchronous=`sync`) in a temp dir."""
    directory = Path(tempfile.mkdtemp(prefix="bench-session-floor-"))
    try:
        database = peewee.SqliteDatabase(
            str(directory / "floor.sqlite3"),
            pragmas={
                "journal_mode": "wal",
                "synchronous": sync,
                "busy_timeout": 5000,
                "foreign_keys": 1,
            },
        )
        database.connect()
        try:
            return _insert_loop(
                database,
                lambda: database.atomic("IMMEDIATE"),
                f"peewee sqlite {sync}",
                seconds,
                warmup_s,
            )
        finally:
            database.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def postgres_floor(url: str, seconds: float, warmup_s: float = 0.5) -> Measurement:
    """Inserts on peewee's PostgresqlDatabase, one connection, plain atomic().

    `url` must point at a fresh, empty schema (its search_path, given as
    `?options=-csearch_path=…`): the table is created there and dropped again.
    """
    parsed = urlparse(url)
    options: dict[str, Any] = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    database = peewee.PostgresqlDatabase(
        unquote(parsed.path.lstrip("/")) or "postgres",
        user=unquote(parsed.username) if parsed.username else None,
        host=parsed.hostname or "127.0.0.1",
        port=parsed.port or 5432,
        connect_timeout=5,
        **options,
    )
    database.connect()
    try:
        return _insert_loop(database, database.atomic, "peewee postgres", seconds, warmup_s)
    finally:
        database.close()
