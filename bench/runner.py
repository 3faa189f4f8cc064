"""The delivery-cycle benchmark: floors, servers, load, table, JSON.

For each configuration (SQLite synchronous=FULL, SQLite NORMAL, Postgres) a
fresh DeliveryService process is started on 127.0.0.1 and loaded by a separate
load-generator process (`bench.delivery_cycle`) with 1 client, then 8 clients
over 1 and over 2 channels (the faster is kept). Raw driver floors of the same
three transactions are measured in the same run for the ratios.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import baseline, profile_report, servers
from bench.stats import Measurement

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TARGET_CYCLES_PER_S = 1500.0
TARGET_LINE = "target: >= 1,500 cycles/s over gRPC on SQLite FULL (8 clients)"
CONCURRENT_CLIENTS = 8


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    sqlite_sync: str  # the floor it is compared with (Postgres: the FULL floor)


CONFIGS = (
    Config("sqlite-full", "sqlite FULL", "FULL"),
    Config("sqlite-normal", "sqlite NORMAL", "NORMAL"),
    Config("postgres", "postgres", "FULL"),
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- one load-generator run -------------------------------------------------------------------


def run_load(
    server: servers.ServerProcess,
    clients: int,
    channels: int,
    seconds: float,
    warmup_s: float,
    during: Callable[[], Callable[[], None]] | None = None,
    rpc: str = "cycle",
) -> Measurement:
    """One load-generator process against `server`; server CPU sampled around it.

    `during`, when given, is called right after the load generator starts and
    returns a function called once it has finished (used to attach a profiler).
    """
    before = servers.thread_cpu(server.pid, server.thread_names)
    command = [
        sys.executable,
        "-m",
        "bench.delivery_cycle",
        "--address",
        server.address,
        "--clients",
        str(clients),
        "--channels",
        str(channels),
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup_s),
        "--rpc",
        rpc,
    ]
    process = subprocess.Popen(
        command,
        cwd=servers.REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    finish: Callable[[], None] | None = None
    try:
        finish = during() if during is not None else None
        out, err = process.communicate(timeout=warmup_s + seconds + 90)
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
    spent = servers.cpu_delta(before, after)
    busy_wall = float(measurement.extra.get("loadgen_wall_s", 0.0)) or (warmup_s + seconds)
    server_cpu = sum(t.cpu_s for t in spent)
    measurement.extra["server_cpu_util"] = round(server_cpu / busy_wall, 3)
    measurement.extra["server_threads"] = [
        {"tid": t.tid, "name": t.name, "cpu_util": round(t.cpu_s / busy_wall, 3)} for t in spent[:8]
    ]
    return measurement


def _describe(m: Measurement) -> str:
    threads = ", ".join(
        f"{t['name']} {100 * t['cpu_util']:.0f}%" for t in m.extra.get("server_threads", [])[:4]
    )
    return (
        f"{m.clients} client(s), {m.channels} channel(s): {m.cycles_per_s:,.0f} cycles/s, "
        f"p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, errors {m.errors}; "
        f"loadgen CPU {100 * m.extra.get('loadgen_cpu_util', 0):.0f}%, "
        f"server CPU {100 * m.extra.get('server_cpu_util', 0):.0f}% [{threads}]"
    )


# -- one configuration ------------------------------------------------------------------------


@contextmanager
def server_for(
    config: Config, data_dir: Path, cprofile_to: Path | None = None
) -> Iterator[servers.ServerProcess]:
    if config.key == "postgres":
        with (
            servers.postgres_schema() as url,
            servers.running_server(url, data_dir, cprofile_to=cprofile_to) as server,
        ):
            yield server
    else:
        url = f"sqlite:///{data_dir / 'delivery.sqlite3'}"
        with servers.running_server(url, data_dir, config.sqlite_sync, cprofile_to) as server:
            yield server


def measure_config(
    config: Config, seconds: float, warmup_s: float, profile: bool, noop: bool
) -> dict[str, Any]:
    """1 client, then 8 clients over 1 and 2 channels; the faster 8-client run is kept.

    With `noop`, the same server then answers no-op cycles (3 x Health/Check) with
    1 and 8 clients: the ceiling of the gRPC layer alone.
    """
    runs: list[Measurement] = []
    ceiling: list[Measurement] = []
    with servers.temp_dir(f"bench-{config.key}-") as data_dir, server_for(config, data_dir) as srv:
        log(f"[{config.key}] server pid {srv.pid} on {srv.address}")
        for clients, channels in ((1, 1), (CONCURRENT_CLIENTS, 1), (CONCURRENT_CLIENTS, 2)):
            measurement = run_load(srv, clients, channels, seconds, warmup_s)
            measurement.name = config.label
            runs.append(measurement)
            log(f"[{config.key}] {_describe(measurement)}")
        kept_concurrent = max(runs[1:], key=lambda m: m.cycles_per_s)
        two_rpc = run_load(
            srv, CONCURRENT_CLIENTS, kept_concurrent.channels, seconds, warmup_s, rpc="cycle2"
        )
        two_rpc.name = f"{config.label}, 2 RPCs"
        log(f"[{config.key}] 2-RPC cycle (begin_attempt) {_describe(two_rpc)}")
        if noop:
            for clients in (1, CONCURRENT_CLIENTS):
                channels = 1 if clients == 1 else kept_concurrent.channels
                measurement = run_load(srv, clients, channels, seconds, warmup_s, rpc="noop")
                measurement.name = "gRPC no-op ceiling"
                ceiling.append(measurement)
                log(f"[{config.key}] no-op (Health/Check x3) {_describe(measurement)}")
        profile_text = ""
        if profile:
            profile_text = profile_config(config, srv, kept_concurrent.channels, seconds, warmup_s)
    return {
        "config": config.key,
        "runs": runs,
        "kept": [runs[0], kept_concurrent, two_rpc],
        "ceiling": ceiling,
        "profile": profile_text,
    }


def profile_config(
    config: Config, srv: servers.ServerProcess, channels: int, seconds: float, warmup_s: float
) -> str:
    """One more 8-client run with py-spy sampling the server (wall clock and GIL holders)."""
    spy = servers.py_spy_path()
    if spy is None:
        return profile_with_cprofile(config, channels, seconds, warmup_s)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    outputs = {
        "wall clock, all threads (--idle)": RESULTS_DIR / f"profile-{config.key}-wall.txt",
        "GIL holder only (--gil)": RESULTS_DIR / f"profile-{config.key}-gil.txt",
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

    measurement = run_load(srv, CONCURRENT_CLIENTS, channels, seconds, warmup_s, attach)
    log(f"[{config.key}] profiled run (py-spy attached): {_describe(measurement)}")
    sections = [f"profiled run: {_describe(measurement)}"]
    for (title, path), recorder in zip(outputs.items(), recorders, strict=False):
        sections.append(f"-- {title}: {path.relative_to(servers.REPO_ROOT)}")
        if not path.exists():
            sections.append(f"py-spy wrote nothing: {recorder.log.strip()[-1000:]}")
        sections.append(profile_report.summarise_py_spy(path))
    return "\n".join(sections)


def profile_with_cprofile(config: Config, channels: int, seconds: float, warmup_s: float) -> str:
    """Fallback without py-spy: a fresh server under `python -m cProfile` (main thread only)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"profile-{config.key}.pstats"
    path.unlink(missing_ok=True)
    with (
        servers.temp_dir(f"bench-{config.key}-prof-") as data_dir,
        server_for(config, data_dir, cprofile_to=path) as srv,
    ):
        measurement = run_load(srv, CONCURRENT_CLIENTS, channels, seconds, warmup_s)
    # Leaving the block stopped the server with SIGTERM, which writes the stats.
    return (
        f"profiled run (cProfile, main thread only): {_describe(measurement)}\n"
        + profile_report.summarise_cprofile(path)
    )


