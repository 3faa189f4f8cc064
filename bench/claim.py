"""The section `claim`: a dead gateway instance's whole backlog claimed over gRPC, against
the same rows claimed in-process on the raw driver (`bench.floors.claim_floor`).

What a fleet finds after a gateway with a deep backlog died: 100,000 PENDING obligations
(quick: 10,000) owned by an instance that deregistered, seeded through the ledger's own
write path (`bench.seeding.seed_orphans`, untimed; Postgres then ANALYZE, as autovacuum
would). Then, on a fresh server of each backend, one rescuing instance of the same
gateway calls ClaimRecoverable(limit=1000) back to back until a call claims nothing
(`bench.loadgen`, workload `claim`): every id must come back once, ATTEMPTING under it.
Rows/s run from the first call to the end of the last one that claimed rows.
"""

from __future__ import annotations

from typing import Any

from bench import floors, loadgen, seeding, servers
from bench.plan import Context, Section, error_notes
from bench.report import describe, ms, percent, rate, ratio, table
from bench.stats import Measurement

#: Rows per ClaimRecoverable call (the server's maximum) and per floor transaction.
BATCH = 1000
#: A claim's load has no fixed window: it ends when the rows do, within this bound.
LIMIT_S = 600.0


def run(ctx: Context) -> Section:
    count = ctx.scale.pick(100_000, 10_000, 300)
    rows: list[tuple[str, ...]] = []
    configurations: list[dict[str, Any]] = []
    measured: list[Measurement] = []
    for backend in ctx.backends:
        floor = floors.claim_floor(backend, count, BATCH)
        ctx.say(f"[claim] floor {floor.name}: {floor.cycles_per_s:,.0f} rows/s")
        with (
            servers.temp_dir(f"bench-claim-{backend.key}-") as directory,
            servers.database(backend, directory) as url,
        ):
            seed_s = seeding.seed_orphans(url, backend.sqlite_sync, count)
            ctx.say(f"[claim] {backend.key}: seeded {count:,} orphans in {seed_s:.1f} s")
            with servers.started("delivery", url, directory, backend.sqlite_sync) as server:
                load = loadgen.Load("claim", expect=count, limit=BATCH, warmup_s=0, seconds=LIMIT_S)
                claimed = loadgen.run(server, load, timeout_s=LIMIT_S + 300)
        claimed.name = backend.label
        claimed.extra["seed_s"] = round(seed_s, 3)
        ctx.say(f"[claim] {backend.key}: {describe(claimed, 'rows')}")
        measured.append(claimed)
        for m, remark in ((floor, "1 UPDATE ... RETURNING per 1,000 rows"), (claimed, "")):
            remark = remark or ratio(m.cycles_per_s, floor.cycles_per_s, f"{floor.name} floor")
            rows.append(_row(m, remark))
        configurations.append(
            {"backend": backend.key, "floor": floor.to_json(), "claim": claimed.to_json()}
        )
    header = (
        "configuration",
        "rows",
        "calls",
        "seconds",
        "rows/s",
        "p50 ms",
        "p99 ms",
        "seed s",
        "srv CPU",
        "vs floor",
    )
    note = (
        "p50/p99 per call (floors: per transaction); seed s: seeding through the ledger, "
        "untimed; floors: the dead owner's rows in delivery order, in-process"
    )
    title = f"DeliveryService: claim of {count:,} orphans (ClaimRecoverable, limit {BATCH:,})"
    data = {"orphans": count, "batch": BATCH, "configurations": configurations}
    return Section(
        "claim", title, table(header, rows, note), data, notes=error_notes("claim", measured)
    )


def _row(m: Measurement, remark: str) -> tuple[str, ...]:
    seed = m.extra.get("seed_s")
    return (
        m.name if "seed_s" in m.extra else f"{m.name} floor",
        f"{m.cycles:,}",
        str(m.extra.get("calls", "-")),
        f"{m.window_s:.2f}",
        rate(m.cycles_per_s),
        ms(m.p50_ms),
        ms(m.p99_ms),
        "-" if seed is None else f"{seed:.2f}",
        percent(m.extra.get("server_cpu_util")),
        remark,
    )
