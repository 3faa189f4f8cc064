"""Latency under a fixed open-loop load: orchestration, table and JSON.

On one server of each service (the first configuration run, normally SQLite
FULL), `bench.open_loop` offers each rate of the plan twice, in separate
processes: first the no-op (as many Health/Check calls per operation as the
real one makes RPCs), then the real operation (a delivery cycle, or one
AppendEvents). Latency counts from each operation's scheduled start. Each
real run is reported next to the no-op run at the same rate, as ratios of
p50 and p99.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import harness, servers
from bench.harness import log
from bench.stats import Measurement

LOADGEN = "bench.open_loop"
#: What one operation is, by service, for labels.
OPERATIONS = {"delivery": "delivery cycle (3 RPCs)", "session": "AppendEvents (1 RPC)"}
NOOPS = {"delivery": "no-op (3x Health/Check)", "session": "no-op (1x Health/Check)"}


@dataclass(frozen=True)
class OpenLoopPlan:
    rates: tuple[float, ...]
    seconds: float
    warmup_s: float


def open_loop_plan(quick: bool) -> OpenLoopPlan:
    if quick:
        return OpenLoopPlan(rates=(200.0, 500.0), seconds=2.0, warmup_s=0.5)
    return OpenLoopPlan(rates=(200.0, 500.0, 1000.0), seconds=6.0, warmup_s=1.0)


def run_open_loop(
    srv: servers.ServerProcess,
    service: str,
    op: str,
    rate: float,
    plan: OpenLoopPlan,
    channels: int,
) -> Measurement:
    arguments = [
        "--service",
        service,
        "--op",
        op,
        "--rate",
        f"{rate:g}",
        "--seconds",
        str(plan.seconds),
        "--warmup",
        str(plan.warmup_s),
        "--channels",
        str(channels),
    ]
    return harness.run_loadgen(srv, LOADGEN, arguments, plan.warmup_s + plan.seconds + 120)


def measure(
    srv: servers.ServerProcess,
    service: str,
    key: str,
    label: str,
    plan: OpenLoopPlan,
    channels: int,
) -> list[Measurement]:
    """No-op, then the real operation, at each rate of `plan`, lowest first."""
    runs: list[Measurement] = []
    for rate in plan.rates:
        for op in ("noop", "work"):
            measurement = run_open_loop(srv, service, op, rate, plan, channels)
            measurement.name = f"{label} {service}" if op == "work" else "gRPC no-op"
            measurement.extra["config"] = key
            measurement.extra["config_label"] = label
            runs.append(measurement)
            log(f"[{key}] open loop {describe_run(measurement)}")
    return runs


def describe_run(m: Measurement) -> str:
    """One open-loop run as a progress line."""
    x = m.extra
    what = OPERATIONS[x["service"]] if x["op"] == "work" else NOOPS[x["service"]]
    return (
        f"{what} at {x['offered_rate']:g}/s: achieved {x['achieved_rate']:,.1f}/s, "
        f"p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, errors {m.errors}, start lag p99 "
        f"{x['start_lag_p99_ms']:.2f} ms, max in flight {x['max_in_flight']}; loadgen CPU "
        f"{100 * x.get('loadgen_cpu_util', 0):.0f}%, server CPU "
        f"{100 * x.get('server_cpu_util', 0):.0f}%"
        + (f"; first error: {x['first_error']}" if x.get("first_error") else "")
    )


# -- report -----------------------------------------------------------------------------------

_HEADER = (
    f"{'configuration':<20}{'operation':<26}{'offered/s':>10}{'achieved/s':>11}"
    f"{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'lag p99':>9}{'in flt':>7}{'errors':>7}"
    f"{'srv CPU':>8}{'lg CPU':>7}  ratio vs no-op at the same rate"
)


def latency_ratio(run: Measurement, base: Measurement | None) -> str:
    """p50 and p99 of `run` as ratios to those of `base` (a no-op, or another point)."""
    if base is None or not base.p50_ms > 0 or not base.p99_ms > 0:
        return "n/a"
    return f"p50 {run.p50_ms / base.p50_ms:.2f} x, p99 {run.p99_ms / base.p99_ms:.2f} x"


def achieved_share(m: Measurement) -> float:
    """Operations finished per second over those offered: below 1, the server fell behind."""
    offered = m.extra["offered_rate"]
    return m.extra["achieved_rate"] / offered if offered else 0.0


def table_rows(runs: list[Measurement]) -> list[tuple[Measurement, str, str]]:
    """(measurement, operation label, ratio text): each no-op next to the run it baselines."""
    rows: list[tuple[Measurement, str, str]] = []
    for m in runs:
        x = m.extra
        achieved = achieved_share(m)
        if x["op"] == "noop":
            rows.append((m, NOOPS[x["service"]], f"baseline; achieved {achieved:.2f} x offered"))
            continue
        noop = next(
            (
                n
                for n in runs
                if n.extra["op"] == "noop"
                and n.extra["service"] == x["service"]
                and n.extra["offered_rate"] == x["offered_rate"]
            ),
            None,
        )
        rows.append(
            (
                m,
                OPERATIONS[x["service"]],
                f"{latency_ratio(m, noop)}; achieved {achieved:.2f} x offered",
            )
        )
    return rows


def render_table(rows: list[tuple[Measurement, str, str]], plan: OpenLoopPlan) -> str:
    lines = [_HEADER, "-" * len(_HEADER)]
    for m, operation, ratio in rows:
        x = m.extra
        lines.append(
            f"{x.get('config_label', ''):<20}{operation:<26}"
            f"{x['offered_rate']:>10,.0f}{x['achieved_rate']:>11,.1f}"
            f"{m.p50_ms:>9.2f}{m.p99_ms:>9.2f}{m.mean_ms:>9.2f}{x['start_lag_p99_ms']:>9.2f}"
            f"{x['max_in_flight']:>7}{m.errors:>7}"
            f"{harness.percent(x.get('server_cpu_util')):>8}"
            f"{harness.percent(x.get('loadgen_cpu_util')):>7}  {ratio}"
        )
    lines.append(
        f"(open loop: operation k starts at t0 + k/rate whatever is still running, over "
        f"{plan.seconds:g} s after {plan.warmup_s:g} s of warm-up; latency from the scheduled "
        "start, so queueing counts; achieved: operations finished in the window per second; "
        "lag p99: how late this process started them, ms; in flt: most operations in flight; "
        "no-op rows: the same number of Health/Check calls per operation at the same rate, "
        "on the same server; CPU: % of one core)"
    )
    return "\n".join(lines)


def report(
    runs: list[Measurement], rows: list[tuple[Measurement, str, str]], plan: OpenLoopPlan
) -> dict[str, Any]:
    """The open-loop section of bench/results/latest.json."""
    return {
        "plan": {"rates": list(plan.rates), "seconds": plan.seconds, "warmup_s": plan.warmup_s},
        "runs": [m.to_json() for m in runs],
        "table": [
            {"operation": operation, "ratio": ratio, **m.to_json()} for m, operation, ratio in rows
        ],
    }
