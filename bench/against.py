"""`python -m bench --against REV`: this tree's servers beside an earlier release's, in one
run, so that what a change cost is a ratio measured on one machine state.

The server code of REV (a commit, tag or branch of this repository) is exported with
`git archive` into a temporary directory, its stubs generated from its own protos, and
its servers run from there (`bench.servers.started(code_root=…)`) under this tree's
load generator. AppendEvents and the delivery send cycle, 8 clients over 2 channels
(throughput); a lone writer's AppendEvents (p50) and AppendEvents offered at 500/s in
an open loop (p99), the quiet and the steady case a batching writer must not tax; on
SQLite FULL and Postgres (as selected). Runs alternate this tree / REV `ROUNDS` times
and the better of each side is kept, so a drift of the machine's speed hits both
alike. `python -m bench.instructions --against REV` counts instructions the same way.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from bench import loadgen, open_loop, servers
from bench.plan import Context, Section, error_notes
from bench.report import rate, table
from bench.stats import Measurement

ROUNDS = 2


@dataclass(frozen=True)
class Comparison:
    """One figure compared: a workload on a service, under a load, read as `figure`."""

    name: str
    service: str
    workload: str
    clients: int
    #: Operations offered per second (an open loop); 0: a closed loop.
    rate: float = 0.0
    #: "rate" (higher is better), "p50" or "p99" (milliseconds, lower is better).
    figure: str = "rate"

    def value(self, measured: Measurement) -> float:
        if self.figure == "rate":
            return measured.cycles_per_s
        return measured.p50_ms if self.figure == "p50" else measured.p99_ms

    def better(self, found: list[Measurement]) -> Measurement:
        pick = max if self.figure == "rate" else min
        return pick(found, key=self.value)

    def shown(self, measured: Measurement) -> str:
        if self.figure == "rate":
            return rate(measured.cycles_per_s)
        return f"{self.value(measured):.2f} ms {self.figure}"


COMPARISONS = (
    Comparison("AppendEvents", "session", "append", clients=8),
    Comparison("delivery cycle", "delivery", "cycle", clients=8),
    Comparison("AppendEvents, 1 client", "session", "append", clients=1, figure="p50"),
    Comparison("AppendEvents, open loop 500/s", "session", "append", 8, rate=500, figure="p99"),
)


#: What a release tree needs to serve; the packages a release may lack are left out.
_SERVER_PATHS = ("switchboard", "session_service", "delivery_service", "protos")
_LATER_PATHS = ("switchboard_cli", "switchboard_console")


def _server_paths(revision: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", revision, *_LATER_PATHS],
        cwd=servers.REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [*_SERVER_PATHS, *listed]


@contextmanager
def release_tree(revision: str) -> Iterator[Path]:
    """The server code of `revision` in a temporary directory, stubs generated."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, *_server_paths(revision)],
        cwd=servers.REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tempfile.TemporaryDirectory(prefix="switchboard-release-") as directory:
        root = Path(directory)
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(root, filter="data")
        protos = sorted(str(p.relative_to(root / "protos")) for p in root.glob("protos/**/*.proto"))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                "-Iprotos",
                "--python_out=.",
                "--grpc_python_out=.",
                *(f"protos/{p}" for p in protos),
            ],
            cwd=root,
            check=True,
        )
        yield root


def _load(compared: Comparison, ctx: Context) -> loadgen.Load:
    return loadgen.Load(
        compared.workload,
        clients=compared.clients,
        channels=min(2, compared.clients),
        seconds=ctx.scale.seconds,
        warmup_s=ctx.scale.warmup_s,
        rate=compared.rate,
    )


def _measure_service(
    service: str, backend: servers.Backend, root: Path, ctx: Context
) -> dict[Comparison, Measurement]:
    """Every comparison on `service`, one after another on one server of `root`."""
    with servers.serving(service, backend, code_root=root) as server:
        return {
            compared: loadgen.run(server, _load(compared, ctx))
            for compared in COMPARISONS
            if compared.service == service
        }


def _pair(
    compared: Comparison, backend: str, ours: list[Measurement], theirs: list[Measurement]
) -> dict[str, Any]:
    best, release = compared.better(ours), compared.better(theirs)
    return {
        "workload": compared.name,
        "backend": backend,
        "figure": compared.figure,
        "ratio": round(compared.value(best) / max(compared.value(release), 1e-9), 3),
        "current": best,
        "release": release,
    }


def run(revision: str, ctx: Context) -> Section:
    rows, pairs, measured = [], [], []
    backends = [b for b in ctx.backends if b.key in ("sqlite-full", "postgres")]
    services = list(dict.fromkeys(compared.service for compared in COMPARISONS))
    with release_tree(revision) as release:
        for backend in backends:
            found: dict[Path, dict[Comparison, list[Measurement]]] = {
                root: {compared: [] for compared in COMPARISONS}
                for root in (servers.REPO_ROOT, release)
            }
            for round_index in range(ROUNDS):
                for root, by_comparison in found.items():
                    tree = "this tree" if root == servers.REPO_ROOT else revision
                    for service in services:
                        ctx.say(
                            f"[against] {service} on {backend.key}, {tree}, round {round_index + 1}"
                        )
                        for compared, m in _measure_service(service, backend, root, ctx).items():
                            by_comparison[compared].append(m)
                            measured.append(m)
            for compared in COMPARISONS:
                pair = _pair(
                    compared,
                    backend.key,
                    found[servers.REPO_ROOT][compared],
                    found[release][compared],
                )
                rows.append(
                    (
                        compared.name,
                        backend.key,
                        compared.shown(pair["current"]),
                        compared.shown(pair["release"]),
                        f"{pair['ratio']:.2f} x",
                    )
                )
                pairs.append(
                    {
                        **pair,
                        "current": pair["current"].to_json(),
                        "release": pair["release"].to_json(),
                    }
                )
    header = ("workload", "backend", "this tree", revision, "ratio")
    note = (
        f"closed loops of 8 clients over 2 channels unless said (the open loop: "
        f"{open_loop.LANES} sessions); best of {ROUNDS} "
        "alternating runs each; a rate's ratio above 1 and a latency's below 1 favour "
        "this tree"
    )
    return Section(
        "against",
        f"This tree against {revision}",
        table(header, rows, note),
        {"revision": revision, "pairs": pairs},
        notes=error_notes("against", measured),
    )
