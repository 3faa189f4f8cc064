"""The section `db-latency`: throughput and latency against the database's round trip, on
Postgres with 0, 1, 5 and 20 ms added between the server and the database.

The delay comes from `tests.tcp_proxy.TcpProxy` on 127.0.0.1 in front of Postgres, half
of it each way. Each point gets a fresh schema and a fresh server process (appends on
a session server, delivery cycles on a delivery server) whose database URL points at
the proxy: first 8 closed-loop clients over 1 channel, then, on the same server, an
open loop of `OPEN_LOOP_RATE` operations/s (`bench.open_loop`'s windows), latency from
the scheduled start. The open-loop rate is under a quarter of what 8 clients reach at
+0 ms, so the +0 ms point has no queue of its own: it is the baseline of the others.
"""

from __future__ import annotations

from typing import Any

from bench import loadgen, open_loop, servers
from bench.plan import Context, Section, error_notes
from bench.report import describe, ms, rate, table
from bench.stats import Measurement
from tests.tcp_proxy import TcpProxy

CLIENTS = 8
OPEN_LOOP_RATE = 100.0
#: service -> its workload and RPCs per operation, as in `bench.open_loop`.
SERVICES = {service: spec[:2] for service, spec in open_loop.SERVICES.items()}


def added_round_trips(ctx: Context) -> tuple[float, ...]:
    return ctx.scale.pick((0.0, 1.0, 5.0, 20.0), (0.0, 1.0, 5.0, 20.0), (0.0, 5.0))


def _point(service: str, added_ms: float, ctx: Context) -> tuple[Measurement, Measurement]:
    """The closed-loop run, then the open-loop run, on one server behind the proxy."""
    workload, rpcs = SERVICES[service]
    postgres = next(b for b in servers.BACKENDS if b.postgres)
    with (
        servers.temp_dir(f"bench-dblat-{service}-") as directory,
        servers.database(postgres, directory) as url,
        TcpProxy(("127.0.0.1", 5432), delay_s=added_ms / 2000) as proxy,
        servers.started(
            service, url.replace("127.0.0.1:5432", proxy.address, 1), directory
        ) as server,
    ):
        closed = loadgen.Load(
            workload, clients=CLIENTS, seconds=ctx.scale.seconds, warmup_s=ctx.scale.warmup_s
        )
        measured = loadgen.run(server, closed)
        measured.name = f"+{added_ms:g} ms"
        ctx.say(f"[db-latency] {service} +{added_ms:g} ms: {describe(measured)}")
        chosen = open_loop.plan(ctx)
        opened = loadgen.run(server, open_loop.open_load(workload, rpcs, OPEN_LOOP_RATE, chosen))
        opened.name = open_loop.SERVICES[service][2]
        ctx.say(f"[db-latency] {service} +{added_ms:g} ms: {open_loop.describe_open(opened)}")
    return measured, opened


def run(ctx: Context) -> Section:
    if ctx.backend("postgres") is None:
        note = f"db-latency: {ctx.missing('postgres')}"
        return Section(
            "db-latency",
            "Postgres: throughput against database round trip",
            note,
            {"points": []},
            notes=[note],
        )
    points: list[dict[str, Any]] = []
    for added in added_round_trips(ctx):
        point: dict[str, Any] = {"added_rtt_ms": added, "open_loop": {}}
        for service in SERVICES:
            closed, opened = _point(service, added, ctx)
            point[service], point["open_loop"][service] = closed, opened
        points.append(point)
    text = "\n\n".join((_closed_table(points), _open_table(points)))
    data = {
        "open_loop_rate": OPEN_LOOP_RATE,
        "points": [
            {
                "added_rtt_ms": p["added_rtt_ms"],
                **{s: p[s].to_json() for s in SERVICES},
                "open_loop": {s: m.to_json() for s, m in p["open_loop"].items()},
            }
            for p in points
        ],
    }
    measured = [m for p in points for m in (*(p[s] for s in SERVICES), *p["open_loop"].values())]
    title = "Postgres: appends and delivery cycles against added database round trip"
    return Section("db-latency", title, text, data, notes=error_notes("db-latency", measured))


def _closed_table(points: list[dict[str, Any]]) -> str:
    base = points[0]
    rows = [
        (
            f"+{p['added_rtt_ms']:g} ms",
            *(
                cell
                for s in SERVICES
                for cell in (
                    rate(p[s].cycles_per_s),
                    ms(p[s].p50_ms),
                    ms(p[s].p99_ms),
                    str(p[s].errors),
                )
            ),
            ", ".join(
                f"{p[s].cycles_per_s / max(base[s].cycles_per_s, 1e-9):.3f}" for s in SERVICES
            ),
        )
        for p in points
    ]
    header = (
        "added RTT",
        "cycles/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "appends/s",
        "p50 ms",
        "p99 ms",
        "errors",
        f"vs +{base['added_rtt_ms']:g} ms (cycles, appends)",
    )
    note = f"{CLIENTS} closed-loop clients over 1 channel; the round trip is added by a TCP proxy"
    return table(header, rows, note)


def _open_table(points: list[dict[str, Any]]) -> str:
    rows = []
    for service in SERVICES:
        base = points[0]["open_loop"][service]
        for p in points:
            m = p["open_loop"][service]
            remark = open_loop.versus(m, None if m is base else base)
            rows.append(open_loop.open_row(f"+{p['added_rtt_ms']:g} ms", m, remark))
    header = ("added RTT", *open_loop.OPEN_HEADER[1:-1], "vs the first row")
    note = (
        f"open loop at {OPEN_LOOP_RATE:g} operations/s on the server of the closed-loop row; "
        "achieved below offered: the server fell behind, and its latency grows with the run"
    )
    return table(header, rows, note)
