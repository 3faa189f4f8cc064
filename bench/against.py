"""`python -m bench --against REV`: this tree's servers beside an earlier release's, in one
run, so that what a change cost is a ratio measured on one machine state.

The server code of REV (a commit, tag or branch of this repository) is exported with
`git archive` into a temporary directory, its stubs generated from its own protos, and
its servers run from there (`bench.servers.started(code_root=…)`) under this tree's
load generator. AppendEvents and the delivery send cycle, 8 clients over 2 channels,
on SQLite FULL and Postgres (as selected); runs alternate this tree / REV `ROUNDS`
times and the better of each side is kept, so a drift of the machine's speed hits both
alike. `python -m bench.instructions --against REV` counts instructions the same way.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path

from bench import loadgen, servers
from bench.plan import Context, Section, error_notes
from bench.report import rate, table
from bench.stats import Measurement

CLIENTS = 8
ROUNDS = 2
#: What is compared: a name, the server it runs on and its workload.
WORKLOADS = (("AppendEvents", "session", "append"), ("delivery cycle", "delivery", "cycle"))


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


def _measure(
    service: str, workload: str, backend: servers.Backend, root: Path, ctx: Context
) -> Measurement:
    load = loadgen.Load(
        workload,
        clients=CLIENTS,
        channels=2,
        seconds=ctx.scale.seconds,
        warmup_s=ctx.scale.warmup_s,
    )
    with servers.serving(service, backend, code_root=root) as server:
        return loadgen.run(server, load)


def run(revision: str, ctx: Context) -> Section:
    rows, pairs, measured = [], [], []
    backends = [b for b in ctx.backends if b.key in ("sqlite-full", "postgres")]
    with release_tree(revision) as release:
        for backend in backends:
            for name, service, workload in WORKLOADS:
                sides: dict[Path, list[Measurement]] = {servers.REPO_ROOT: [], release: []}
                for round_index in range(ROUNDS):
                    for root, found in sides.items():
                        tree = "this tree" if root == servers.REPO_ROOT else revision
                        ctx.say(
                            f"[against] {name} on {backend.key}, {tree}, round {round_index + 1}"
                        )
                        found.append(_measure(service, workload, backend, root, ctx))
                ours, theirs = (
                    max(found, key=lambda m: m.cycles_per_s) for found in sides.values()
                )
                share = ours.cycles_per_s / max(theirs.cycles_per_s, 1e-9)
                rows.append(
                    (
                        name,
                        backend.key,
                        rate(ours.cycles_per_s),
                        rate(theirs.cycles_per_s),
                        f"{share:.2f} x",
                    )
                )
                pairs.append(
                    {
                        "workload": name,
                        "backend": backend.key,
                        "ratio": round(share, 3),
                        "current": ours.to_json(),
                        "release": theirs.to_json(),
                    }
                )
                measured += [m for found in sides.values() for m in found]
    header = ("workload", "backend", "this tree /s", f"{revision} /s", "ratio")
    note = f"{CLIENTS} clients over 2 channels, best of {ROUNDS} alternating runs each"
    return Section(
        "against",
        f"This tree against {revision}",
        table(header, rows, note),
        {"revision": revision, "pairs": pairs},
        notes=error_notes("against", measured),
    )
