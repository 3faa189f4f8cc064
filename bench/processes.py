"""One server process against two on the same database: is a second process worth it?

The server is CPU-bound on one core (the GIL) at 8 clients, so the obvious way past
it is more processes: `grpc.so_reuseport` would let several share one port, and on
Postgres several replicas are the supported deployment anyway. With SQLite every
process writes the same file, and its writers exclude each other across processes
(no group commit spans two processes), so the second process may cost more than it
brings. This measures it before choosing:

- `1 process`: one server, one load generator of 8 clients over 1 channel;
- `2 processes`: two servers on the same database (each its own port, as two
  replicas behind a balancer would be), two load generators of 4 clients each,
  run at the same time; the rate is their sum.

AppendEvents (each generator creates its own agent and sessions) and the delivery
send cycle (each its own instance), on SQLite FULL and on Postgres. Ratio: 2
processes over 1.

    python -m bench.processes [--quick]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from bench import harness, servers
from bench.feature_costs import WORKLOADS
from bench.harness import log
from bench.stats import Measurement

CLIENTS = 8


@dataclass(frozen=True)
class Point:
    service: str
    backend: str
    processes: int
    rate: float
    errors: int
    server_cpu: float

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "backend": self.backend,
            "processes": self.processes,
            "rate": round(self.rate, 1),
            "errors": self.errors,
            "server_cpu_util": round(self.server_cpu, 3),
        }


@contextmanager
def _database(service: str, backend: str) -> Iterator[tuple[str, Any]]:
    with servers.temp_dir(f"bench-procs-{service}-") as data_dir:
        if backend == "postgres":
            with servers.postgres_schema() as url:
                yield url, data_dir
        else:
            yield f"sqlite:///{data_dir / f'{service}.sqlite3'}", data_dir


def _load(service: str, clients: int, seconds: float, warmup_s: float) -> Callable[..., Any]:
    module, workload, _unit = WORKLOADS[service]
    arguments = [*workload, "--clients", str(clients), "--channels", "1"]
    arguments += ["--seconds", str(seconds), "--warmup", str(warmup_s)]

    def run(srv: servers.ServerProcess) -> Measurement:
        return harness.run_loadgen(srv, module, arguments, warmup_s + seconds + 120)

    return run


def measure_point(
    service: str, backend: str, processes: int, seconds: float, warmup_s: float
) -> Point:
    load = _load(service, CLIENTS // processes, seconds, warmup_s)
    with _database(service, backend) as (url, data_dir), ExitStack() as stack:
        started = [
            stack.enter_context(servers.running_server(url, data_dir, "FULL", service=service))
            for _ in range(processes)
        ]
        with ThreadPoolExecutor(max_workers=processes) as pool:
            measured = list(pool.map(load, started))
    return Point(
        service,
        backend,
        processes,
        rate=sum(m.cycles_per_s for m in measured),
        errors=sum(m.errors for m in measured),
        server_cpu=sum(float(m.extra.get("server_cpu_util", 0.0)) for m in measured),
    )


def measure(seconds: float, warmup_s: float) -> list[Point]:
    backends = ["sqlite-full"]
    reason = servers.postgres_unreachable_reason()
    if reason is None:
        backends.append("postgres")
    else:
        log(f"[processes] postgres skipped: {reason}")
    points = []
    for backend in backends:
        for service in WORKLOADS:
            for processes in (1, 2):
                point = measure_point(service, backend, processes, seconds, warmup_s)
                log(f"[processes] {service} {backend} x{processes}: {point.rate:,.0f}/s")
                points.append(point)
    return points


def render(points: list[Point]) -> str:
    header = f"{'service':<10}{'backend':<13}{'processes':>10}{'rate /s':>10}{'errors':>8}"
    header += f"{'srv CPU':>9}  vs 1 process"
    lines = [header, "-" * len(header)]
    single = {(p.service, p.backend): p.rate for p in points if p.processes == 1}
    for p in points:
        base = single.get((p.service, p.backend), 0.0)
        ratio = f"{p.rate / base:.2f} x" if base else "n/a"
        lines.append(
            f"{p.service:<10}{p.backend:<13}{p.processes:>10}{p.rate:>10,.1f}{p.errors:>8}"
            f"{harness.percent(p.server_cpu):>9}  {ratio}"
        )
    lines.append(
        f"({CLIENTS} clients in all, over 1 channel per load generator; 2 processes: two "
        "servers on one database, a generator of half the clients each, at the same time; "
        "srv CPU: both servers', in % of one core)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return harness.standalone_main(
        "python -m bench.processes",
        "One server process against two on the same database.",
        lambda seconds, warmup_s: render(measure(seconds, warmup_s)),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
