"""The section `open-loop`: latency under a fixed load, against no-op calls at the same rate.

Closed-loop clients send again only once answered, so a slow server slows the load
and hides its queue. Here `bench.loadgen` starts operation k at t0 + k / rate whatever
is still in flight (over `LANES` sessions, or session keys, round robin) and times it
from that scheduled start. On a fresh server of each service (the first selected
backend, normally SQLite FULL), each rate is offered twice: first as no-ops (as many
Health/Check calls per operation as the real one makes RPCs), then for real: one
delivery cycle (3 RPCs) or one AppendEvents (1 RPC). Each real run is reported beside
the no-op at the same rate, as ratios of p50 and p99.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import loadgen, servers
from bench.plan import Context, Section, error_notes
from bench.report import ms, percent, table
from bench.stats import Measurement

#: Sessions (delivery: session keys) the operations are spread over.
LANES = 32
#: service -> (workload, RPCs per operation, what an operation is).
SERVICES = {
    "delivery": ("cycle", 3, "delivery cycle (3 RPCs)"),
    "session": ("append", 1, "AppendEvents (1 RPC)"),
}


@dataclass(frozen=True)
class Plan:
    rates: tuple[float, ...]
    seconds: float
    warmup_s: float


def plan(ctx: Context) -> Plan:
    return ctx.scale.pick(
        Plan((200.0, 500.0, 1000.0), 6.0, 1.0),
        Plan((200.0, 500.0), 2.0, 0.5),
        Plan((100.0,), 0.5, 0.2),
    )


def open_load(workload: str, rpcs: int, rate: float, chosen: Plan) -> loadgen.Load:
    return loadgen.Load(
        workload,
        clients=LANES,
        rate=rate,
        rpcs=rpcs,
        seconds=chosen.seconds,
        warmup_s=chosen.warmup_s,
    )


def run(ctx: Context) -> Section:
    chosen, backend = plan(ctx), ctx.backends[0]
    runs: list[tuple[str, str, Measurement]] = []
    for service, (workload, rpcs, what) in SERVICES.items():
        with servers.serving(service, backend) as server:
            for offered in chosen.rates:
                for op in ("noop", "work"):
                    load = open_load("noop" if op == "noop" else workload, rpcs, offered, chosen)
                    found = loadgen.run(server, load)
                    found.name = what if op == "work" else f"no-op ({rpcs}x Health/Check)"
                    ctx.say(f"[open-loop] {service} {describe_open(found)}")
                    runs.append((service, op, found))
    rows = []
    for service, op, m in runs:
        noop = next(n for s, o, n in runs if (s, o) == (service, "noop") and _rate(n) == _rate(m))
        rows.append(open_row(backend.label, m, versus(m, None if op == "noop" else noop)))
    data = {
        "backend": backend.key,
        "plan": {
            "rates": list(chosen.rates),
            "seconds": chosen.seconds,
            "warmup_s": chosen.warmup_s,
        },
        "runs": [{"service": s, "op": op, "measurement": m.to_json()} for s, op, m in runs],
    }
    title = f"Latency under a fixed open-loop load ({backend.label})"
    note = (
        f"operation k starts at t0 + k/rate whatever is still running, {chosen.seconds:g} s "
        f"after {chosen.warmup_s:g} s of warm-up; latency from the scheduled start, so queueing "
        "counts; achieved: operations finished in the window per second; lag p99: how late "
        "the load generator started them; in flt: most operations in flight"
    )
    measured = [m for _, _, m in runs]
    return Section(
        "open-loop",
        title,
        table(OPEN_HEADER, rows, note),
        data,
        notes=error_notes("open loop", measured),
    )


OPEN_HEADER = (
    "configuration",
    "operation",
    "offered/s",
    "achieved/s",
    "p50 ms",
    "p99 ms",
    "lag p99",
    "in flt",
    "errors",
    "srv CPU",
    "lg CPU",
    "vs no-op",
)


def open_row(configuration: str, m: Measurement, remark: str) -> tuple[str, ...]:
    x = m.extra
    return (
        configuration,
        m.name,
        f"{_rate(m):,.0f}",
        f"{x['achieved_rate']:,.1f}",
        ms(m.p50_ms),
        ms(m.p99_ms),
        f"{x['start_lag_p99_ms']:.2f}",
        str(x["max_in_flight"]),
        str(m.errors),
        percent(x.get("server_cpu_util")),
        percent(x.get("loadgen_cpu_util")),
        remark,
    )


def _rate(m: Measurement) -> float:
    return float(m.extra["offered_rate"])


def versus(m: Measurement, base: Measurement | None) -> str:
    """`m`'s latencies against `base`'s (None: `m` is the baseline), and its achieved rate."""
    lead = "baseline" if base is None else latency_ratio(m, base)
    return f"{lead}; achieved {achieved_share(m):.2f} x offered"


def latency_ratio(run: Measurement, base: Measurement | None) -> str:
    """p50 and p99 of `run` as ratios to those of `base` (a no-op, or another point)."""
    if base is None or not base.p50_ms > 0 or not base.p99_ms > 0:
        return "n/a"
    return f"p50 {run.p50_ms / base.p50_ms:.2f} x, p99 {run.p99_ms / base.p99_ms:.2f} x"


def achieved_share(m: Measurement) -> float:
    """Operations finished per second over those offered: below 1, the server fell behind."""
    return float(m.extra["achieved_rate"]) / _rate(m)


def describe_open(m: Measurement) -> str:
    x: dict[str, Any] = m.extra
    return (
        f"{m.name} at {_rate(m):g}/s: achieved {x['achieved_rate']:,.1f}/s, p50 {m.p50_ms:.2f} ms, "
        f"p99 {m.p99_ms:.2f} ms, errors {m.errors}, start lag p99 {x['start_lag_p99_ms']:.2f} ms"
        + (f"; first error: {x['first_error']}" if x.get("first_error") else "")
    )
