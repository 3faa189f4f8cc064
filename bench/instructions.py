"""`python -m bench.instructions`: instructions per RPC, counted by callgrind.

Wall-clock rates move with whatever else runs on this 2-core machine; the
instructions a server executes for one call hardly do (issue 15). So a real
`switchboard serve session|delivery` process (SQLite FULL in a temp directory,
`bench.servers`) runs under `valgrind --tool=callgrind --instr-atstart=no`:
nothing is counted while it starts. Once it answers and a warm-up of calls has
run, for each operation and each of `--windows` windows (2): counters zeroed,
instrumentation on (`callgrind_control -i on PID`), N sequential calls from one
client in this process, instrumentation off, a dump (`callgrind_control -d`),
whose total Ir is read from the file's `totals:` line. Instructions per call =
that total / N: the whole server process (every thread, gRPC's C core, SQLite),
nothing subtracted.

Operations (`--only`):

- `appends`: SessionService AppendEvents of one 100-byte USER message into a session
  of its own (`bench.workloads.Append`);
- `delivery`: one DeliveryService send cycle, RecordObligation → MarkAttempting →
  MarkDelivered (`bench.workloads.Cycle`), 3 RPCs;
- `appends-stream`, `delivery2-stream` (not by default): 8 appends, or 8 delivery cycles
  with record-and-begin (2 RPCs each), at once over CallStream as the clients carry
  concurrent calls; per RPC, against the unary `appends` and `delivery`;
- `noop`: `grpc.health.v1.Health/Check`, the baseline. It is counted on every
  server started, first, and each operation is related to the no-op of its own
  server per RPC (a delivery cycle against 3 no-ops).

An idle window (instrumentation on, no calls) per server gives the background
rate (timers, pollers) in instructions per second; "idle share" is that rate
times a window's length over the window's count: how much of a figure is time,
not calls (under callgrind a call is an order of magnitude slower, so this share
is larger than it would be natively). What moves a count between windows is mostly Python's
cyclic garbage collector: a full collection (~15 million instructions in a session
server) lands in one window and not in the other; more ops per window (`--calls`)
or more windows (`--windows`) spread it thinner. So every window's instructions
inside the collector (`gc_collect_main`, inclusive, read by `callgrind_annotate`)
are counted too: "GC share" and "w/o GC", the spread of the counts less them.
What is left is mostly the database growing: each window adds its rows, so a later
window's SQLite searches slightly larger tables (~0.5 % more in a delivery window's
SQLite functions, by `callgrind_annotate`).
`--keep-dumps DIR` keeps every
window's dump, for `callgrind_annotate` (per function, one window against another).

`--against REV` counts the same for REV's server code (`bench.against.release_tree`)
and prints this tree's count over REV's per operation.

Results: stdout and `bench/results/instructions.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench import against, servers, workloads
from bench.plan import progress as log
from bench.report import RESULTS_DIR

OPS = ("appends", "delivery", "noop")
#: Ops per window: under callgrind (here) a no-op takes ~10 ms, an append ~25 ms and a
#: delivery cycle ~65 ms (3x that on a busy machine), so a run of all three takes ~1.5 min.
DEFAULT_CALLS = 300
#: Uncounted calls per operation first: imports, caches, prepared statements and lazily
#: initialised paths inside gRPC and the server all settle before anything is counted.
WARMUP_CALLS = 20
#: Counted windows per operation; their spread shows how repeatable a count is.
DEFAULT_WINDOWS = 2
IDLE_WINDOW_S = 3.0
#: A server under valgrind starts ~10x slower than natively; on a busy machine more.
START_TIMEOUT_S = 300.0
#: For the channel to a server under callgrind; the calls keep the workloads' 10 s per
#: RPC (a call here takes well under 0.1 s even on a busy machine).
RPC_TIMEOUT_S = 60.0
CALLGRIND_OUT = "callgrind.out"


def callgrind_prefix(out_dir: Path) -> list[str]:
    """valgrind's command line in front of the server's. Python's own allocator is
    kept (no PYTHONMALLOC=malloc: callgrind does not need it, and the count should be
    of the allocator the server really runs with)."""
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",  # nothing counted until `callgrind_control -i on`
        "--trace-children=no",
        "--separate-threads=no",  # one count for all threads: gRPC's, the loop's, SQLite's
        "--dump-instr=no",
        "--dump-line=no",  # per-function totals suffice: smaller dumps, quicker to read
        f"--callgrind-out-file={out_dir / CALLGRIND_OUT}",
    ]


def callgrind_instructions(path: Path) -> int:
    """The total Ir (instructions executed) of one callgrind output file.

    Read from the `totals:` line (the sum of the file's cost lines), else from
    `summary:`; `events:` says which column is Ir. The `totals:` line is preferred:
    in a dump made with `callgrind_control -d` after `-z`, valgrind 3.19 writes
    `summary: 0` while `totals:` holds the window's count.
    """
    events: list[str] | None = None
    totals: list[int] | None = None
    summary: list[int] | None = None
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("totals:"):
                totals = [int(value) for value in line.split()[1:]]
            elif line.startswith("summary:"):
                summary = [int(value) for value in line.split()[1:]]
    if events is None or "Ir" not in events:
        raise ValueError(f"{path}: no `events:` line naming Ir")
    counts = totals if totals is not None else summary
    if counts is None:
        raise ValueError(f"{path}: neither a `totals:` nor a `summary:` line")
    return counts[events.index("Ir")]


_GC_FUNCTION = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+\S*:gc_collect_main(\s|$)")


def gc_instructions(path: Path) -> int:
    """Instructions inside Python's cyclic garbage collector (`gc_collect_main`,
    inclusive) in one callgrind output file, by `callgrind_annotate`. Its entries are
    summed: callgrind_annotate splits a function by the file its inlined code comes from
    (`gcmodule.c:gc_collect_main`, `object.h:gc_collect_main`)."""
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    return sum(
        int(match.group(1).replace(",", ""))
        for line in annotated.splitlines()
        if (match := _GC_FUNCTION.match(line))
    )


class Callgrind:
    """`callgrind_control` for one process running under callgrind."""

    def __init__(self, pid: int, out_dir: Path) -> None:
        self.pid = pid
        self.out_dir = out_dir

    def _control(self, *flags: str) -> None:
        done = subprocess.run(
            ["callgrind_control", *flags, str(self.pid)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        # callgrind_control exits 0 even when it found no such process: read its words.
        if done.returncode != 0 or "Error" in done.stdout + done.stderr:
            raise RuntimeError(
                f"callgrind_control {' '.join(flags)} {self.pid}: {done.stdout}{done.stderr}"
            )

    def zero(self) -> None:
        self._control("-z")

    def instrument(self, on: bool) -> None:
        self._control("-i", "on" if on else "off")

    def dump(self, timeout_s: float = 120.0) -> tuple[int, Path]:
        """Dumps the counters (which zeroes them); the dump's total Ir and its file."""
        before = set(self.out_dir.glob(f"{CALLGRIND_OUT}.*"))
        self._control("-d")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            new = sorted(set(self.out_dir.glob(f"{CALLGRIND_OUT}.*")) - before)
            if new:
                try:
                    instructions = callgrind_instructions(new[-1])
                except ValueError:
                    pass  # still being written
                else:
                    return instructions, new[-1]
            time.sleep(0.2)
        raise RuntimeError(f"callgrind wrote no dump into {self.out_dir} in {timeout_s:g} s")


