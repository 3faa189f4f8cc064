"""`python -m bench`: the delivery-cycle benchmark, the claim of a dead instance's
orphans, then the SessionService's (see `bench.session_runner`), open-loop latency
(`bench.latency`) and restart / rewind (`bench.timetravel`): floors, servers, load,
tables, plots (`bench.plots`), JSON.

For each configuration (SQLite synchronous=FULL, SQLite NORMAL, Postgres) a
fresh DeliveryService process is started on 127.0.0.1 and loaded by a separate
load-generator process (`bench.delivery_cycle`) with 1 client, then 8 clients
over 1 and over 2 channels (the faster is kept), then 32 clients over the kept
number of channels. Raw driver floors of the same three transactions are
measured in the same run for the ratios. Then, on a fresh server of each
configuration, `bench.orphans` seeds a dead instance's backlog and
`bench.claim_load` claims it all, next to raw in-process claim floors.

With the `bench` extra installed, the in-process peers (`bench.peers`: ADK,
LangGraph, OpenAI Agents, procrastinate) are measured in the same run, and every
run ends with issue 15's goal lines (`bench.peers.goals`): ratio and MET / NOT MET,
or why a figure is missing.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import (
    against,
    baseline,
    db_latency,
    feature_costs,
    harness,
    latency,
    orphans,
    peers,
    plots,
    profile_report,
    servers,
    session_runner,
    timetravel,
)
from bench.harness import RESULTS_DIR, log
from bench.peers import goals
from bench.stats import Measurement
from switchboard.database import SqliteSync

TARGET_CYCLES_PER_S = 1500.0
TARGET_LINE = "target: >= 1,500 cycles/s over gRPC on SQLite FULL (8 clients)"
CONCURRENT_CLIENTS = 8
MANY_CLIENTS = 32


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    sqlite_sync: SqliteSync  # the floor it is compared with (Postgres: the FULL floor)


CONFIGS = (
    Config("sqlite-full", "sqlite FULL", "FULL"),
    Config("sqlite-normal", "sqlite NORMAL", "NORMAL"),
    Config("postgres", "postgres", "FULL"),
)


# -- one load-generator run -------------------------------------------------------------------


def run_load(
    server: servers.ServerProcess,
    clients: int,
    channels: int,
    seconds: float,
    warmup_s: float,
    during: harness.During | None = None,
    rpc: str = "cycle",
) -> Measurement:
    """One `bench.delivery_cycle` process against `server`; server CPU sampled around it.

    `during`, when given, is called right after the load generator starts and
    returns a function called once it has finished (used to attach a profiler).
    """
    arguments = [
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
    return harness.run_loadgen(
        server, "bench.delivery_cycle", arguments, warmup_s + seconds + 90, during
    )


_describe = harness.describe


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
    config: Config,
    seconds: float,
    warmup_s: float,
    profile: bool,
    noop: bool,
    open_loop: latency.OpenLoopPlan | None = None,
) -> dict[str, Any]:
    """1 client, then 8 clients over 1 and 2 channels (the faster 8-client run is kept),
    then 32 clients over the kept number of channels.

    With `noop`, the same server then answers no-op cycles (3 x Health/Check) with
    1 and 8 clients: the ceiling of the gRPC layer alone. With `open_loop`, the
    open-loop latency runs follow on the same server.
    """
    runs: list[Measurement] = []
    ceiling: list[Measurement] = []
    open_runs: list[Measurement] = []
    with servers.temp_dir(f"bench-{config.key}-") as data_dir, server_for(config, data_dir) as srv:
        log(f"[{config.key}] server pid {srv.pid} on {srv.address}")
        for clients, channels in ((1, 1), (CONCURRENT_CLIENTS, 1), (CONCURRENT_CLIENTS, 2)):
            measurement = run_load(srv, clients, channels, seconds, warmup_s)
            measurement.name = config.label
            runs.append(measurement)
            log(f"[{config.key}] {_describe(measurement)}")
        kept_concurrent = max(runs[1:], key=lambda m: m.cycles_per_s)
        many = run_load(srv, MANY_CLIENTS, kept_concurrent.channels, seconds, warmup_s)
        many.name = config.label
        runs.append(many)
        log(f"[{config.key}] {_describe(many)}")
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
        if open_loop is not None:
            open_runs = latency.measure(
                srv, "delivery", config.key, config.label, open_loop, kept_concurrent.channels
            )
        profile_text = ""
        if profile:
            profile_text = profile_config(config, srv, kept_concurrent.channels, seconds, warmup_s)
    return {
        "config": config.key,
        "runs": runs,
        "kept": [runs[0], kept_concurrent, many, two_rpc],
        "ceiling": ceiling,
        "open_loop": open_runs,
        "profile": profile_text,
    }


def profile_config(
    config: Config, srv: servers.ServerProcess, channels: int, seconds: float, warmup_s: float
) -> str:
    """One more 8-client run with py-spy sampling the server (wall clock and GIL holders)."""
    spy = servers.py_spy_path()
    if spy is None:
        return profile_with_cprofile(config, channels, seconds, warmup_s)
    return harness.py_spy_profile(
        config.key,
        srv,
        spy,
        lambda attach: run_load(srv, CONCURRENT_CLIENTS, channels, seconds, warmup_s, attach),
        seconds,
        warmup_s,
    )


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
        floors[sync] = baseline.sqlite_floor(sync, seconds)
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
        server_cpu = harness.percent(m.extra.get("server_cpu_util"))
        loadgen_cpu = harness.percent(m.extra.get("loadgen_cpu_util"))
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


def delivery_goal_sides(
    results: list[dict[str, Any]],
    floors: dict[str, Measurement | None],
    missing: dict[str, str],
) -> dict[str, goals.Side]:
    """The delivery figures of issue 15's goal lines: the send path at 8 clients and the raw
    floor, on SQLite FULL and on Postgres. `missing` (by configuration key) says why a
    configuration did not run."""
    sides: dict[str, goals.Side] = {}
    for config, suffix, floor_key, floor_name in (
        ("sqlite-full", "sqlite", "FULL", "raw sqlite3 FULL floor"),
        ("postgres", "postgres", "postgres", "raw psycopg2 floor"),
    ):
        name = f"delivery cycles, 8 clients ({config})"
        result = next((r for r in results if r["config"] == config), None)
        floor = floors.get(floor_key)
        if result is None:
            sides[f"delivery-8-{suffix}"] = goals.Side(name, missing=missing[config])
        else:
            eight: Measurement = result["kept"][1]
            sides[f"delivery-8-{suffix}"] = goals.Side(
                name, eight.cycles_per_s, errors=eight.errors
            )
        sides[f"delivery-floor-{suffix}"] = (
            goals.Side(floor_name, floor.cycles_per_s)
            if floor is not None
            else goals.Side(floor_name, missing=missing[config])
        )
    return sides


def _why_missing(key: str, keys: list[str], postgres_reason: str | None) -> str:
    """Why configuration `key` has no figures in this run."""
    if key in POSTGRES_KEYS and postgres_reason is not None:
        return f"skipped (postgres: {postgres_reason})"
    return f"not measured ({key} not selected)" if key not in keys else "not measured"


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


ALL_KEYS = (
    *(c.key for c in CONFIGS),
    *(c.key for c in session_runner.SESSION_CONFIGS),
    "timetravel",
    "db-latency",
    "feature-costs",
    "peers",
)
POSTGRES_KEYS = ("postgres", "session-postgres", "db-latency")
#: Parts of the run `--skip` can leave out.
PARTS = ("orphans", "open-loop", "plots")


def _listed(parser: argparse.ArgumentParser, text: str, allowed: tuple[str, ...]) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = sorted(set(items) - set(allowed))
    if unknown:
        parser.error(f"unknown name(s) {', '.join(unknown)}: use {', '.join(allowed)}")
    return items


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Delivery ledger cycles and orphan claims, SessionService appends and "
        "next-turn loads over gRPC against in-process database floors; open-loop latency "
        "against no-op calls; restart and rewind against log size; in-process peers and the "
        "goal lines; plots.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="short runs (~3 s per measurement) for CI checks"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated subset of: " + ",".join(ALL_KEYS),
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated parts to leave out: " + ",".join(PARTS),
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
    parser.add_argument(
        "--against",
        metavar="REV",
        default="",
        help="also run the appends and delivery cycles of an earlier release (a commit, tag "
        "or branch) beside this tree's, alternating, and print the ratios (bench.against)",
    )
    args = parser.parse_args(argv)
    keys = _listed(parser, args.only, ALL_KEYS) or list(ALL_KEYS)
    args.keys = [key for key in ALL_KEYS if key in keys]
    args.skip = set(_listed(parser, args.skip, PARTS))
    return args


def goal_verdicts(
    keys: list[str],
    postgres_reason: str | None,
    results: list[dict[str, Any]],
    floors: dict[str, Measurement | None],
    session_results: list[dict[str, Any]],
    peer_results: list[peers.PeerResult],
) -> list[goals.Verdict]:
    """Issue 15's goal lines from this run's figures (missing ones say why)."""
    missing = {key: _why_missing(key, keys, postgres_reason) for key in ("sqlite-full", "postgres")}
    sides = {
        **delivery_goal_sides(results, floors, missing),
        **session_runner.goal_sides(
            session_results, _why_missing("session-sqlite-full", keys, postgres_reason)
        ),
    }
    if "peers" in keys:
        sides.update(goals.peer_sides(peer_results))
    else:
        for side in goals.PEER_SIDES:
            sides[side] = goals.Side(side, missing="not measured (peers not selected)")
    return goals.judge_all(sides)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seconds, warmup_s = (3.0, 1.0) if args.quick else (10.0, 2.0)
    started = datetime.datetime.now(datetime.UTC)
    notes: list[str] = []
    keys: list[str] = args.keys
    machine = machine_info()
    machine["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    if machine["loadavg_at_start"][0] > 0.5:
        notes.append(
            f"the machine was busy when the run started: load average "
            f"{machine['loadavg_at_start'][0]:.2f} (1 min) on {os.cpu_count()} cores; "
            "other processes compete with the servers and load generators"
        )

    postgres_ok = True
    postgres_reason: str | None = None
    if any(key in keys for key in (*POSTGRES_KEYS, "peers")):
        reason = servers.postgres_unreachable_reason()
        postgres_reason = reason
        if reason is not None:
            postgres_ok = False
            keys = [k for k in keys if k not in POSTGRES_KEYS]
            notes.append(f"postgres skipped: {reason}")
            log(f"note: postgres skipped: {reason}")
        else:
            machine["postgres"] = servers.postgres_version()

    log(
        f"bench: {'quick' if args.quick else 'full'} run, {seconds:g} s per measurement "
        f"(+{warmup_s:g} s warm-up), configurations: {', '.join(keys) or 'none'}"
        + (f"; skipping {', '.join(sorted(args.skip))}" if args.skip else "")
    )
    delivery_configs = [c for c in CONFIGS if c.key in keys]
    session_configs = [c for c in session_runner.SESSION_CONFIGS if c.key in keys]
    delivery_keys = [c.key for c in delivery_configs]
    session_keys = [c.key for c in session_configs]
    open_loop = None if "open-loop" in args.skip else latency.open_loop_plan(args.quick)

    # -- delivery ------------------------------------------------------------------------
    floors = measure_floors(delivery_keys, seconds, postgres_ok)
    results = [
        measure_config(
            c,
            seconds,
            warmup_s,
            args.profile,
            noop=(i == 0),
            open_loop=open_loop if i == 0 else None,
        )
        for i, c in enumerate(delivery_configs)
    ]
    # -- delivery: claim of a dead instance's orphans -----------------------------------
    orphan_count = orphans.orphan_count(args.quick)
    orphan_floors: dict[str, Measurement] = {}
    orphan_results: list[tuple[str, str, Measurement]] = []
    if delivery_configs and "orphans" not in args.skip:
        orphan_floors = orphans.measure_floors(
            sorted({c.sqlite_sync for c in delivery_configs if c.key != "postgres"}),
            "postgres" in delivery_keys,
            orphan_count,
        )
        for config in delivery_configs:
            measurement = orphans.measure_config(
                config.key,
                config.label,
                config.sqlite_sync,
                functools.partial(server_for, config),
                orphan_count,
            )
            orphan_results.append((config.label, config.sqlite_sync, measurement))
    # -- sessions ------------------------------------------------------------------------
    plan = session_runner.turn_plan(args.quick)
    session_floors = session_runner.measure_floors(session_keys, seconds)
    session_results = [
        session_runner.measure_config(
            c,
            seconds,
            warmup_s,
            plan,
            args.profile,
            noop=(i == 0),
            open_loop=open_loop if i == 0 else None,
        )
        for i, c in enumerate(session_configs)
    ]
    # -- the in-process peers (bench/peers), same payload ------------------------------
    peer_results: list[peers.PeerResult] = []
    if "peers" in keys:
        peer_results = peers.measure_all(
            seconds, warmup_s, plan.repetitions // 10, postgres_reason, log
        )
    # -- restart and rewind --------------------------------------------------------------
    travel: dict[str, Any] | None = None
    if "timetravel" in keys:
        travel = timetravel.measure(args.quick, say=lambda line: log(f"[timetravel] {line}"))
    # -- throughput and open-loop latency against database latency (Postgres behind a
    # delaying proxy) --------------------------------------------------------------------
    latency_points: list[db_latency.Point] = []
    if "db-latency" in keys:
        latency_points = db_latency.measure(seconds, warmup_s, open_loop)

    # -- what the access log and request ids cost, each as its own ratio ---------------
    costs: list[feature_costs.Cost] = []
    if "feature-costs" in keys:
        costs = feature_costs.measure(seconds, warmup_s)

    # -- this tree against an earlier release ---------------------------------------------
    against_pairs: list[against.Pair] = []
    if args.against:
        backends = [k for k in ("sqlite-full", "postgres") if k != "postgres" or postgres_ok]
        against_pairs = against.compare(args.against, backends, seconds, warmup_s)

    # -- report --------------------------------------------------------------------------
    rows = table_rows(results, floors)
    session_rows = session_runner.table_rows(session_results, session_floors)
    orphan_rows = orphans.table_rows(orphan_results, orphan_floors)
    open_runs = [m for r in results + session_results for m in r["open_loop"]]
    open_rows = latency.table_rows(open_runs)
    for m, label, _ in rows + session_rows + orphan_rows:
        if m.errors:
            notes.append(f"{label}, {m.clients} clients: {m.errors} error(s): {m.extra}")
    for m, label, _ in open_rows + db_latency.open_rows(latency_points):
        if m.errors:
            notes.append(
                f"open loop {m.name}, {label} at {m.extra['offered_rate']:g}/s: {m.errors} "
                f"error(s), first: {m.extra.get('first_error', '')}"
            )

    target: dict[str, Any] = {"line": TARGET_LINE, "measured": None, "met": None}
    sections: list[str] = []
    if delivery_keys:
        lines = ["== DeliveryService: send-path cycles ==", render_table(rows), ""]
        full = next((r for r in results if r["config"] == "sqlite-full"), None)
        if full is not None:
            concurrent = full["kept"][1]
            target["measured"] = round(concurrent.cycles_per_s, 1)
            target["met"] = (
                concurrent.cycles_per_s >= TARGET_CYCLES_PER_S and concurrent.errors == 0
            )
            verdict = "MET" if target["met"] else "NOT MET"
            lines.append(
                f"{TARGET_LINE}: {verdict} ({concurrent.cycles_per_s:,.0f} cycles/s measured)"
            )
        else:
            lines.append(f"{TARGET_LINE}: not measured (sqlite-full not selected)")
        sections.append("\n".join(lines))
    if orphan_rows:
        sections.append(
            f"== DeliveryService: claim of {orphan_count:,} orphans (ClaimRecoverable, "
            f"limit {orphans.BATCH:,}) ==\n" + orphans.render_table(orphan_rows)
        )
    session_target_records: list[dict[str, Any]] = []
    if session_keys:
        target_lines, session_target_records = session_runner.targets(session_results)
        sections.append(
            "\n".join(
                [
                    "== SessionService: appends and next-turn loads ==",
                    session_runner.render_table(session_rows),
                    "",
                    *target_lines,
                ]
            )
        )
    if open_rows and open_loop is not None:
        sections.append(
            "== Latency under a fixed open-loop load ==\n"
            + latency.render_table(open_rows, open_loop)
        )
    if travel is not None:
        sections.append(
            "== SessionService: restart and global rewind against events and sessions ==\n"
            + timetravel.render(travel)
        )
    if latency_points:
        sections.append(
            "== Postgres: appends and delivery cycles against added database round trip ==\n"
            + db_latency.render(latency_points, open_loop)
        )
    if costs:
        sections.append(
            "== What the access log and request ids cost (each against neither) ==\n"
            + feature_costs.render(costs)
        )
    if against_pairs:
        sections.append("== " + against.render(args.against, against_pairs))
    if peer_results:
        sections.append(
            "== In-process peers (same run, one ~100-byte user message per durable write) ==\n"
            + peers.render_table(peer_results)
        )
    verdicts = goal_verdicts(keys, postgres_reason, results, floors, session_results, peer_results)
    sections.append(
        "== Goals (issue 15): Switchboard over gRPC against peers and floors of this run ==\n"
        + "\n".join(v.line for v in verdicts)
    )
    print("\n\n".join(sections))
    for note in notes:
        print(f"note: {note}")
    for result in results + session_results:
        if result["profile"]:
            print(f"\n== profile of the server, {result['config']} ==\n{result['profile']}")

    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report = {
        "started": started.isoformat(timespec="seconds"),
        "elapsed_s": round((datetime.datetime.now(datetime.UTC) - started).total_seconds(), 1),
        "mode": "quick" if args.quick else "full",
        "seconds_per_measurement": seconds,
        "warmup_s": warmup_s,
        "skipped": sorted(args.skip),
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
        "orphans": orphans.report(orphan_count, orphan_results, orphan_floors, orphan_rows),
        "session": session_runner.report(
            session_results, session_floors, session_rows, session_target_records, plan
        ),
        "open_loop": latency.report(open_runs, open_rows, open_loop) if open_loop else None,
        "timetravel": travel,
        "db_latency": db_latency.report(latency_points, open_loop),
        "feature_costs": feature_costs.report(costs),
        "against": against.to_json(args.against, against_pairs) if against_pairs else None,
        "peers": [result.to_json() for result in peer_results],
        "goals": [verdict.to_json() for verdict in verdicts],
        "notes": notes,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    log(f"results written to {args.output}")
    if "plots" not in args.skip:
        written = plots.write_plots(report, args.output.parent)
        print("\nplots written:" if written else "\nplots: nothing to plot")
        for path in written:
            print(f"  {path}")
    return 0
