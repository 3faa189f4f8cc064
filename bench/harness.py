"""What both benchmarks share: running a load-generator process, describing and profiling.

A load generator (`bench.delivery_cycle`, `bench.session_load`) runs as its own
process against a server started by `bench.servers`, prints one `Measurement`
as JSON, and the server's per-thread CPU is sampled from /proc around it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import profile_report, servers
from bench.stats import Measurement

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Called right after a load generator starts; returns what to call once it has finished.
During = Callable[[], Callable[[], None]]


_STARTED = time.monotonic()


def log(message: str) -> None:
    """A progress line on stderr, prefixed with the seconds since this process started."""
    print(f"[{time.monotonic() - _STARTED:6.0f} s] {message}", file=sys.stderr, flush=True)


def run_loadgen(
    server: servers.ServerProcess,
    module: str,
    arguments: Sequence[str],
    timeout_s: float,
    during: During | None = None,
    server_cpu: bool = True,
    env: Mapping[str, str] | None = None,
) -> Measurement:
    """One load-generator process (`python -m module --address … arguments`) against
    `server`; with `server_cpu`, the server's CPU is sampled around it and related to
    the generator's wall time (`loadgen_wall_s`).

    `during`, when given, is called right after the load generator starts and
    returns a function called once it has finished (used to attach a profiler).
    `env`: variables set for the generator on top of this process's environment.
    """
    before = servers.thread_cpu(server.pid, server.thread_names)
    command = [sys.executable, "-m", module, "--address", server.address, *arguments]
    process = subprocess.Popen(
        command,
        cwd=servers.REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )
    finish: Callable[[], None] | None = None
    try:
        finish = during() if during is not None else None
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate(timeout=30)
        raise RuntimeError(f"load generator timed out:\n{err[-2000:]}") from None
    finally:
        if process.poll() is None:  # something above failed: never leave it running
            process.kill()
            process.wait(timeout=30)
        if finish is not None:
            finish()
    after = servers.thread_cpu(server.pid, server.thread_names)
    if process.returncode != 0:
        raise RuntimeError(f"load generator failed ({process.returncode}):\n{err[-4000:]}")
    measurement = Measurement.from_json(json.loads(out.strip().splitlines()[-1]))
    if server_cpu:
        spent = servers.cpu_delta(before, after)
        busy_wall = float(measurement.extra.get("loadgen_wall_s", 0.0)) or measurement.window_s
        total = sum(t.cpu_s for t in spent)
        measurement.extra["server_cpu_util"] = round(total / busy_wall, 3)
        measurement.extra["server_threads"] = [
            {"tid": t.tid, "name": t.name, "cpu_util": round(t.cpu_s / busy_wall, 3)}
            for t in spent[:8]
        ]
    return measurement


def describe(m: Measurement, unit: str = "cycles") -> str:
    threads = ", ".join(
        f"{t['name']} {100 * t['cpu_util']:.0f}%" for t in m.extra.get("server_threads", [])[:4]
    )
    server = f"server CPU {100 * m.extra.get('server_cpu_util', 0):.0f}% [{threads}]"
    return (
        f"{m.clients} client(s), {m.channels} channel(s): {m.cycles_per_s:,.0f} {unit}/s, "
        f"p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, errors {m.errors}; "
        f"loadgen CPU {100 * m.extra.get('loadgen_cpu_util', 0):.0f}%"
        + (f", {server}" if "server_cpu_util" in m.extra else "")
    )


def percent(value: Any) -> str:
    return f"{100 * float(value):.0f}%" if isinstance(value, int | float) else "-"


def py_spy_profile(
    key: str,
    srv: servers.ServerProcess,
    spy: str,
    run: Callable[[During], Measurement],
    seconds: float,
    warmup_s: float,
    unit: str = "cycles",
) -> str:
    """One more run (`run(attach)`) with py-spy sampling the server: wall clock of all
    threads and GIL holders with native frames; raw stacks in RESULTS_DIR."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    outputs = {
        "wall clock, all threads (--idle)": RESULTS_DIR / f"profile-{key}-wall.txt",
        "GIL holder only (--gil)": RESULTS_DIR / f"profile-{key}-gil.txt",
    }
    flags = {
        # Non-blocking: the server is not paused, so the wall-clock shares stay true.
        "wall clock, all threads (--idle)": ["--idle", "--nonblocking"],
        # --native (into grpc's Cython and C) needs py-spy to pause the process per sample.
        "GIL holder only (--gil)": ["--gil", "--native"],
    }
    recorders: list[servers.PySpy] = []

    def attach() -> Callable[[], None]:
        time.sleep(warmup_s + 0.7)  # the load generator imports, connects, warms up
        for title, path in outputs.items():
            path.unlink(missing_ok=True)
            recorders.append(servers.PySpy(spy, srv.pid, seconds - 1, path, flags[title]))

        def detach() -> None:
            for recorder in recorders:
                recorder.wait()

        return detach

    measurement = run(attach)
    log(f"[{key}] profiled run (py-spy attached): {describe(measurement, unit)}")
    sections = [f"profiled run: {describe(measurement, unit)}"]
    for (title, path), recorder in zip(outputs.items(), recorders, strict=False):
        sections.append(f"-- {title}: {path.relative_to(servers.REPO_ROOT)}")
        if not path.exists():
            sections.append(f"py-spy wrote nothing: {recorder.log.strip()[-1000:]}")
        sections.append(profile_report.summarise_py_spy(path))
    return "\n".join(sections)


def standalone_main(
    prog: str, description: str, run: Callable[[float, float], str], argv: list[str] | None
) -> int:
    """`python -m bench.X [--quick]` for a section that also runs inside `python -m bench`:
    `run(seconds, warmup_s)` measures and returns the section's table."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--quick", action="store_true", help="3 s per measurement")
    args = parser.parse_args(argv)
    seconds, warmup_s = (3.0, 1.0) if args.quick else (10.0, 2.0)
    print(run(seconds, warmup_s))
    return 0