@dataclass(frozen=True)
class Plan:
    """How much is counted: `windows` windows of `calls` ops per operation."""

    calls: int = DEFAULT_CALLS
    windows: int = DEFAULT_WINDOWS


@dataclass(frozen=True)
class Window:
    instructions: int
    calls: int
    seconds: float
    #: Of `instructions`, those inside Python's cyclic GC (`gc_instructions`).
    gc: int = 0

    @property
    def per_call(self) -> float:
        return self.instructions / self.calls

    @property
    def per_call_without_gc(self) -> float:
        return (self.instructions - self.gc) / self.calls


def _spread(values: list[float]) -> float:
    """(largest - smallest) / mean."""
    return (max(values) - min(values)) / (sum(values) / len(values))


@dataclass
class Count:
    """One operation's windows on one server."""

    op: str
    server: str
    rpcs: int
    windows: list[Window] = field(default_factory=list)

    @property
    def per_call(self) -> float:
        return sum(w.per_call for w in self.windows) / len(self.windows)

    @property
    def spread(self) -> float:
        """(largest - smallest window) / their mean."""
        return _spread([w.per_call for w in self.windows])

    @property
    def spread_without_gc(self) -> float:
        """The spread of the windows' counts less their GC: what the collector's lumps
        leave of it."""
        return _spread([w.per_call_without_gc for w in self.windows])

    @property
    def gc_share(self) -> float:
        return sum(w.gc for w in self.windows) / sum(w.instructions for w in self.windows)

    def idle_share(self, idle_per_s: float) -> float:
        return sum(idle_per_s * w.seconds / w.instructions for w in self.windows) / len(
            self.windows
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "server": self.server,
            "rpcs_per_op": self.rpcs,
            "instructions_per_op": round(self.per_call),
            "spread": round(self.spread, 5),
            "spread_without_gc": round(self.spread_without_gc, 5),
            "gc_share": round(self.gc_share, 5),
            "windows": [
                {
                    "instructions": w.instructions,
                    "gc_instructions": w.gc,
                    "calls": w.calls,
                    "seconds": round(w.seconds, 2),
                    "per_op": round(w.per_call),
                }
                for w in self.windows
            ],
        }


