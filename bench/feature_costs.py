"""What the production features cost, each as its own ratio: the access log and request ids.

Both are on in a deployment (the access log by default, request ids whenever a client
retries safely), and both are in every other figure of `python -m bench`. Here they
are taken out and put back one at a time, on the same server configuration (SQLite
synchronous=FULL, 8 clients over 1 channel), so that each one's share is visible and
is not paid for twice unnoticed:

- `bare`: `--access-log off`, writes without request ids;
- `+ access log`: the default `--access-log all` (one JSON line per call, read from
  the server's pipe by this process, as a log collector would);
- `+ request ids`: every write carries a fresh id (`SWITCHBOARD_BENCH_REQUEST_IDS=1`
  for the load generator), so the server also records the request and its answer in
  the write's transaction;
- `as deployed`: both.

Variants run in rounds (bare, + access log, + request ids, as deployed, then again),
each on a fresh server and database, and the better run of each is kept, so a drift of
the machine's speed hits all alike. The ratio is each variant's rate over `bare`'s.

The locking of the production-path work (the log lock, fences, per-call round trips)
is not optional, so it has no switch here: its cost on Postgres is the round-trip
curve of `bench.db_latency` and the counts of `tests/test_database_faults.py`.

    python -m bench.feature_costs [--quick]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench import harness, servers
from bench.harness import log
from bench.stats import Measurement

CLIENTS = 8
ROUNDS = 2


@dataclass(frozen=True)
class Variant:
    name: str
    access_log: bool
    request_ids: bool

    def server_args(self) -> list[str]:
        return [] if self.access_log else ["--access-log", "off"]

    def loadgen_env(self) -> Mapping[str, str]:
        return {"SWITCHBOARD_BENCH_REQUEST_IDS": "1" if self.request_ids else "0"}


VARIANTS = (
    Variant("bare", access_log=False, request_ids=False),
    Variant("+ access log", access_log=True, request_ids=False),
    Variant("+ request ids", access_log=False, request_ids=True),
    Variant("as deployed", access_log=True, request_ids=True),
)

#: service → (load generator module, its workload arguments, the unit of its rate).
WORKLOADS: dict[str, tuple[str, list[str], str]] = {
    "session": ("bench.session_load", ["--mode", "append"], "appends"),
    "delivery": ("bench.delivery_cycle", ["--rpc", "cycle"], "cycles"),
}


@dataclass(frozen=True)
class Cost:
    service: str
    variant: Variant
    measurement: Measurement
    bare: Measurement

    @property
    def ratio(self) -> float:
        return self.measurement.cycles_per_s / max(self.bare.cycles_per_s, 1e-9)


def _run(service: str, variant: Variant, seconds: float, warmup_s: float) -> Measurement:
    module, workload, _unit = WORKLOADS[service]
    arguments = [*workload, "--clients", str(CLIENTS), "--channels", "1"]
    arguments += ["--seconds", str(seconds), "--warmup", str(warmup_s)]
    with servers.temp_dir(f"bench-costs-{service}-") as data_dir:
        url = f"sqlite:///{data_dir / f'{service}.sqlite3'}"
        with servers.running_server(
            url, data_dir, "FULL", service=service, extra_args=variant.server_args()
        ) as srv:
            return harness.run_loadgen(
                srv, module, arguments, warmup_s + seconds + 120, env=variant.loadgen_env()
            )


def measure(seconds: float, warmup_s: float) -> list[Cost]:
    costs = []
    for service in WORKLOADS:
        runs: dict[Variant, list[Measurement]] = {variant: [] for variant in VARIANTS}
        for round_index in range(ROUNDS):
            for variant in VARIANTS:
                measurement = _run(service, variant, seconds, warmup_s)
                log(
                    f"[feature-costs] {service} {variant.name} round {round_index + 1}/{ROUNDS}: "
                    f"{harness.describe(measurement, WORKLOADS[service][2])}"
                )
                runs[variant].append(measurement)
        best = {variant: max(ms, key=lambda m: m.cycles_per_s) for variant, ms in runs.items()}
        bare = best[VARIANTS[0]]
        costs += [Cost(service, variant, best[variant], bare) for variant in VARIANTS]
    return costs


def render(costs: list[Cost]) -> str:
    header = (
        f"{'service':<10}{'variant':<16}{'rate /s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'errors':>8}{'srv CPU':>9}  vs bare"
    )
    lines = [header, "-" * len(header)]
    for cost in costs:
        m = cost.measurement
        lines.append(
            f"{cost.service:<10}{cost.variant.name:<16}{m.cycles_per_s:>10,.1f}{m.p50_ms:>9.2f}"
            f"{m.p99_ms:>9.2f}{m.errors:>8}{harness.percent(m.extra.get('server_cpu_util')):>9}"
            f"  {cost.ratio:.3f} x"
        )
    lines.append(
        f"(SQLite FULL, {CLIENTS} clients over 1 channel, best of {ROUNDS} rounds; session: "
        "AppendEvents of one 100-byte message; delivery: RecordObligation -> MarkAttempting "
        "-> MarkDelivered)"
    )
    return "\n".join(lines)


def report(costs: list[Cost]) -> list[dict[str, Any]]:
    return [
        {
            "service": c.service,
            "variant": c.variant.name,
            "access_log": c.variant.access_log,
            "request_ids": c.variant.request_ids,
            "ratio_to_bare": round(c.ratio, 3),
            "measurement": c.measurement.to_json(),
        }
        for c in costs
    ]


def main(argv: list[str] | None = None) -> int:
    return harness.standalone_main(
        "python -m bench.feature_costs",
        "The access log's and request ids' cost, each as a ratio to neither.",
        lambda seconds, warmup_s: render(measure(seconds, warmup_s)),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
