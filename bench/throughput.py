"""The sections `delivery` and `sessions`: closed-loop throughput of each service over
gRPC against an in-process floor of the same backend, measured in the same run.

For each selected backend (SQLite synchronous=FULL, SQLite NORMAL, Postgres in a fresh
schema) a fresh `switchboard serve` process is loaded by `bench.loadgen` with 1 client,
8 clients over 1 and over 2 channels (the faster is kept) and 32 clients over the kept
number of channels; the ratio is to the backend's floor (`bench.floors`). Then, on the
same server:

- delivery (`cycle`: RecordObligation -> MarkAttempting -> MarkDelivered, 3 durable
  RPCs): the same transitions in 2 RPCs (`cycle2`, RecordObligation.begin_attempt) at
  8 clients; floor: the same three transactions on the raw driver;
- sessions (`append`: one 100-byte USER message per durable call): load-for-next-turn
  (`turn`: GetSessionState + GetHistory(limit=50, newest), one client) on sessions of
  100, 1,000 (and 10,000) events; floor: one log-row INSERT per transaction (peewee);
- both: the service's writes as a gateway with 8 calls in flight sends them, over one
  channel's CallStream (`append-stream`; `cycle2-stream`, record-and-begin) at 8 clients;
- on the first backend, the no-op ceiling: as many Health/Check calls per operation
  as the real one makes RPCs, at 1 and 8 clients: what the gRPC layer alone allows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench import floors, loadgen, servers
from bench.peers.goals import Side
from bench.plan import Context, Section, error_notes
from bench.report import describe, ms, percent, rate, ratio, table
from bench.servers import Backend
from bench.stats import Measurement

CONCURRENT = 8
#: Each service's workload over CallStream, and how its rows are labelled.
STREAMED = {"delivery": "cycle2-stream", "sessions": "append-stream"}
STREAM_LABEL = {
    "delivery": "2 RPCs (begin_attempt) over CallStream",
    "sessions": "over CallStream",
}
MANY = 32
#: The session size whose next-turn load the goal lines compare.
TURN_EVENTS = 1000


@dataclass(frozen=True)
class Service:
    key: str
    server: str
    workload: str
    unit: str
    title: str
    noop_rpcs: int
    floor: Callable[[Backend, float], Measurement]


DELIVERY = Service(
    "delivery",
    "delivery",
    "cycle",
    "cycles",
    "DeliveryService: send-path cycles (RecordObligation -> MarkAttempting -> MarkDelivered)",
    3,
    floors.delivery_floor,
)
SESSIONS = Service(
    "sessions",
    "session",
    "append",
    "appends",
    "SessionService: AppendEvents (one 100-byte message) and next-turn loads",
    1,
    floors.session_floor,
)


def run_delivery(ctx: Context) -> Section:
    return measure(DELIVERY, ctx)


def run_sessions(ctx: Context) -> Section:
    return measure(SESSIONS, ctx)


def measure(service: Service, ctx: Context) -> Section:
    configurations, floors_by_key = [], {}
    for index, backend in enumerate(ctx.backends):
        floors_by_key[backend.key] = floor = service.floor(backend, ctx.scale.seconds)
        ctx.say(f"[{service.key}] floor {floor.name}: {floor.cycles_per_s:,.0f}/s")
        configurations.append(_configuration(service, backend, ctx, noop=index == 0))
    data = {
        "title": service.title,
        "unit": service.unit,
        "floors": {key: m.to_json() for key, m in floors_by_key.items()},
        "configurations": [
            {key: _as_json(value) for key, value in config.items()} for config in configurations
        ],
    }
    measured = [m for c in configurations for m in (*c["runs"], *c["extras"], *c["noop"])]
    return Section(
        service.key,
        service.title,
        _table(service, configurations, floors_by_key),
        data,
        _sides(service, configurations, floors_by_key, ctx),
        error_notes(service.key, measured),
    )


def _as_json(value: Any) -> Any:
    if isinstance(value, list):
        return [m.to_json() for m in value]
    return value.to_json() if isinstance(value, Measurement) else value


def _configuration(service: Service, backend: Backend, ctx: Context, noop: bool) -> dict[str, Any]:
    """The client curve, the service's extra runs and (with `noop`) the no-op ceiling,
    on one fresh server."""
    load = functools.partial(
        loadgen.Load,
        workload=service.workload,
        seconds=ctx.scale.seconds,
        warmup_s=ctx.scale.warmup_s,
    )
    curve = ((1, 1), (CONCURRENT, 1), (CONCURRENT, 2))
    steps = ctx.scale.pick(curve, curve, ((1, 1), (CONCURRENT, 1)))
    with servers.serving(service.server, backend) as server:

        def measured(load: loadgen.Load, name: str) -> Measurement:
            found = loadgen.run(server, load)
            found.name = name
            unit = "loads" if load.workload == "turn" else service.unit
            ctx.say(f"[{service.key}] {backend.key} {name}: {describe(found, unit)}")
            return found

        runs = [measured(load(clients=c, channels=ch), backend.label) for c, ch in steps]
        kept = max(runs[1:], key=lambda m: m.cycles_per_s)
        if ctx.scale.name != "smoke":
            runs.append(measured(load(clients=MANY, channels=kept.channels), backend.label))
        if service is DELIVERY:
            two = load(workload="cycle2", clients=CONCURRENT, channels=kept.channels)
            extras = [measured(two, f"{backend.label}, 2 RPCs (begin_attempt)")]
        else:
            extras = [
                measured(load(workload="turn", events=events), f"{backend.label} load @{events:,}")
                for events in ctx.scale.pick((100, 1000, 10_000), (100, 1000), (TURN_EVENTS,))
            ]
        # What a gateway with 8 calls in flight sends: one channel, one CallStream.
        streamed = load(workload=STREAMED[service.key], clients=CONCURRENT, channels=1)
        extras.append(measured(streamed, f"{backend.label}, {STREAM_LABEL[service.key]}"))
        ceiling = [
            measured(
                load(workload="noop", rpcs=service.noop_rpcs, clients=c, channels=kept.channels),
                f"gRPC no-op ({service.noop_rpcs}x Health/Check)",
            )
            for c in ((1, CONCURRENT) if noop else ())
        ]
    kept_runs = [runs[0], kept, *runs[len(steps) :]]
    return {
        "backend": backend.key,
        "label": backend.label,
        "runs": runs,
        "kept": kept_runs,
        "extras": extras,
        "noop": ceiling,
    }


HEADER = (
    "configuration",
    "clients",
    "ch",
    "ops/s",
    "RPCs/s",
    "p50 ms",
    "p99 ms",
    "srv CPU",
    "lg CPU",
    "vs floor / notes",
)


def _table(
    service: Service,
    configurations: Sequence[dict[str, Any]],
    floors_by_key: dict[str, Measurement],
) -> str:
    """Floors, then each backend's runs, then the no-op ceiling."""
    rows = [_row(m, "in-process, one thread") for m in floors_by_key.values()]
    ordered = [(c, m) for c in configurations for m in c["kept"] + c["extras"]]
    ordered += [(c, m) for c in configurations for m in c["noop"]]
    for config, m in ordered:
        rows.append(_row(m, _remark(m, floors_by_key[config["backend"]])))
    note = (
        f"ops: {service.unit}, loads (load @N: GetSessionState + GetHistory(limit=50, newest) "
        "of a session of N events) or no-op calls; ch: gRPC channels; srv CPU / lg CPU: "
        "server / load-generator process, % of one core"
    )
    return table(HEADER, rows, note)


