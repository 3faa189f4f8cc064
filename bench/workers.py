"""The section `workers`: `serve --workers 1` against `--workers 2` on Postgres.

Appends (SessionService) and the 3-RPC delivery cycle, 8 clients over 8 channels (each
channel is one connection, and SO_REUSEPORT spreads connections, not calls, over the
workers). The two counts alternate in rounds, each on a fresh server and schema, and the
better of each is kept. Every row carries the load average at its end and the CPU the
workers spent (the parent of `--workers 2` only watches; its children serve), so the
figures can be read against how busy the machine was: on 2 cores the load generator and
Postgres share the cores with the workers.
"""

from __future__ import annotations

import os
import re
from typing import Any

from bench import loadgen, servers
from bench.plan import Context, Section, error_notes
from bench.report import describe, ms, rate, table
from bench.stats import Measurement, thread_cpu

CLIENTS = 8
ROUNDS = 2
COUNTS = (1, 2)
#: service -> the workload measured on it.
WORKLOADS = {"session": "append", "delivery": "cycle"}

_PIDS = re.compile(r"workers share the ports \(pids ([\d, ]+)\)")


def _serving_pids(server: servers.ServerProcess) -> list[int]:
    """The processes that serve: the workers, or the one server."""
    for line in server.output:
        if found := _PIDS.search(line):
            return [int(pid) for pid in found.group(1).split(", ")]
    return [server.pid]


def _cpu_s(pids: list[int]) -> float:
    return sum(t.cpu_s for pid in pids for t in thread_cpu(pid).values())


def _measure(service: str, workers: int, ctx: Context, backend: servers.Backend) -> Measurement:
    load = loadgen.Load(
        WORKLOADS[service],
        clients=CLIENTS,
        channels=CLIENTS,
        seconds=ctx.scale.seconds,
        warmup_s=ctx.scale.warmup_s,
    )
    with servers.serving(service, backend, "--workers", str(workers)) as server:
        if workers > 1:
            server.wait_for_line("ready;")  # the pids are printed before it
        pids = _serving_pids(server)
        before = _cpu_s(pids)
        measured = loadgen.run(server, load)
        spent = _cpu_s(pids) - before
    busy_s = float(measured.extra.get("loadgen_wall_s", 0.0)) or measured.window_s
    measured.extra["workers_cpu_util"] = round(spent / busy_s, 3)
    measured.extra["loadavg_1m"] = round(os.getloadavg()[0], 2)
    measured.name = f"{service} --workers {workers}"
    ctx.say(f"[workers] {measured.name}: {describe(measured)}")
    return measured


def run(ctx: Context) -> Section:
    title = "serve --workers 1 against --workers 2 (Postgres)"
    backend = ctx.backend("postgres")
    if backend is None:
        note = f"workers: {ctx.missing('postgres')}"
        return Section("workers", title, note, {"results": []}, notes=[note])
    found: list[dict[str, Any]] = []
    measured: list[Measurement] = []
    for service in WORKLOADS:
        runs: dict[int, list[Measurement]] = {count: [] for count in COUNTS}
        for _ in range(ctx.scale.pick(ROUNDS, ROUNDS, 1)):
            for count in COUNTS:
                runs[count].append(_measure(service, count, ctx, backend))
        best = {count: max(each, key=lambda m: m.cycles_per_s) for count, each in runs.items()}
        one = best[1].cycles_per_s
        found += [
            {
                "service": service,
                "workers": count,
                "ratio_to_one": round(m.cycles_per_s / max(one, 1e-9), 3),
                "measurement": m.to_json(),
            }
            for count, m in best.items()
        ]
        measured += [m for each in runs.values() for m in each]
    notes = error_notes("workers", measured)
    return Section("workers", title, render(found), {"results": found}, notes=notes)


def render(found: list[dict[str, Any]]) -> str:
    rows = []
    for row in found:
        m = Measurement.from_json(row["measurement"])
        rows.append(
            (
                row["service"],
                str(row["workers"]),
                rate(m.cycles_per_s),
                ms(m.p50_ms),
                ms(m.p99_ms),
                str(m.errors),
                f"{m.extra.get('workers_cpu_util', 0.0):.2f}",
                f"{m.extra.get('loadavg_1m', 0.0):.2f}",
                f"{row['ratio_to_one']:.3f} x",
            )
        )
    header = (
        "service",
        "workers",
        "rate /s",
        "p50 ms",
        "p99 ms",
        "errors",
        "srv cores",
        "load 1m",
        "vs 1",
    )
    note = (
        f"Postgres, {CLIENTS} clients over {CLIENTS} channels, best of {ROUNDS} rounds "
        "(smoke: 1); session: AppendEvents of one 100-byte message; delivery: the 3-RPC "
        "send cycle; srv cores: CPU seconds of the serving processes per second"
    )
    return table(header, rows, note)
