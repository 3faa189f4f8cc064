"""The SessionService benchmark: appends and next-turn loads over gRPC, against a peewee floor.

For each configuration (SQLite synchronous=FULL, SQLite NORMAL, Postgres) a
fresh `python -m switchboard_cli serve session` process is started on 127.0.0.1
and loaded by a separate process (`bench.session_load`):

- AppendEvents, one 100-byte USER message per call, durable, with 1 client,
  with 8 clients over 1 and over 2 channels (the faster is kept), and with 32
  clients over the kept number of channels, each client on its own session;
- load-for-next-turn: GetSessionState + GetHistory(limit=50, newest=true) on a
  session seeded with 100 and 1,000 message events (10,000 too in full mode).

The in-process peewee floor (`bench.session_baseline`, one log-row INSERT per
transaction) of each configuration's backend and synchronous setting is
measured in the same run for the ratios. On the first configuration, the
open-loop latency runs of `bench.latency` follow.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness, latency, profile_report, servers, session_baseline
from bench.harness import RESULTS_DIR, log
from bench.peers.goals import Side
from bench.stats import Measurement
from switchboard.database import SqliteSync

CONCURRENT_CLIENTS = 8
MANY_CLIENTS = 32
TARGET_APPENDS_PER_S = 2500.0
TARGET_APPENDS_LINE = "target: >= 2,500 appends/s with 8 clients on SQLite FULL"
TARGET_TURN_EVENTS = 1000
TARGET_TURN_MS = 3.0
TARGET_TURN_LINE = (
    "target: load-for-next-turn <= 3 ms at 1,000 events "
    "(Google ADK get_session beside it: see the goal lines)"
)
LOADGEN = "bench.session_load"


@dataclass(frozen=True)
class SessionConfig:
    key: str
    label: str
    backend: str  # "sqlite" or "postgres"
    sqlite_sync: SqliteSync = "FULL"  # SQLite only


SESSION_CONFIGS = (
    SessionConfig("session-sqlite-full", "sqlite FULL", "sqlite"),
    SessionConfig("session-sqlite-normal", "sqlite NORMAL", "sqlite", "NORMAL"),
    SessionConfig("session-postgres", "postgres", "postgres"),
)


@dataclass(frozen=True)
class TurnPlan:
    """Session sizes for load-for-next-turn, and how many loads are timed at each."""

    sizes: tuple[int, ...]
    repetitions: int
    warmup_reps: int


def turn_plan(quick: bool) -> TurnPlan:
    if quick:
        return TurnPlan(sizes=(100, 1000), repetitions=200, warmup_reps=20)
    return TurnPlan(sizes=(100, 1000, 10_000), repetitions=500, warmup_reps=50)


# -- load-generator runs ----------------------------------------------------------------------


def run_appends(
    srv: servers.ServerProcess,
    clients: int,
    channels: int,
    seconds: float,
    warmup_s: float,
    during: harness.During | None = None,
    mode: str = "append",
) -> Measurement:
    arguments = [
        "--mode",
        mode,
        "--clients",
        str(clients),
        "--channels",
        str(channels),
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup_s),
    ]
    # Setup (CreateAgent, one ResolveSession per client) comes before the clock starts.
    return harness.run_loadgen(srv, LOADGEN, arguments, warmup_s + seconds + 120, during)


def run_turns(srv: servers.ServerProcess, events: int, plan: TurnPlan) -> Measurement:
    arguments = [
        "--mode",
        "turn",
        "--events",
        str(events),
        "--repetitions",
        str(plan.repetitions),
        "--warmup-reps",
        str(plan.warmup_reps),
    ]
    # Seeding is outside the timed loads, so the server's CPU is not attributed here.
    return harness.run_loadgen(srv, LOADGEN, arguments, 600, server_cpu=False)


def _turn_text(m: Measurement) -> str:
    x = m.extra
    return (
        f"{x.get('events', 0):,} events: p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, "
        f"mean {m.mean_ms:.2f} ms (GetSessionState p50 {x.get('state_p50_ms', 0):.2f} ms + "
        f"GetHistory p50 {x.get('history_p50_ms', 0):.2f} ms); seeded with "
        f"{x.get('seed_calls', 0)} AppendEvents calls in {x.get('seed_s', 0):.2f} s"
    )


# -- one configuration ------------------------------------------------------------------------


@contextmanager
def server_for(
    config: SessionConfig, data_dir: Path, cprofile_to: Path | None = None
) -> Iterator[servers.ServerProcess]:
    if config.backend == "postgres":
        with (
            servers.postgres_schema() as url,
            servers.running_server(
                url, data_dir, cprofile_to=cprofile_to, service="session"
            ) as server,
        ):
            yield server
    else:
        url = f"sqlite:///{data_dir / 'session.sqlite3'}"
        with servers.running_server(
            url, data_dir, config.sqlite_sync, cprofile_to, "session"
        ) as server:
            yield server


def measure_config(
    config: SessionConfig,
    seconds: float,
    warmup_s: float,
    plan: TurnPlan,
    profile: bool,
    noop: bool,
    open_loop: latency.OpenLoopPlan | None = None,
) -> dict[str, Any]:
    """Appends with 1 client, then 8 clients over 1 and 2 channels (the faster is kept),
    then 32 clients over the kept number of channels; with `noop`, 1 and 8 clients of
    Health/Check (the gRPC ceiling); with `open_loop`, the open-loop latency runs; then
    the next-turn loads at each size of `plan`, smallest first, all on the same server."""
    runs: list[Measurement] = []
    ceiling: list[Measurement] = []
    turns: list[Measurement] = []
    open_runs: list[Measurement] = []
    profile_text = ""
    with (
        servers.temp_dir(f"bench-{config.key}-") as data_dir,
        server_for(config, data_dir) as srv,
    ):
        log(f"[{config.key}] server pid {srv.pid} on {srv.address}")
        for clients, channels in ((1, 1), (CONCURRENT_CLIENTS, 1), (CONCURRENT_CLIENTS, 2)):
            measurement = run_appends(srv, clients, channels, seconds, warmup_s)
            measurement.name = f"{config.label} AppendEvents"
            runs.append(measurement)
            log(f"[{config.key}] appends {harness.describe(measurement, 'appends')}")
        kept_concurrent = max(runs[1:], key=lambda m: m.cycles_per_s)
        many = run_appends(srv, MANY_CLIENTS, kept_concurrent.channels, seconds, warmup_s)
        many.name = f"{config.label} AppendEvents"
        runs.append(many)
        log(f"[{config.key}] appends {harness.describe(many, 'appends')}")
        if noop:
            for clients in (1, CONCURRENT_CLIENTS):
                channels = 1 if clients == 1 else kept_concurrent.channels
                measurement = run_appends(srv, clients, channels, seconds, warmup_s, mode="noop")
                measurement.name = "gRPC no-op ceiling"
                ceiling.append(measurement)
                log(f"[{config.key}] no-op (1 Health/Check) {harness.describe(measurement, 'ops')}")
        if open_loop is not None:
            open_runs = latency.measure(
                srv, "session", config.key, config.label, open_loop, kept_concurrent.channels
            )
        for events in plan.sizes:
            measurement = run_turns(srv, events, plan)
            measurement.name = f"{config.label} next-turn load"
            turns.append(measurement)
            log(f"[{config.key}] next-turn load at {_turn_text(measurement)}")
        if profile:
            profile_text = profile_config(config, srv, kept_concurrent.channels, seconds, warmup_s)
    return {
        "config": config.key,
        "runs": runs,
        "kept": [runs[0], kept_concurrent, many],
        "ceiling": ceiling,
        "turns": turns,
        "open_loop": open_runs,
        "profile": profile_text,
    }


def profile_config(
    config: SessionConfig,
    srv: servers.ServerProcess,
    channels: int,
    seconds: float,
    warmup_s: float,
) -> str:
    """One more 8-client append run with the server profiled (py-spy, else cProfile)."""
    spy = servers.py_spy_path()
    if spy is not None:
        return harness.py_spy_profile(
            config.key,
            srv,
            spy,
            lambda attach: run_appends(
                srv, CONCURRENT_CLIENTS, channels, seconds, warmup_s, attach
            ),
            seconds,
            warmup_s,
            unit="appends",
        )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"profile-{config.key}.pstats"
    path.unlink(missing_ok=True)
    with (
        servers.temp_dir(f"bench-{config.key}-prof-") as data_dir,
        server_for(config, data_dir, cprofile_to=path) as profiled,
    ):
        measurement = run_appends(profiled, CONCURRENT_CLIENTS, channels, seconds, warmup_s)
    # Leaving the block stopped the server with SIGTERM, which writes the stats.
    return (
        f"profiled run (cProfile, main thread only): {harness.describe(measurement, 'appends')}\n"
        + profile_report.summarise_cprofile(path)
    )


# -- floors -----------------------------------------------------------------------------------


def measure_floors(keys: list[str], seconds: float) -> dict[str, Measurement | None]:
    """The peewee insert floor of each selected configuration's backend, by configuration key."""
    floors: dict[str, Measurement | None] = {}
    for config in SESSION_CONFIGS:
        if config.key not in keys:
            continue
        if config.backend == "postgres":
            with servers.postgres_schema() as url:
                floors[config.key] = session_baseline.postgres_floor(url, seconds)
        else:
            floors[config.key] = session_baseline.sqlite_floor(config.sqlite_sync, seconds)
        log(f"[floor] {_floor_text(floors[config.key])}")
    return floors