# -- floors -----------------------------------------------------------------------------------


def measure_floors(
    keys: list[str], seconds: float, postgres_ok: bool
) -> dict[str, Measurement | None]:
    floors: dict[str, Measurement | None] = {}
    wanted_syncs = sorted(
        {c.sqlite_sync for c in CONFIGS if c.key in keys}, key=lambda s: s != "FULL"
    )
    for sync in wanted_syncs:
        floors[sync] = baseline.sqlite_floor(sync, seconds)  # type: ignore[arg-type]
        log(f"[floor] {_floor_text(floors[sync])}")
    if "postgres" in keys and postgres_ok:
        with servers.postgres_schema() as url:
            floors["postgres"] = baseline.postgres_floor(url, seconds)
        log(f"[floor] {_floor_text(floors['postgres'])}")
    return floors


def _floor_text(m: Measurement | None) -> str:
    if m is None:
        return "(none)"
    return f"{m.name}: {m.cycles_per_s:,.0f} cycles/s, p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms"


# -- report -----------------------------------------------------------------------------------

_HEADER = (
    f"{'configuration':<30}{'clients':>8}{'ch':>4}{'cycles/s':>11}{'RPCs/s':>11}"
    f"{'p50 ms':>9}{'p99 ms':>9}{'srv CPU':>9}{'lg CPU':>8}  ratio vs floor"
)