@dataclass
class ServerCounts:
    server: str
    idle_per_s: float
    counts: list[Count]

    def noop(self) -> Count | None:
        return next((c for c in self.counts if c.op == "noop"), None)


#: Operations at once in a `-stream` op (a gateway with 8 calls in flight).
STREAM_LANES = 8
#: One call of an operation; a closure that keeps its own sequence number.
Call = Callable[[], Awaitable[Any]]

#: op → (service, RPCs per op, the workload whose operation it is).
_OPERATIONS: dict[str, tuple[str, int, type[workloads.Workload]]] = {
    "noop": ("", 1, workloads.Noop),
    "appends": ("session", 1, workloads.Append),
    "delivery": ("delivery", 3, workloads.Cycle),
    # STREAM_LANES operations at once, carried over CallStream as the clients carry them.
    "appends-stream": ("session", STREAM_LANES, workloads.Append),
    "delivery2-stream": ("delivery", 2 * STREAM_LANES, workloads.Cycle),
}


async def _call(channel: grpc.aio.Channel, op: str) -> Call:
    """The workload of `op` prepared on `channel` (one lane), as one call; a `-stream`
    op: STREAM_LANES lanes' operations at once, over CallStream (a delivery one with
    record-and-begin, 2 RPCs a cycle)."""
    workload = _OPERATIONS[op][2]()
    sequence = itertools.count()
    if not op.endswith("-stream"):
        await workload.prepare([channel], 1)
        return lambda: workload.op(0, next(sequence))
    workload.over_stream = True
    if isinstance(workload, workloads.Cycle):
        workload.begin_attempt = True
    await workload.prepare([channel], STREAM_LANES)

    async def together() -> None:
        i = next(sequence)
        await asyncio.gather(*(workload.op(lane, i) for lane in range(STREAM_LANES)))

    return together