def _remark(m: Measurement, floor: Measurement) -> str:
    if "events" in m.extra:
        state, history = m.extra["state_p50_ms"], m.extra["history_p50_ms"]
        return f"state {state:.2f} + history {history:.2f} ms (p50)"
    if m.name.startswith("gRPC no-op"):
        return "no database: the gRPC ceiling"
    return ratio(m.cycles_per_s, floor.cycles_per_s, f"{floor.name} floor")


def _row(m: Measurement, remark: str) -> tuple[str, ...]:
    in_process = not m.channels
    return (
        m.name + (" floor" if in_process else ""),
        str(m.clients),
        "-" if in_process else str(m.channels),
        rate(m.cycles_per_s),
        rate(m.rpcs_per_s),
        ms(m.p50_ms),
        ms(m.p99_ms),
        percent(m.extra.get("server_cpu_util")),
        percent(m.extra.get("loadgen_cpu_util")),
        remark,
    )


def _sides(
    service: Service,
    configurations: Sequence[dict[str, Any]],
    floors_by_key: dict[str, Measurement],
    ctx: Context,
) -> dict[str, Side]:
    """This section's figures in the goal lines and targets (SQLite FULL and Postgres)."""
    by_backend = {config["backend"]: config for config in configurations}
    full, postgres = by_backend.get("sqlite-full"), by_backend.get("postgres")
    if service is DELIVERY:
        return {
            "delivery-8-sqlite": _side(
                "delivery cycles, 8 clients (SQLite FULL)",
                _kept(full, 1),
                ctx.missing("sqlite-full"),
            ),
            "delivery-floor-sqlite": _side(
                "raw sqlite3 FULL floor",
                floors_by_key.get("sqlite-full"),
                ctx.missing("sqlite-full"),
            ),
            "delivery-8-postgres": _side(
                "delivery cycles, 8 clients (Postgres)", _kept(postgres, 1), ctx.missing("postgres")
            ),
            "delivery-floor-postgres": _side(
                "raw psycopg2 floor", floors_by_key.get("postgres"), ctx.missing("postgres")
            ),
            "delivery-8-stream-sqlite": _side(
                "delivery cycles (record-and-begin over CallStream), 8 clients (SQLite FULL)",
                _streamed(full),
                ctx.missing("sqlite-full"),
            ),
            "delivery-8-stream-postgres": _side(
                "delivery cycles (record-and-begin over CallStream), 8 clients (Postgres)",
                _streamed(postgres),
                ctx.missing("postgres"),
            ),
        }
    turn = _turn_at(full, TURN_EVENTS)
    return {
        "appends-1": _side("AppendEvents, 1 client", _kept(full, 0), ctx.missing("sqlite-full")),
        "appends-8": _side("AppendEvents, 8 clients", _kept(full, 1), ctx.missing("sqlite-full")),
        "appends-8-stream": _side(
            "AppendEvents over CallStream, 8 clients (SQLite FULL)",
            _streamed(full),
            ctx.missing("sqlite-full"),
        ),
        "appends-8-stream-postgres": _side(
            "AppendEvents over CallStream, 8 clients (Postgres)",
            _streamed(postgres),
            ctx.missing("postgres"),
        ),
        "appends-floor-postgres": _side(
            "peewee insert floor (Postgres)", floors_by_key.get("postgres"), ctx.missing("postgres")
        ),
        "turn-1000": _side(
            f"load-for-next-turn p50 @{TURN_EVENTS:,}",
            turn,
            ctx.missing("sqlite-full")
            if full is None
            else f"not measured ({TURN_EVENTS:,} events)",
            latency=True,
        ),
    }