def _ratio(value: float, floor: Measurement | None, label: str) -> str:
    if floor is None or floor.cycles_per_s <= 0:
        return "n/a"
    return f"{value / floor.cycles_per_s:.3f} x {label}"


def table_rows(
    results: list[dict[str, Any]], floors: dict[str, Measurement | None]
) -> list[tuple[Measurement, str, str]]:
    """(measurement, configuration label, ratio text) in print order."""
    rows: list[tuple[Measurement, str, str]] = []
    for sync in ("FULL", "NORMAL"):
        floor = floors.get(sync)
        if floor is not None:
            rows.append((floor, f"raw sqlite3 {sync} floor", _ratio(floor.cycles_per_s, floor, "")))
    pg_floor = floors.get("postgres")
    if pg_floor is not None:
        rows.append(
            (
                pg_floor,
                "raw psycopg2 floor",
                _ratio(pg_floor.cycles_per_s, floors.get("FULL"), "sqlite FULL floor"),
            )
        )
    for result in results:
        config = next(c for c in CONFIGS if c.key == result["config"])
        floor = floors.get(config.sqlite_sync)
        for m in result["kept"]:
            ratio = _ratio(m.cycles_per_s, floor, f"sqlite {config.sqlite_sync} floor")
            if config.key == "postgres":
                ratio += "; " + _ratio(m.cycles_per_s, pg_floor, "psycopg2 floor")
            rows.append((m, f"{m.name} (gRPC)", ratio))
    for result in results:
        for m in result["ceiling"]:
            rows.append((m, "gRPC no-op (3x Health/Check)", "no database: gRPC ceiling"))
    return rows


def render_table(rows: list[tuple[Measurement, str, str]]) -> str:
    lines = [_HEADER, "-" * len(_HEADER)]
    for m, label, ratio in rows:
        channels = str(m.channels) if m.channels else "-"
        server_cpu = _percent(m.extra.get("server_cpu_util"))
        loadgen_cpu = _percent(m.extra.get("loadgen_cpu_util"))
        lines.append(
            f"{label:<30}{m.clients:>8}{channels:>4}{m.cycles_per_s:>11,.1f}"
            f"{m.rpcs_per_s:>11,.1f}{m.p50_ms:>9.2f}{m.p99_ms:>9.2f}"
            f"{server_cpu:>9}{loadgen_cpu:>8}  {ratio.strip()}"
        )
    lines.append(
        "(ch: gRPC channels; srv CPU / lg CPU: server / load-generator process CPU "
        "in % of one core; raw floors run in-process)"
    )
    return "\n".join(lines)


