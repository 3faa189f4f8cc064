"""`python -m bench --against REV`: this tree's servers beside an earlier release's, in one run.

What a change costs is a ratio measured on one machine state: the release named by
REV (a commit, tag or branch of this repository) is exported to a temporary
directory, its gRPC stubs generated from its own protos, and its servers run from
there (`servers.ServerProcess(code_root=…)`) under the same load generators as
this tree's. Runs alternate (this tree, the release, this tree, the release) so
that a drift of the machine's speed hits both sides alike; the better of each
side's runs is kept.

Measured per backend (SQLite synchronous=FULL and Postgres): AppendEvents at 8
clients and the delivery send cycle (record, attempting, delivered) at 8 clients.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from bench import servers, session_runner
from bench.harness import log
from bench.stats import Measurement

CLIENTS = 8
ROUNDS = 2


@contextmanager
def release_tree(revision: str) -> Iterator[Path]:
    """The server code of `revision` in a temporary directory, stubs generated."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "switchboard", "session_service",
         "delivery_service", "protos"],
        cwd=servers.REPO_ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="switchboard-release-") as directory:
        root = Path(directory)
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(root, filter="data")
        protos = sorted(str(p.relative_to(root / "protos")) for p in root.glob("protos/**/*.proto"))
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", "-Iprotos", "--python_out=.",
             "--grpc_python_out=.", *(f"protos/{p}" for p in protos)],
            cwd=root, check=True,
        )  # fmt: skip
        yield root


@dataclass(frozen=True)
class Pair:
    workload: str
    backend: str
    current: Measurement
    release: Measurement

    @property
    def ratio(self) -> float:
        return self.current.cycles_per_s / max(self.release.cycles_per_s, 1e-9)


def _measure(
    service: str,
    backend: str,
    code_root: Path,
    load: Callable[[servers.ServerProcess], Measurement],
) -> Measurement:
    with servers.temp_dir("bench-against-") as data_dir:
        if backend == "postgres":
            with (
                servers.postgres_schema() as url,
                servers.running_server(
                    url, data_dir, service=service, code_root=code_root
                ) as server,
            ):
                return load(server)
        url = f"sqlite:///{data_dir / f'{service}.sqlite3'}"
        with servers.running_server(
            url, data_dir, "FULL", service=service, code_root=code_root
        ) as server:
            return load(server)


def compare(revision: str, backends: list[str], seconds: float, warmup_s: float) -> list[Pair]:
    from bench import runner  # not at the top: bench.runner imports this module

    workloads: dict[str, tuple[str, Callable[[servers.ServerProcess], Measurement]]] = {
        "AppendEvents": (
            "session",
            lambda srv: session_runner.run_appends(srv, CLIENTS, 2, seconds, warmup_s),
        ),
        "delivery cycle": (
            "delivery",
            lambda srv: runner.run_load(srv, CLIENTS, 2, seconds, warmup_s),
        ),
    }
    pairs = []
    with release_tree(revision) as release:
        for backend in backends:
            for workload, (service, load) in workloads.items():
                sides: dict[Path, list[Measurement]] = {servers.REPO_ROOT: [], release: []}
                for round_index in range(ROUNDS):
                    for root in sides:
                        name = "this tree" if root == servers.REPO_ROOT else revision
                        log(f"against {revision}: {workload} on {backend}, {name}, "
                            f"round {round_index + 1}/{ROUNDS}")  # fmt: skip
                        sides[root].append(_measure(service, backend, root, load))
                best = [max(runs, key=lambda m: m.cycles_per_s) for runs in sides.values()]
                pairs.append(Pair(workload, backend, best[0], best[1]))
    return pairs


def render(revision: str, pairs: list[Pair]) -> str:
    lines = [
        f"This tree against {revision} (8 clients, best of {ROUNDS} alternating runs each)",
        f"{'workload':<16} {'backend':<10} {'this tree /s':>13} "
        f"{revision + ' /s':>16} {'ratio':>7}",
    ]
    for pair in pairs:
        lines.append(
            f"{pair.workload:<16} {pair.backend:<10} {pair.current.cycles_per_s:>13,.0f} "
            f"{pair.release.cycles_per_s:>16,.0f} {pair.ratio:>6.2f}x"
        )
    return "\n".join(lines)


def to_json(revision: str, pairs: list[Pair]) -> dict[str, Any]:
    return {
        "revision": revision,
        "pairs": [
            {
                "workload": p.workload,
                "backend": p.backend,
                "ratio": round(p.ratio, 3),
                "current": p.current.to_json(),
                "release": p.release.to_json(),
            }
            for p in pairs
        ],
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m bench.against",
        description="This tree's servers against an earlier release's, in one run.",
    )
    parser.add_argument("revision", help="a commit, tag or branch of this repository")
    parser.add_argument("--quick", action="store_true", help="3 s per measurement")
    args = parser.parse_args(argv)
    seconds, warmup_s = (3.0, 1.0) if args.quick else (10.0, 2.0)
    backends = ["sqlite-full"]
    reason = servers.postgres_unreachable_reason()
    if reason is None:
        backends.append("postgres")
    else:
        log(f"note: postgres skipped: {reason}")
    print(render(args.revision, compare(args.revision, backends, seconds, warmup_s)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