def _kept(config: dict[str, Any] | None, index: int) -> Measurement | None:
    return config["kept"][index] if config else None


def _streamed(config: dict[str, Any] | None) -> Measurement | None:
    """The configuration's run over CallStream (its last extra)."""
    return config["extras"][-1] if config else None


def _turn_at(config: dict[str, Any] | None, events: int) -> Measurement | None:
    extras = config["extras"] if config else []
    return next((m for m in extras if m.extra.get("events") == events), None)


def _side(name: str, found: Measurement | None, missing: str, latency: bool = False) -> Side:
    """A rate (or, with `latency`, a p50 in ms) for the goal lines; `missing` says why not."""
    if found is None:
        return Side(name, missing=missing)
    if latency:
        return Side(name, found.p50_ms, "ms", errors=found.errors)
    return Side(name, found.cycles_per_s, errors=found.errors)


#: The goal-line figures this module's sections give (see `bench.runner`).
SIDES = {
    "delivery": (
        "delivery-8-sqlite",
        "delivery-floor-sqlite",
        "delivery-8-postgres",
        "delivery-floor-postgres",
        "delivery-8-stream-sqlite",
        "delivery-8-stream-postgres",
    ),
    "sessions": (
        "appends-1",
        "appends-8",
        "turn-1000",
        "appends-8-stream",
        "appends-8-stream-postgres",
        "appends-floor-postgres",
    ),
}