def _percent(value: Any) -> str:
    return f"{100 * float(value):.0f}%" if isinstance(value, int | float) else "-"


def machine_info() -> dict[str, Any]:
    import grpc

    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "grpcio": grpc.__version__,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Delivery ledger cycle (record -> attempting -> delivered) over gRPC.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="short runs (~3 s per measurement) for CI checks"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated subset of: " + ",".join(c.key for c in CONFIGS),
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after each configuration, one more 8-client run with the server profiled "
        "(py-spy if installed, else cProfile)",
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS_DIR / "latest.json", help="JSON results file"
    )
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.only.split(",") if k.strip()] or [c.key for c in CONFIGS]
    unknown = sorted(set(keys) - {c.key for c in CONFIGS})
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}")
    args.keys = [c.key for c in CONFIGS if c.key in keys]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seconds, warmup_s = (3.0, 1.0) if args.quick else (10.0, 2.0)
    started = datetime.datetime.now(datetime.UTC)
    notes: list[str] = []
    keys: list[str] = args.keys
    machine = machine_info()

    postgres_ok = True
    if "postgres" in keys:
        reason = servers.postgres_unreachable_reason()
        if reason is not None:
            postgres_ok = False
            keys = [k for k in keys if k != "postgres"]
            notes.append(f"postgres skipped: {reason}")
            log(f"note: postgres skipped: {reason}")
        else:
            machine["postgres"] = servers.postgres_version()

    log(
        f"bench: {'quick' if args.quick else 'full'} run, {seconds:g} s per measurement "
        f"(+{warmup_s:g} s warm-up), configurations: {', '.join(keys) or 'none'}"
    )
    floors = measure_floors(keys, seconds, postgres_ok)
    results = [
        measure_config(c, seconds, warmup_s, args.profile, noop=(i == 0))
        for i, c in enumerate(c for c in CONFIGS if c.key in keys)
    ]

    rows = table_rows(results, floors)
    print(render_table(rows))
    for m, label, _ in rows:
        if m.errors:
            notes.append(f"{label}, {m.clients} clients: {m.errors} error(s): {m.extra}")

    target: dict[str, Any] = {"line": TARGET_LINE, "measured": None, "met": None}
    full = next((r for r in results if r["config"] == "sqlite-full"), None)
    print()
    if full is not None:
        concurrent = full["kept"][1]
        target["measured"] = round(concurrent.cycles_per_s, 1)
        target["met"] = concurrent.cycles_per_s >= TARGET_CYCLES_PER_S and concurrent.errors == 0
        verdict = "MET" if target["met"] else "NOT MET"
        print(f"{TARGET_LINE}: {verdict} ({concurrent.cycles_per_s:,.0f} cycles/s measured)")
    else:
        print(f"{TARGET_LINE}: not measured (sqlite-full not selected)")
    for note in notes:
        print(f"note: {note}")
    for result in results:
        if result["profile"]:
            print(f"\n== profile of the server, {result['config']} ==\n{result['profile']}")

    report = {
        "started": started.isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "seconds_per_measurement": seconds,
        "warmup_s": warmup_s,
        "machine": machine,
        "floors": {key: m.to_json() if m else None for key, m in floors.items()},
        "configurations": [
            {
                "config": r["config"],
                "runs": [m.to_json() for m in r["runs"]],
                "kept": [m.to_json() for m in r["kept"]],
                "noop_ceiling": [m.to_json() for m in r["ceiling"]],
                "profile": r["profile"],
            }
            for r in results
        ],
        "table": [
            {"configuration": label, "ratio": ratio, **m.to_json()} for m, label, ratio in rows
        ],
        "target": target,
        "notes": notes,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    log(f"results written to {args.output}")
    return 0