async def _count_server(
    address: str,
    callgrind: Callgrind,
    service: str,
    ops: list[str],
    plan: Plan,
    keep_dumps: Path | None,
) -> ServerCounts:
    """The no-op, then each op of `ops`, `plan.windows` windows each, then an idle window.
    The callgrind_control calls block this loop on purpose: nothing else runs in it.
    `keep_dumps`: a directory the windows' dumps are copied into (`keep_dumps/SERVICE-OP-N`),
    for `callgrind_annotate`."""
    channel = grpc.aio.insecure_channel(address)
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout=RPC_TIMEOUT_S)
        counts = []
        for op in ["noop", *ops]:
            rpcs = _OPERATIONS[op][1]
            call = await _call(channel, op)
            for _ in range(WARMUP_CALLS):
                await call()
            count = Count(op, service, rpcs)
            for window in range(plan.windows):
                callgrind.zero()
                callgrind.instrument(True)
                began = time.perf_counter()
                for _ in range(plan.calls):
                    await call()
                seconds = time.perf_counter() - began
                callgrind.instrument(False)
                instructions, dump = callgrind.dump()
                gc = gc_instructions(dump)
                count.windows.append(Window(instructions, plan.calls, seconds, gc))
                if keep_dumps is not None:
                    keep_dumps.mkdir(parents=True, exist_ok=True)
                    shutil.copy(dump, keep_dumps / f"{service}-{op}-{window + 1}")
                log(
                    f"{service}: {op} window {window + 1}/{plan.windows}: "
                    f"{count.windows[-1].per_call:,.0f} instructions/op ({seconds:.1f} s)"
                )
            counts.append(count)
        callgrind.zero()
        callgrind.instrument(True)
        began = time.perf_counter()
        await asyncio.sleep(IDLE_WINDOW_S)
        idle_seconds = time.perf_counter() - began
        callgrind.instrument(False)
        idle_per_s = callgrind.dump()[0] / idle_seconds
        log(f"{service}: idle {idle_per_s:,.0f} instructions/s")
        return ServerCounts(service, idle_per_s, counts)
    finally:
        await channel.close()


def count_tree(
    code_root: Path, only: list[str], plan: Plan, keep_dumps: Path | None = None
) -> list[ServerCounts]:
    """Counts `only` against servers of the tree at `code_root`, one server per service."""
    wanted: dict[str, list[str]] = {}
    for op in only:
        service = _OPERATIONS[op][0] or "session"  # the no-op alone: on a session server
        ops = wanted.setdefault(service, [])
        if op != "noop":
            ops.append(op)
    results = []
    for service, ops in wanted.items():
        with ExitStack() as stack:
            data_dir = stack.enter_context(servers.temp_dir("bench-instructions-"))
            url = f"sqlite:///{data_dir / f'{service}.sqlite3'}"
            log(f"starting the {service} server under callgrind ({code_root})")
            started = time.monotonic()
            server = stack.enter_context(
                servers.started(
                    service,
                    url,
                    data_dir,
                    code_root=code_root,
                    command_prefix=callgrind_prefix(data_dir),
                    start_timeout_s=START_TIMEOUT_S,
                )
            )
            log(f"{service} server listening after {time.monotonic() - started:.0f} s")
            callgrind = Callgrind(server.pid, data_dir)
            results.append(
                asyncio.run(
                    _count_server(server.address, callgrind, service, ops, plan, keep_dumps)
                )
            )
    return results


def _rows(tree: list[ServerCounts]) -> list[tuple[ServerCounts, Count]]:
    return [(sc, c) for sc in tree for c in sc.counts]


def _vs_noop(server: ServerCounts, count: Count) -> float | None:
    noop = server.noop()
    return None if noop is None else count.per_call / (count.rpcs * noop.per_call)


def render(tree: list[ServerCounts], plan: Plan) -> str:
    lines = [
        f"Instructions per op (callgrind, whole server process, {plan.windows} windows of "
        f"{plan.calls} sequential ops, 1 client, SQLite FULL)",
        f"{'op':<10} {'server':<9} {'RPCs':>4} {'instructions/op':>16} {'per RPC':>12} "
        f"{'vs no-op':>9} {'spread':>7} {'GC share':>8} {'w/o GC':>7} {'idle share':>10}",
    ]
    for server, count in _rows(tree):
        ratio = _vs_noop(server, count)
        lines.append(
            f"{count.op:<10} {server.server:<9} {count.rpcs:>4} {count.per_call:>16,.0f} "
            f"{count.per_call / count.rpcs:>12,.0f} "
            f"{'-' if ratio is None else f'{ratio:.2f}x':>9} {100 * count.spread:>6.2f}% "
            f"{100 * count.gc_share:>7.2f}% {100 * count.spread_without_gc:>6.2f}% "
            f"{100 * count.idle_share(server.idle_per_s):>9.1f}%"
        )
    lines.append(
        "(vs no-op: per RPC over one Health/Check on the same server; spread: (max - min) / "
        "mean of the windows; GC share: instructions inside Python's cyclic GC; w/o GC: the "
        "spread of the counts less their GC; idle share: the server's idle instructions/s "
        "times a window's length over its count)"
    )
    lines += [f"idle {sc.server} server: {sc.idle_per_s:,.0f} instructions/s" for sc in tree]
    return "\n".join(lines)