def _floor_text(m: Measurement | None) -> str:
    if m is None:
        return "(none)"
    return (
        f"{m.name} floor: {m.cycles_per_s:,.0f} inserts/s, "
        f"p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms"
    )


# -- report -----------------------------------------------------------------------------------

_HEADER = (
    f"{'configuration':<34}{'clients':>8}{'ch':>4}{'ops/s':>11}{'RPCs/s':>11}"
    f"{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'srv CPU':>9}{'lg CPU':>8}  ratio vs floor / notes"
)


def _ratio(value: float, floor: Measurement | None) -> str:
    if floor is None or floor.cycles_per_s <= 0:
        return "n/a"
    return f"{value / floor.cycles_per_s:.3f} x {floor.name} floor"


def table_rows(
    results: list[dict[str, Any]], floors: dict[str, Measurement | None]
) -> list[tuple[Measurement, str, str]]:
    """(measurement, configuration label, ratio or note) in print order."""
    rows: list[tuple[Measurement, str, str]] = []
    for floor in floors.values():
        if floor is not None:
            rows.append((floor, f"{floor.name} floor", "1 INSERT per transaction"))
    for result in results:
        floor = floors.get(result["config"])
        for m in result["kept"]:
            rows.append((m, f"{m.name} (gRPC)", _ratio(m.cycles_per_s, floor)))
    for result in results:
        for m in result["ceiling"]:
            rows.append((m, "gRPC no-op (1x Health/Check)", "no database: gRPC ceiling"))
    for result in results:
        for m in result["turns"]:
            x = m.extra
            rows.append(
                (
                    m,
                    f"{m.name.replace('next-turn load', 'load')} @{x.get('events', 0):,}",
                    f"state {x.get('state_p50_ms', 0):.2f} + history "
                    f"{x.get('history_p50_ms', 0):.2f} ms (p50)",
                )
            )
    return rows


