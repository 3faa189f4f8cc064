"""Recovery at scale: orphaned obligations, seeded through the real ledger store.

`seed_orphans` writes N PENDING obligations owned by one gateway instance and
then deregisters that instance, all in this process through
`delivery_service.store.LedgerStore` on the server's own database (the way
`tests/delivery/test_races.py` seeds its orphans): the instance registers, the
rows go in with `insert_if_live` inside big transactions (`CHUNK` rows each),
and the instance deregisters, which ends its lease. Every row is then
recoverable: what a fleet finds after a gateway with a deep backlog died.

`bench.claim_load` then claims them all over gRPC (ClaimRecoverable, 1,000 rows
per call); `bench.baseline.sqlite_claim_floor` / `postgres_claim_floor` are the
raw in-process floors of the same work (one UPDATE … RETURNING per 1,000 rows).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import baseline, harness, servers
from bench.harness import log
from bench.stats import Measurement
from delivery_service.migrations import DELIVERY_SCHEMA
from delivery_service.records import NewObligation
from delivery_service.state_machine import LedgerLimits
from delivery_service.store import COLUMNS, LedgerStore
from switchboard import migrations
from switchboard.database import DatabaseSettings, SqliteSync, open_backend

#: Rows per seeding transaction.
CHUNK = 10_000
#: Distinct conversations the orphans are spread over (as in the race tests).
CONVERSATIONS = 97
#: Lease of the doomed instance while it seeds (it deregisters right after).
LEASE_TTL_S = 3600.0


@dataclass(frozen=True)
class Seeded:
    instance_id: str
    rows: int
    seconds: float


def orphan(i: int) -> NewObligation:
    """Obligation number `i` of the dead instance: a Slack DM reply."""
    user = f"U{i % CONVERSATIONS}"
    return NewObligation(
        session_key=f"agent:main:slack:dm:{user}",
        message_ref=f"m{i}",
        content=f"reply {i}",
        platform="slack",
        chat_id=user,
    )


#: The gateway of the instance that owed the orphans.
CRASHED_GATEWAY = "bench-crashed-gateway"


@dataclass
class _Inserted:
    """What the store reads back from its INSERT … RETURNING gateway_name."""

    rowcount: int = 1

    def fetchone(self) -> tuple[str]:
        return ("",)  # the gateway the row is bound to: the seed does not look at it


@dataclass
class _CollectingDatabase:
    """Stands in for the store's database connection while seeding: it keeps the
    store's own INSERT statement and each row's parameters, so that a chunk is sent
    in one batch (`executemany`, or psycopg2's `execute_batch`) instead of one
    round trip per row. Every inserted row is checked afterwards."""

    sql: str = ""
    rows: list[Any] = field(default_factory=list)

    def execute_sql(self, sql: str, params: Any) -> _Inserted:
        if self.sql and sql != self.sql:
            raise RuntimeError("the store issued a second statement while seeding")
        self.sql = sql
        self.rows.append(params)
        return _Inserted()


def _flush(
    database: Any, collected: _CollectingDatabase, postgres: bool, gateway_name: str
) -> None:
    if not collected.rows:
        return
    cursor = database.cursor()
    if postgres:
        from psycopg2.extras import execute_values

        # One multi-row INSERT per page: the store's columns and values, with its
        # liveness guard checked once for the chunk (the instance is live until
        # it deregisters after the last chunk). The store reads gateway_name from
        # the instance in its statement; here it is the seeding instance's.
        at = COLUMNS.index("gateway_name")
        values = [row[: len(COLUMNS) - 1] for row in collected.rows]
        rows = [(*row[:at], gateway_name, *row[at:]) for row in values]
        execute_values(
            cursor,
            f"INSERT INTO ledger_obligation ({', '.join(COLUMNS)}) VALUES %s",
            rows,
            page_size=1000,
        )
    else:
        cursor.executemany(collected.sql, collected.rows)
    collected.rows.clear()


def seed_orphans(url: str, sync: SqliteSync, count: int, analyze: bool = False) -> Seeded:
    """`count` PENDING rows owned by an instance that then deregisters (see the module doc).

    `url` is the database of a running (or not yet started) DeliveryService;
    the schema is created if it is missing.
    """
    backend = open_backend(DatabaseSettings(url=url, sqlite_synchronous=sync))
    migrations.prepare(backend, DELIVERY_SCHEMA)
    store = LedgerStore(backend, LedgerLimits())
    instance_id = f"bench-crashed-{uuid.uuid4().hex[:12]}"
    database: Any = backend.database  # peewee is untyped
    started = time.perf_counter()
    try:
        with database.connection_context():
            with backend.write_transaction():
                store.register_instance(
                    backend.now(),
                    instance_id,
                    CRASHED_GATEWAY,
                    "bench",
                    os.getpid(),
                    ["slack"],
                    LEASE_TTL_S,
                )
            postgres = backend.name == "postgres"
            collected = _CollectingDatabase()
            real, store._database = store._database, collected
            try:
                for first in range(0, count, CHUNK):
                    with backend.write_transaction():
                        now = backend.now()
                        for i in range(first, min(first + CHUNK, count)):
                            store.insert_if_live(now, orphan(i), instance_id)
                        _flush(real, collected, postgres, CRASHED_GATEWAY)
            finally:
                store._database = real
            owned = store.Obligation.select().where(
                store.Obligation.owner_instance_id == instance_id
            )
            if owned.count() != count:
                raise RuntimeError(f"{owned.count():,} orphans seeded, {count:,} expected")
            with backend.write_transaction():
                if store.deregister(backend.now(), instance_id) != 1:
                    raise RuntimeError(f"instance {instance_id} did not deregister")
            if analyze:
                # What autovacuum does soon after a bulk load; without it the planner
                # has no statistics for the new rows.
                database.execute_sql("ANALYZE")
    finally:
        close_all = getattr(database, "close_all", None)
        if close_all is not None:  # a pool: close its idle connections
            close_all()
    return Seeded(instance_id, count, time.perf_counter() - started)


# -- measurement ------------------------------------------------------------------------------

LOADGEN = "bench.claim_load"
#: Rows per ClaimRecoverable call (the server's maximum) and per floor transaction.
BATCH = 1000


def orphan_count(quick: bool) -> int:
    return 10_000 if quick else 100_000


def measure_config(
    key: str,
    label: str,
    sync: SqliteSync,
    server: Callable[[Path], AbstractContextManager[servers.ServerProcess]],
    count: int,
) -> Measurement:
    """A fresh server (`server(data_dir)`), `count` orphans seeded into its database,
    then all of them claimed over gRPC by `bench.claim_load`."""
    with servers.temp_dir(f"bench-{key}-orphans-") as data_dir, server(data_dir) as srv:
        postgres = srv.url.startswith("postgres")
        seeded = seed_orphans(srv.url, sync, count, analyze=postgres)
        log(f"[{key}] seeded {count:,} orphans in {seeded.seconds:.2f} s")
        measurement = harness.run_loadgen(
            srv,
            LOADGEN,
            ["--expect", str(count), "--limit", str(BATCH)],
            timeout_s=600,
        )
    measurement.name = label
    measurement.extra["seed_s"] = round(seeded.seconds, 3)
    measurement.extra["analyzed"] = postgres
    log(f"[{key}] claim of orphans: {_text(measurement)}")
    return measurement


def measure_floors(syncs: list[SqliteSync], postgres: bool, count: int) -> dict[str, Measurement]:
    """The raw claim floors: by synchronous setting ("FULL", "NORMAL") and "postgres"."""
    floors: dict[str, Measurement] = {}
    for sync in syncs:
        floors[sync] = baseline.sqlite_claim_floor(sync, count, BATCH)
        log(f"[floor] claim {_text(floors[sync])}")
    if postgres:
        with servers.postgres_schema() as url:
            floors["postgres"] = baseline.postgres_claim_floor(url, count, BATCH)
        log(f"[floor] claim {_text(floors['postgres'])}")
    return floors


def _text(m: Measurement) -> str:
    x = m.extra
    calls = x.get("calls", x.get("batches", 0))
    return (
        f"{m.name}: {m.cycles:,} rows in {m.window_s:.2f} s = {m.cycles_per_s:,.0f} rows/s "
        f"({calls} calls, p50 {m.p50_ms:.1f} ms, p99 {m.p99_ms:.1f} ms per call), errors "
        f"{m.errors}" + (f": {x['first_error']}" if x.get("first_error") else "")
    )


# -- report -----------------------------------------------------------------------------------

_HEADER = (
    f"{'configuration':<30}{'rows':>9}{'calls':>7}{'seconds':>9}{'rows/s':>10}"
    f"{'p50 ms':>9}{'p99 ms':>9}{'seed s':>8}{'srv CPU':>9}  ratio vs floor"
)


def floor_key(label: str, sync: str) -> str:
    return "postgres" if label == "postgres" else sync


def table_rows(
    results: list[tuple[str, str, Measurement]], floors: dict[str, Measurement]
) -> list[tuple[Measurement, str, str]]:
    """(measurement, label, ratio) for the floors, then each configuration's claim over gRPC.

    `results`: (configuration label, the synchronous setting of its floor, measurement).
    """
    rows: list[tuple[Measurement, str, str]] = [
        (floor, f"{floor.name} floor", "1 UPDATE ... RETURNING per 1,000 rows")
        for floor in floors.values()
    ]
    for label, sync, m in results:
        floor = floors.get(floor_key(label, sync))
        ratio = (
            f"{m.cycles_per_s / floor.cycles_per_s:.3f} x {floor.name} floor"
            if floor is not None and floor.cycles_per_s > 0
            else "n/a"
        )
        rows.append((m, f"{label} (gRPC)", ratio))
    return rows


def render_table(rows: list[tuple[Measurement, str, str]]) -> str:
    lines = [_HEADER, "-" * len(_HEADER)]
    for m, label, ratio in rows:
        x = m.extra
        calls = x.get("calls", x.get("batches", 0))
        seed = f"{x['seed_s']:.2f}" if "seed_s" in x else "-"
        lines.append(
            f"{label:<30}{m.cycles:>9,}{calls:>7}{m.window_s:>9.2f}{m.cycles_per_s:>10,.0f}"
            f"{m.p50_ms:>9.1f}{m.p99_ms:>9.1f}{seed:>8}"
            f"{harness.percent(x.get('server_cpu_util')):>9}  {ratio}"
            + (f"; ERRORS: {x.get('first_error') or m.errors}" if m.errors else "")
        )
    lines.append(
        "(one rescuer claims a dead instance's whole backlog: ClaimRecoverable(limit=1000) back "
        "to back until it claims nothing; p50/p99: per call (floors: per transaction); seed s: "
        "seeding through the ledger store, untimed (Postgres: then ANALYZE); floors: the "
        "dead owner's rows in delivery order, one UPDATE ... RETURNING per 1,000 rows, "
        "in-process)"
    )
    return "\n".join(lines)


def report(
    count: int,
    results: list[tuple[str, str, Measurement]],
    floors: dict[str, Measurement],
    rows: list[tuple[Measurement, str, str]],
) -> dict[str, Any]:
    """The orphan-claim section of bench/results/latest.json."""
    return {
        "orphans": count,
        "batch": BATCH,
        "floors": {key: m.to_json() for key, m in floors.items()},
        "configurations": [
            {"label": label, "floor": floor_key(label, sync), **m.to_json()}
            for label, sync, m in results
        ],
        "table": [
            {"configuration": label, "ratio": ratio, **m.to_json()} for m, label, ratio in rows
        ],
    }
