"""The section `feature-costs`: what the access log and request ids cost, each as its own
ratio to a server with neither.

Both are on in a deployment (the access log by default, request ids whenever a client
retries safely) and both are inside every other figure. Here they are taken out and
put back one at a time, on SQLite FULL with 8 clients over 1 channel:
`bare` (`--access-log off`, writes without request ids), `+ access log` (the default:
a JSON line per call, read from the server's pipe as a log collector would), `+ request
ids` (every write carries a fresh id, so the server also records the request and its
answer in the write's transaction) and `as deployed` (both). Variants alternate in
rounds, each on a fresh server, and the better of each is kept, so a drift of the
machine's speed hits all alike. The log lock, fences and round trips have no switch:
they are what makes replicas safe (their cost on Postgres is the db-latency section).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import loadgen, servers
from bench.plan import Context, Section, error_notes
from bench.report import describe, ms, percent, rate, table
from bench.stats import Measurement

CLIENTS = 8
ROUNDS = 2
#: service -> the workload measured on it.
WORKLOADS = {"session": "append", "delivery": "cycle"}


@dataclass(frozen=True)
class Variant:
    name: str
    access_log: bool
    request_ids: bool

    def server_args(self) -> list[str]:
        return [] if self.access_log else ["--access-log", "off"]


VARIANTS = (
    Variant("bare", access_log=False, request_ids=False),
    Variant("+ access log", access_log=True, request_ids=False),
    Variant("+ request ids", access_log=False, request_ids=True),
    Variant("as deployed", access_log=True, request_ids=True),
)


def _measure(service: str, variant: Variant, ctx: Context) -> Measurement:
    load = loadgen.Load(
        WORKLOADS[service],
        clients=CLIENTS,
        seconds=ctx.scale.seconds,
        warmup_s=ctx.scale.warmup_s,
        request_ids=variant.request_ids,
    )
    sqlite_full = servers.BACKENDS[0]
    with servers.serving(service, sqlite_full, *variant.server_args()) as server:
        measured = loadgen.run(server, load)
    measured.name = f"{service} {variant.name}"
    ctx.say(f"[feature-costs] {measured.name}: {describe(measured)}")
    return measured


def costs(service: str, best: dict[Variant, Measurement]) -> list[dict[str, Any]]:
    """Each variant's best run of `service` and its rate over `bare`'s."""
    bare = best[VARIANTS[0]].cycles_per_s
    return [
        {
            "service": service,
            "variant": variant.name,
            "access_log": variant.access_log,
            "request_ids": variant.request_ids,
            "ratio_to_bare": round(m.cycles_per_s / max(bare, 1e-9), 3),
            "measurement": m.to_json(),
        }
        for variant, m in best.items()
    ]


def run(ctx: Context) -> Section:
    found: list[dict[str, Any]] = []
    measured: list[Measurement] = []
    for service in WORKLOADS:
        runs: dict[Variant, list[Measurement]] = {variant: [] for variant in VARIANTS}
        for _ in range(ctx.scale.pick(ROUNDS, ROUNDS, 1)):
            for variant in VARIANTS:
                runs[variant].append(_measure(service, variant, ctx))
        found += costs(
            service, {v: max(each, key=lambda m: m.cycles_per_s) for v, each in runs.items()}
        )
        measured += [m for each in runs.values() for m in each]
    title = "What the access log and request ids cost (each against neither)"
    notes = error_notes("feature-costs", measured)
    return Section("feature-costs", title, render(found), {"costs": found}, notes=notes)


def render(found: list[dict[str, Any]]) -> str:
    rows = []
    for cost in found:
        m = Measurement.from_json(cost["measurement"])
        rows.append(
            (
                cost["service"],
                cost["variant"],
                rate(m.cycles_per_s),
                ms(m.p50_ms),
                ms(m.p99_ms),
                str(m.errors),
                percent(m.extra.get("server_cpu_util")),
                f"{cost['ratio_to_bare']:.3f} x",
            )
        )
    header = ("service", "variant", "rate /s", "p50 ms", "p99 ms", "errors", "srv CPU", "vs bare")
    note = (
        f"SQLite FULL, {CLIENTS} clients over 1 channel, best of {ROUNDS} rounds (smoke: 1); "
        "session: AppendEvents of one 100-byte message; delivery: the 3-RPC send cycle"
    )
    return table(header, rows, note)