def render_table(rows: list[tuple[Measurement, str, str]]) -> str:
    lines = [_HEADER, "-" * len(_HEADER)]
    for m, label, ratio in rows:
        channels = str(m.channels) if m.channels else "-"
        server_cpu = harness.percent(m.extra.get("server_cpu_util"))
        loadgen_cpu = harness.percent(m.extra.get("loadgen_cpu_util"))
        lines.append(
            f"{label:<34}{m.clients:>8}{channels:>4}{m.cycles_per_s:>11,.1f}"
            f"{m.rpcs_per_s:>11,.1f}{m.p50_ms:>9.2f}{m.p99_ms:>9.2f}{m.mean_ms:>9.2f}"
            f"{server_cpu:>9}{loadgen_cpu:>8}  {ratio.strip()}"
        )
    lines.append(
        "(ops/s: inserts (floors), appends (AppendEvents, 1 event of a 100-byte message), "
        "loads (@N: GetSessionState + GetHistory(limit=50, newest) on a session of N "
        "message events, one client); ch: gRPC channels; srv CPU / lg CPU: server / "
        "load-generator process CPU in % of one core; floors run in-process)"
    )
    return "\n".join(lines)


def targets(results: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The two target lines (MET / NOT MET) and their JSON records."""
    by_key = {r["config"]: r for r in results}
    lines: list[str] = []
    records: list[dict[str, Any]] = []

    full = by_key.get("session-sqlite-full")
    appends: dict[str, Any] = {"line": TARGET_APPENDS_LINE, "measured": None, "met": None}
    if full is not None:
        concurrent: Measurement = full["kept"][1]
        appends["measured"] = round(concurrent.cycles_per_s, 1)
        appends["met"] = concurrent.cycles_per_s >= TARGET_APPENDS_PER_S and not concurrent.errors
        verdict = "MET" if appends["met"] else "NOT MET"
        lines.append(
            f"{TARGET_APPENDS_LINE}: {verdict} ({concurrent.cycles_per_s:,.0f} appends/s measured, "
            f"{concurrent.channels} channel(s))"
        )
    else:
        lines.append(f"{TARGET_APPENDS_LINE}: not measured (session-sqlite-full not selected)")
    records.append(appends)

    turn: dict[str, Any] = {"line": TARGET_TURN_LINE, "measured_p50_ms": None, "met": None}
    others = []
    for result in results:
        for m in result["turns"]:
            if m.extra.get("events") != TARGET_TURN_EVENTS:
                continue
            if result is full:
                turn["measured_p50_ms"] = round(m.p50_ms, 3)
                turn["measured_p99_ms"] = round(m.p99_ms, 3)
                turn["measured_mean_ms"] = round(m.mean_ms, 3)
                turn["met"] = m.p50_ms <= TARGET_TURN_MS and not m.errors
            else:
                others.append(f"{m.name.split(' next-turn')[0]}: p50 {m.p50_ms:.2f} ms")
                turn[f"{result['config']}_p50_ms"] = round(m.p50_ms, 3)
    if turn["met"] is not None:
        also = f"; {', '.join(others)}" if others else ""
        lines.append(
            f"{TARGET_TURN_LINE}: {'MET' if turn['met'] else 'NOT MET'} on SQLite FULL "
            f"(p50 {turn['measured_p50_ms']:.2f} ms, p99 {turn['measured_p99_ms']:.2f} ms, "
            f"mean {turn['measured_mean_ms']:.2f} ms{also})"
        )
    else:
        measured_elsewhere = f" ({', '.join(others)})" if others else ""
        lines.append(f"{TARGET_TURN_LINE}: not measured on SQLite FULL{measured_elsewhere}")
    records.append(turn)
    return lines, records


def goal_sides(results: list[dict[str, Any]], missing: str) -> dict[str, Side]:
    """The SessionService's figures in issue 15's goal lines (`bench.peers.goals`), from
    SQLite FULL: appends at 1 and 8 clients, the next-turn load's p50 at 1,000 events.
    `missing` says why they are absent when session-sqlite-full did not run."""
    names = {
        "appends-1": "AppendEvents, 1 client",
        "appends-8": "AppendEvents, 8 clients",
        "turn-1000": f"load-for-next-turn p50 @{TARGET_TURN_EVENTS:,}",
    }
    full = next((r for r in results if r["config"] == "session-sqlite-full"), None)
    if full is None:
        return {key: Side(name, missing=missing) for key, name in names.items()}
    one, eight = full["kept"][0], full["kept"][1]
    sides = {
        "appends-1": Side(names["appends-1"], one.cycles_per_s, errors=one.errors),
        "appends-8": Side(names["appends-8"], eight.cycles_per_s, errors=eight.errors),
    }
    turn = next((m for m in full["turns"] if m.extra.get("events") == TARGET_TURN_EVENTS), None)
    sides["turn-1000"] = (
        Side(names["turn-1000"], turn.p50_ms, "ms", errors=turn.errors)
        if turn is not None
        else Side(names["turn-1000"], missing=f"not measured ({TARGET_TURN_EVENTS:,} events)")
    )
    return sides


def report(
    results: list[dict[str, Any]],
    floors: dict[str, Measurement | None],
    rows: list[tuple[Measurement, str, str]],
    target_records: list[dict[str, Any]],
    plan: TurnPlan,
) -> dict[str, Any]:
    """The session section of bench/results/latest.json."""
    return {
        "turn_plan": {
            "sizes": list(plan.sizes),
            "repetitions": plan.repetitions,
            "warmup_reps": plan.warmup_reps,
        },
        "floors": {key: m.to_json() if m else None for key, m in floors.items()},
        "configurations": [
            {
                "config": r["config"],
                "runs": [m.to_json() for m in r["runs"]],
                "kept": [m.to_json() for m in r["kept"]],
                "noop_ceiling": [m.to_json() for m in r["ceiling"]],
                "turns": [m.to_json() for m in r["turns"]],
                "open_loop": [m.to_json() for m in r["open_loop"]],
                "profile": r["profile"],
            }
            for r in results
        ],
        "table": [
            {"configuration": label, "ratio": ratio, **m.to_json()} for m, label, ratio in rows
        ],
        "targets": target_records,
    }