def compare(current: list[ServerCounts], release: list[ServerCounts]) -> list[dict[str, Any]]:
    theirs = {(sc.server, c.op): c for sc, c in _rows(release)}
    pairs = []
    for server, count in _rows(current):
        other = theirs.get((server.server, count.op))
        if other is not None:
            pairs.append(
                {
                    "op": count.op,
                    "server": server.server,
                    "this_tree": round(count.per_call),
                    "release": round(other.per_call),
                    "ratio": round(count.per_call / other.per_call, 4),
                }
            )
    return pairs


def render_against(revision: str, pairs: list[dict[str, Any]]) -> str:
    lines = [
        f"This tree against {revision} (instructions per op)",
        f"{'op':<10} {'server':<9} {'this tree':>14} {revision:>14} {'ratio':>7}",
    ]
    for pair in pairs:
        lines.append(
            f"{pair['op']:<10} {pair['server']:<9} {pair['this_tree']:>14,} "
            f"{pair['release']:>14,} {pair['ratio']:>6.3f}x"
        )
    return "\n".join(lines)


def to_json(tree: list[ServerCounts]) -> list[dict[str, Any]]:
    out = []
    for server, count in _rows(tree):
        data = count.to_json()
        data["vs_noop_per_rpc"] = (
            None if (ratio := _vs_noop(server, count)) is None else round(ratio, 3)
        )
        data["idle_share"] = round(count.idle_share(server.idle_per_s), 4)
        data["server_idle_instructions_per_s"] = round(server.idle_per_s)
        out.append(data)
    return out


def valgrind_version() -> str:
    done = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions",
        description="Instructions per RPC of real servers, counted by callgrind.",
    )
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help="ops per counted window")
    parser.add_argument(
        "--only",
        default=",".join(OPS),
        help=f"comma-separated, of {', '.join(_OPERATIONS)} (default: {', '.join(OPS)})",
    )
    parser.add_argument(
        "--windows", type=int, default=DEFAULT_WINDOWS, help="counted windows per op (>= 2)"
    )
    parser.add_argument("--against", metavar="REV", help="also count REV's server code")
    parser.add_argument(
        "--keep-dumps",
        type=Path,
        metavar="DIR",
        help="copy every window's callgrind dump into DIR (DIR/this-tree, DIR/REV)",
    )
    args = parser.parse_args(argv)
    only = [op.strip() for op in args.only.split(",") if op.strip()]
    if not only or any(op not in _OPERATIONS for op in only):
        parser.error(f"--only takes a comma-separated list of {', '.join(_OPERATIONS)}")
    if args.calls < 1 or args.windows < 2:
        parser.error("--calls must be >= 1, --windows >= 2")
    plan = Plan(args.calls, args.windows)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind and callgrind_control are needed (apt-get install valgrind)")

    began = time.monotonic()
    report: dict[str, Any] = {
        "machine": servers.machine_info(),
        "valgrind": valgrind_version(),
        "calls_per_window": args.calls,
        "windows": args.windows,
        "warmup_calls": WARMUP_CALLS,
    }
    keep = args.keep_dumps
    current = count_tree(
        servers.REPO_ROOT, only, plan, None if keep is None else keep / "this-tree"
    )
    print(render(current, plan), flush=True)
    report["this_tree"] = to_json(current)
    if args.against:
        with against.release_tree(args.against) as release_root:
            release = count_tree(
                release_root,
                only,
                plan,
                None if keep is None else keep / args.against.replace("/", "_"),
            )
        print(f"\n{args.against}:\n{render(release, plan)}")
        pairs = compare(current, release)
        print("\n" + render_against(args.against, pairs))
        report["against"] = {
            "revision": args.against,
            "release": to_json(release),
            "pairs": pairs,
        }
    report["elapsed_s"] = round(time.monotonic() - began, 1)
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "instructions.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    log(f"done in {report['elapsed_s']:.0f} s; results: {path.relative_to(servers.REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
