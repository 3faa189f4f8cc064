"""Throughput against database latency: appends/s and delivery cycles/s at 8 clients on
Postgres with 0, 1, 5 and 20 ms of round trip added between the services and the database.

The latency comes from `tests.tcp_proxy.TcpProxy` on 127.0.0.1, in front of
postgresql://127.0.0.1:5432: its delay is per direction, so half the added round
trip each way. Each point gets a fresh schema and a fresh server process (`python -m
switchboard serve session|delivery`) whose database URL points at the proxy; the load
generators are the ones of the other sections (`bench.session_load --mode append`,
`bench.delivery_cycle`). Run alone with `python -m bench --only db-latency`.

Closed-loop clients slow down with the server, so their p50/p99 hide the queue. After
each closed-loop run, the same server (behind the same proxy) is also loaded open loop
by `bench.open_loop` (through `bench.latency.run_open_loop`): one AppendEvents, or one
delivery cycle, started every 1 / `OPEN_LOOP_RATE` s whatever is in flight, timed from
its scheduled start, in the windows of the open-loop section (`bench.latency`). Those
points are reported as p50/p99 ratios to the +0 ms point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import harness, latency, servers
from bench.harness import log
from bench.open_loop import OP_TIMEOUT_S
from bench.stats import Measurement
from tests.tcp_proxy import TcpProxy

ADDED_ROUND_TRIPS_MS = (0.0, 1.0, 5.0, 20.0)
CLIENTS = 8
#: Operations started per second by the open-loop runs, for both services: under a
#: quarter of what 8 closed-loop clients reach at +0 ms (~570 appends/s, ~380 cycles/s
#: here), so the +0 ms point has no queue of its own and the curve shows what the added
#: round trips cost; where a point cannot keep up, its achieved rate says so.
OPEN_LOOP_RATE = 100.0
#: The services of a point, in table order: appends (session), then delivery cycles.
SERVICES = ("session", "delivery")


@dataclass(frozen=True)
class Point:
    added_rtt_ms: float
    appends: Measurement
    cycles: Measurement
    #: The open-loop runs on the same servers (None when the open loop is skipped).
    open_appends: Measurement | None = None
    open_cycles: Measurement | None = None

    def open_run(self, service: str) -> Measurement | None:
        return self.open_appends if service == "session" else self.open_cycles


def _proxied(url: str, proxy: TcpProxy) -> str:
    return url.replace("127.0.0.1:5432", proxy.address, 1)


def _measure(
    service: str,
    added_rtt_ms: float,
    seconds: float,
    warmup_s: float,
    open_loop: latency.OpenLoopPlan | None,
) -> tuple[Measurement, Measurement | None]:
    """The closed-loop run, then (with `open_loop`, whose windows are used at
    OPEN_LOOP_RATE) the open-loop run on the same server."""
    with (
        servers.temp_dir(f"bench-dblat-{service}-") as data_dir,
        servers.postgres_schema() as url,
        TcpProxy(("127.0.0.1", 5432), delay_s=added_rtt_ms / 2000) as proxy,
        servers.running_server(_proxied(url, proxy), data_dir, service=service) as srv,
    ):
        if service == "session":
            module = "bench.session_load"
            arguments = ["--mode", "append"]
        else:
            module = "bench.delivery_cycle"
            arguments = ["--rpc", "cycle"]
        arguments += [
            "--clients",
            str(CLIENTS),
            "--channels",
            "1",
            "--seconds",
            str(seconds),
            "--warmup",
            str(warmup_s),
        ]
        measurement = harness.run_loadgen(srv, module, arguments, warmup_s + seconds + 180)
        measurement.name = f"postgres +{added_rtt_ms:g} ms"
        log(
            f"[db-latency] +{added_rtt_ms:g} ms {service} closed loop: "
            f"{harness.describe(measurement, 'appends' if service == 'session' else 'cycles')}"
        )
        if open_loop is None:
            return measurement, None
        opened = latency.run_open_loop(srv, service, "work", OPEN_LOOP_RATE, open_loop, 1)
        opened.name = f"postgres +{added_rtt_ms:g} ms open loop"
        opened.extra["added_rtt_ms"] = added_rtt_ms
        log(f"[db-latency] +{added_rtt_ms:g} ms open loop {latency.describe_run(opened)}")
    return measurement, opened


def measure(
    seconds: float, warmup_s: float, open_loop: latency.OpenLoopPlan | None = None
) -> list[Point]:
    points = []
    for added in ADDED_ROUND_TRIPS_MS:
        appends, open_appends = _measure("session", added, seconds, warmup_s, open_loop)
        cycles, open_cycles = _measure("delivery", added, seconds, warmup_s, open_loop)
        points.append(Point(added, appends, cycles, open_appends, open_cycles))
    return points


_HEADER = (
    f"{'added RTT':>10}{'appends/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
    f"{'cycles/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}  vs +0 ms (appends, cycles)"
)


def _share(value: float, base: float) -> str:
    return f"{value / base:.3f}" if base > 0 else "n/a"


def render(points: list[Point], open_loop: latency.OpenLoopPlan | None = None) -> str:
    """The closed-loop table, then the open-loop one when the points have open-loop runs."""
    lines = [_HEADER, "-" * len(_HEADER)]
    base = points[0] if points else None
    for p in points:
        a, c = p.appends, p.cycles
        shares = (
            f"{_share(a.cycles_per_s, base.appends.cycles_per_s)}, "
            f"{_share(c.cycles_per_s, base.cycles.cycles_per_s)}"
            if base is not None
            else ""
        )
        lines.append(
            f"{f'+{p.added_rtt_ms:g} ms':>10}{a.cycles_per_s:>11,.1f}{a.p50_ms:>9.2f}"
            f"{a.p99_ms:>9.2f}{a.errors:>8}{c.cycles_per_s:>11,.1f}{c.p50_ms:>9.2f}"
            f"{c.p99_ms:>9.2f}{c.errors:>8}  {shares}"
        )
    lines.append(
        f"({CLIENTS} clients, 1 channel; the round trip is added by a TCP proxy between the "
        "server process and Postgres; a delivery cycle is RecordObligation -> MarkAttempting "
        "-> MarkDelivered)"
    )
    rows = open_rows(points)
    if open_loop is not None and rows:
        lines += ["", render_open_loop(rows, open_loop)]
    return "\n".join(lines)


_OPEN_HEADER = (
    f"{'operation':<25}{'added RTT':>10}{'offered/s':>10}{'achieved/s':>11}{'p50 ms':>9}"
    f"{'p99 ms':>9}{'lag p99':>9}{'in flt':>7}{'errors':>7}  vs +0 ms"
)


def open_rows(points: list[Point]) -> list[tuple[Measurement, str, str]]:
    """(open-loop run, operation label, ratio text), appends first, by added round trip;
    the ratios are to the +0 ms run of the same service."""
    rows: list[tuple[Measurement, str, str]] = []
    for service in SERVICES:
        runs = [run for p in points if (run := p.open_run(service)) is not None]
        base = next((m for m in runs if m.extra["added_rtt_ms"] == 0), None)
        for m in runs:
            ratio = latency.latency_ratio(m, base)
            achieved = f"achieved {latency.achieved_share(m):.2f} x offered"
            rows.append((m, latency.OPERATIONS[service], f"{ratio}; {achieved}"))
    return rows


def render_open_loop(rows: list[tuple[Measurement, str, str]], plan: latency.OpenLoopPlan) -> str:
    lines = [_OPEN_HEADER, "-" * len(_OPEN_HEADER)]
    for m, operation, ratio in rows:
        x = m.extra
        added = f"+{x['added_rtt_ms']:g} ms"
        lines.append(
            f"{operation:<25}{added:>10}{x['offered_rate']:>10,.0f}"
            f"{x['achieved_rate']:>11,.1f}{m.p50_ms:>9.2f}{m.p99_ms:>9.2f}"
            f"{x['start_lag_p99_ms']:>9.2f}{x['max_in_flight']:>7}{m.errors:>7}  {ratio}"
        )
    lines.append(
        f"(open loop, 1 channel, on the server of the closed-loop row: operation k starts at "
        f"t0 + k/{OPEN_LOOP_RATE:g} s whatever is still running, over {plan.seconds:g} s after "
        f"{plan.warmup_s:g} s of warm-up; latency from the scheduled start, so queueing counts; "
        "achieved below offered: the server fell behind, and its latency grows with the "
        f"length of the run; an operation is cancelled after {OP_TIMEOUT_S:g} s and counted "
        "as an error; lag p99: how late the load generator started them, ms)"
    )
    return "\n".join(lines)


def report(
    points: list[Point], open_loop: latency.OpenLoopPlan | None = None
) -> list[dict[str, Any]]:
    """The `db_latency` entries of bench/results/latest.json, one per added round trip;
    `open_loop` (rate, windows, both runs and their ratio texts) is None without one."""
    ratios = {id(m): ratio for m, _operation, ratio in open_rows(points)}
    entries: list[dict[str, Any]] = []
    for p in points:
        entry: dict[str, Any] = {
            "added_rtt_ms": p.added_rtt_ms,
            "clients": CLIENTS,
            "appends": p.appends.to_json(),
            "cycles": p.cycles.to_json(),
            "open_loop": None,
        }
        if open_loop is not None and p.open_appends is not None and p.open_cycles is not None:
            entry["open_loop"] = {
                "rate": OPEN_LOOP_RATE,
                "seconds": open_loop.seconds,
                "warmup_s": open_loop.warmup_s,
                "appends": {**p.open_appends.to_json(), "ratio": ratios[id(p.open_appends)]},
                "cycles": {**p.open_cycles.to_json(), "ratio": ratios[id(p.open_cycles)]},
            }
        entries.append(entry)
    return entries
