"""PNG plots of a benchmark run, drawn from its JSON report (matplotlib, Agg backend).

    .venv/bin/python -m bench.plots [bench/results/latest.json]

`python -m bench` calls `write_plots` at the end of every run; this entry point
redraws them from a saved report. Each plot shows the baseline it is compared
with (floors, the no-op gRPC ceiling, the empty log, one-event sessions) in the
same axes, dashed:

- delivery-cycles-vs-clients.png: delivery cycles/s against closed-loop clients,
  per backend, with each backend's raw driver floor and the no-op ceiling, and
  procrastinate's job cycle (in-process peer, bench/peers) as a dash-dot line;
- session-appends-vs-clients.png: AppendEvents/s against clients, per backend,
  with each backend's peewee insert floor and the no-op ceiling, and the
  in-process peers (OpenAI Agents, ADK, LangGraph) as dash-dot lines;
- timetravel.png: restart and global-rewind time against events (at a fixed
  number of sessions) and against sessions (at a fixed number of events);
- open-loop-latency.png: p50 / p99 latency against offered rate, open loop, for
  delivery cycles and for appends, next to no-op calls at the same rates;
- postgres-throughput-vs-latency.png: appends/s and delivery cycles/s (8 closed-loop
  clients) against the round trip added between the server and Postgres;
- postgres-open-loop-latency-vs-rtt.png: p50 / p99 latency of appends and delivery
  cycles at one fixed open-loop rate against the same added round trip, the +0 ms
  point being the baseline.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Backend labels and colours, by configuration key (delivery and session alike).
LABELS = {
    "sqlite-full": "SQLite FULL",
    "sqlite-normal": "SQLite NORMAL",
    "postgres": "Postgres",
}
COLOURS = {"sqlite-full": "tab:blue", "sqlite-normal": "tab:orange", "postgres": "tab:green"}
#: The floor each delivery configuration is compared with, by configuration key.
DELIVERY_FLOORS = {"sqlite-full": "FULL", "sqlite-normal": "NORMAL", "postgres": "postgres"}
CEILING = "tab:gray"
#: The in-process peers drawn on each clients plot (bench/peers keys), and their colours.
SESSION_PEERS = (
    "openai-agents-add-items-1",
    "openai-agents-add-items-8",
    "adk-database-append",
    "adk-sqlite-append",
    "langgraph-put",
)
DELIVERY_PEERS = ("procrastinate-job-cycle",)
PEER_COLOURS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:red")


def _backend(key: str) -> str:
    return key.removeprefix("session-")


def _best_by_clients(runs: Iterable[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Per number of clients, the best rate over the channel counts tried."""
    best: dict[int, float] = {}
    for run in runs:
        best[run["clients"]] = max(best.get(run["clients"], 0.0), run["cycles_per_s"])
    clients = sorted(best)
    return clients, [best[c] for c in clients]


def _plain_log(axis: Axis) -> None:
    """Log-scale ticks at 1, 2 and 5 of each decade, labelled as plain numbers."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.4g}"))
    axis.set_minor_formatter(NullFormatter())


def _label_points(
    ax: Axes, xs: list[float], ys: list[float], text: str = "{:,.0f}", below: bool = False
) -> None:
    for x, y in zip(xs, ys, strict=True):
        offset = (4, -11) if below else (4, 5)
        ax.annotate(text.format(y), (x, y), textcoords="offset points", xytext=offset, fontsize=7)


def _clients_axes(ax: Axes, clients: set[int], ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(clients)
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.minorticks_off()
    ax.set_xlabel("concurrent clients (closed loop; log scale)")
    ax.set_yscale("log")
    _plain_log(ax.yaxis)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    # Outside the axes, on the right: with the peers' lines it is too long to sit on the data.
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _throughput_plot(
    configurations: list[dict[str, Any]],
    floors: dict[str, Any],
    floor_of: dict[str, str],
    floor_label: str,
    ceiling_label: str,
    ylabel: str,
    title: str,
    path: Path,
    peers: list[dict[str, Any]] | None = None,
) -> Path | None:
    if not configurations:
        return None
    figure = Figure(figsize=(13, 5.5), layout="constrained")
    ax = figure.subplots()
    clients_seen: set[int] = set()
    for configuration in configurations:
        key = _backend(configuration["config"])
        colour = COLOURS.get(key, "black")
        clients, rates = _best_by_clients(configuration["runs"])
        clients_seen.update(clients)
        ax.plot(clients, rates, marker="o", color=colour, label=f"{LABELS.get(key, key)} (gRPC)")
        for x, y in zip(clients, rates, strict=True):
            ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(4, 5), fontsize=7)
        floor = floors.get(floor_of.get(configuration["config"], ""))
        if floor:
            ax.axhline(
                floor["cycles_per_s"],
                color=colour,
                linestyle="--",
                linewidth=1,
                label=f"{LABELS.get(key, key)} {floor_label}: {floor['cycles_per_s']:,.0f}",
            )
        ceiling = configuration.get("noop_ceiling") or []
        if ceiling:
            noop_clients, noop_rates = _best_by_clients(ceiling)
            ax.plot(
                noop_clients,
                noop_rates,
                marker="x",
                color=CEILING,
                linestyle=":",
                label=ceiling_label,
            )
    _peer_lines(ax, peers or [])
    _clients_axes(ax, clients_seen, ylabel, title)
    figure.savefig(path, dpi=110)
    return path


def _peer_lines(ax: Axes, peers: list[dict[str, Any]]) -> None:
    """Each measured peer as a horizontal dash-dot line: its rate at its own clients."""
    for colour, peer in zip(PEER_COLOURS, peers, strict=False):
        ax.axhline(
            peer["value"],
            color=colour,
            linestyle="-.",
            linewidth=1.2,
            label=f"{peer['label']} (in-process): {peer['value']:,.0f}/s",
        )


def _measured_peers(report: dict[str, Any], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    by_key = {p["key"]: p for p in report.get("peers") or [] if p.get("value")}
    return [by_key[key] for key in keys if key in by_key]


def delivery_plot(report: dict[str, Any], directory: Path) -> Path | None:
    return _throughput_plot(
        report.get("configurations", []),
        report.get("floors", {}),
        DELIVERY_FLOORS,
        "raw driver floor (1 thread)",
        "gRPC no-op ceiling (3x Health/Check)",
        "delivery cycles/s (record + attempting + delivered; log scale)",
        "DeliveryService send path: cycles/s against clients",
        directory / "delivery-cycles-vs-clients.png",
        _measured_peers(report, DELIVERY_PEERS),
    )


def session_plot(report: dict[str, Any], directory: Path) -> Path | None:
    section = report.get("session") or {}
    configurations = section.get("configurations", [])
    return _throughput_plot(
        configurations,
        section.get("floors", {}),
        {c["config"]: c["config"] for c in configurations},
        "peewee insert floor (1 thread)",
        "gRPC no-op ceiling (1x Health/Check)",
        "AppendEvents/s (1 event of 100 bytes each; log scale)",
        "SessionService: appends/s against clients",
        directory / "session-appends-vs-clients.png",
        _measured_peers(report, SESSION_PEERS),
    )


def timetravel_plot(report: dict[str, Any], directory: Path) -> Path | None:
    section = report.get("timetravel")
    if not section or not section.get("rows"):
        return None
    plan = section["plan"]
    figure = Figure(figsize=(12, 5), layout="constrained")
    by_events, by_sessions = figure.subplots(1, 2, sharey=True)
    for ax, series, axis, title in (
        (
            by_events,
            "events",
            "events in the log (log scale)",
            f"against events ({plan['fixed_sessions']:,} sessions)",
        ),
        (
            by_sessions,
            "sessions",
            "sessions in the log (log scale)",
            f"against sessions ({plan['fixed_events']:,} events)",
        ),
    ):
        rows = sorted(
            (r for r in section["rows"] if series in r["series"]), key=lambda r: r[series]
        )
        if not rows:
            continue
        xs = [r[series] for r in rows]
        for stat, marker, colour, name in (
            ("restart_s", "o", "tab:blue", "restart"),
            ("rewind_s", "s", "tab:red", "rewind of everything"),
        ):
            ys = [r[stat] for r in rows]
            ax.plot(xs, ys, marker=marker, color=colour, label=name)
            _label_points(ax, [float(x) for x in xs], ys, "{:.3g} s", below=stat == "rewind_s")
        ax.axhline(
            section["baseline_restart_s"],
            color="tab:blue",
            linestyle="--",
            linewidth=1,
            label="restart on an empty log",
        )
        ax.plot(
            xs,
            [r["rewind_baseline_s"] for r in rows],
            color="tab:red",
            linestyle="--",
            linewidth=1,
            marker=".",
            label="rewind over as many one-event sessions",
        )
        ax.set_title(title)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(xs, [f"{x:,}" for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
        _plain_log(ax.yaxis)
        ax.set_xlabel(axis)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small", loc="best")
    by_events.set_ylabel("seconds (log scale)")
    figure.suptitle("SessionService recovery: restart (until listening) and global rewind, SQLite")
    path = directory / "timetravel.png"
    figure.savefig(path, dpi=110)
    return path


def open_loop_plot(report: dict[str, Any], directory: Path) -> Path | None:
    section = report.get("open_loop")
    runs: list[dict[str, Any]] = section.get("runs", []) if section else []
    services = [s for s in ("delivery", "session") if any(r["extra"]["service"] == s for r in runs)]
    if not services:
        return None
    figure = Figure(figsize=(6 * len(services), 5), layout="constrained")
    axes = figure.subplots(1, len(services), squeeze=False)[0]
    titles = {"delivery": "delivery cycle (3 RPCs)", "session": "AppendEvents (1 RPC)"}
    for ax, service in zip(axes, services, strict=True):
        mine = [r for r in runs if r["extra"]["service"] == service]
        label = next((r["extra"].get("config_label", "") for r in mine), "")
        for op, style, colour in (("work", "-", "tab:red"), ("noop", "--", CEILING)):
            points = sorted(
                (r for r in mine if r["extra"]["op"] == op),
                key=lambda r: r["extra"]["offered_rate"],
            )
            if not points:
                continue
            rates = [r["extra"]["offered_rate"] for r in points]
            name = titles[service] if op == "work" else "no-op (Health/Check)"
            for stat, marker in (("p50_ms", "o"), ("p99_ms", "^")):
                ax.plot(
                    rates,
                    [r[stat] for r in points],
                    linestyle=style,
                    marker=marker,
                    color=colour,
                    label=f"{name} {stat.removesuffix('_ms')}",
                )
            if op == "work":
                for r in points:
                    x = r["extra"]
                    if x["achieved_rate"] < 0.95 * x["offered_rate"] or r["errors"]:
                        ax.annotate(
                            f"achieved {x['achieved_rate']:,.0f}/s"
                            + (f", {r['errors']} errors" if r["errors"] else ""),
                            (x["offered_rate"], r["p50_ms"]),
                            textcoords="offset points",
                            xytext=(-105, -4),
                            fontsize=7,
                        )
        rates_seen = sorted({r["extra"]["offered_rate"] for r in mine})
        ax.set_xscale("log")
        ax.set_xticks(rates_seen, [f"{r:,.0f}" for r in rates_seen])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log")
        _plain_log(ax.yaxis)
        ax.set_xlabel("offered rate, operations started per second (open loop; log scale)")
        ax.set_ylabel("latency from scheduled start, ms (log scale)")
        ax.set_title(f"{titles[service]}, {label}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
    figure.suptitle("Latency under a fixed open-loop load, next to no-op calls at the same rate")
    path = directory / "open-loop-latency.png"
    figure.savefig(path, dpi=110)
    return path


def db_latency_plot(report: dict[str, Any], directory: Path) -> Path | None:
    """Appends/s and delivery cycles/s against the round trip added to Postgres."""
    points = report.get("db_latency") or []
    if not points:
        return None
    added = [float(p["added_rtt_ms"]) for p in points]
    figure = Figure(figsize=(7, 4.5))
    ax = figure.subplots()
    for key, label in (("appends", "AppendEvents/s"), ("cycles", "delivery cycles/s")):
        values = [float(p[key]["cycles_per_s"]) for p in points]
        ax.plot(added, values, marker="o", label=label)
        _label_points(ax, added, values)
    _added_rtt_axis(ax, added)
    ax.set_yscale("log")
    ax.set_ylabel("per second, 8 clients (log scale)")
    ax.set_title("Postgres: throughput against database latency")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = directory / "postgres-throughput-vs-latency.png"
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def _added_rtt_axis(ax: Axes, added: list[float]) -> None:
    """x: the added round trips, linear up to 1 ms and logarithmic beyond (0 has a place)."""
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xticks(added)
    ax.set_xticklabels([f"+{a:g}" for a in added])
    ax.set_xlabel("round trip added between the server and Postgres (ms)")


def db_latency_open_loop_plot(report: dict[str, Any], directory: Path) -> Path | None:
    """p50 / p99 at a fixed open-loop rate against the round trip added to Postgres;
    points that fell behind the offered rate (or had errors) are annotated."""
    points = [p for p in report.get("db_latency") or [] if p.get("open_loop")]
    if not points:
        return None
    added = [float(p["added_rtt_ms"]) for p in points]
    rate = points[0]["open_loop"]["rate"]
    figure = Figure(figsize=(8, 5), layout="constrained")
    ax = figure.subplots()
    for key, label, colour in (
        ("appends", "AppendEvents (1 RPC)", "tab:blue"),
        ("cycles", "delivery cycle (3 RPCs)", "tab:orange"),
    ):
        runs = [p["open_loop"][key] for p in points]
        for stat, style, marker in (("p50_ms", "-", "o"), ("p99_ms", "--", "^")):
            ax.plot(
                added,
                [r[stat] for r in runs],
                linestyle=style,
                marker=marker,
                color=colour,
                label=f"{label} {stat.removesuffix('_ms')}",
            )
        for x, r in zip(added, runs, strict=True):
            extra = r["extra"]
            if extra["achieved_rate"] < 0.95 * extra["offered_rate"] or r["errors"]:
                ax.annotate(
                    f"achieved {extra['achieved_rate']:,.0f}/s of {extra['offered_rate']:,.0f}"
                    + (f", {r['errors']} errors" if r["errors"] else ""),
                    (x, r["p99_ms"]),
                    textcoords="offset points",
                    xytext=(-110, 4),
                    fontsize=7,
                    color=colour,
                )
    _added_rtt_axis(ax, added)
    ax.set_yscale("log")
    _plain_log(ax.yaxis)
    ax.set_ylabel("latency from scheduled start, ms (log scale)")
    ax.set_title(
        f"Postgres: open-loop latency at {rate:g} operations/s against database round trip"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left")
    path = directory / "postgres-open-loop-latency-vs-rtt.png"
    figure.savefig(path, dpi=110)
    return path


def write_plots(report: dict[str, Any], directory: Path = RESULTS_DIR) -> list[Path]:
    """Every plot the report has data for; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [
        delivery_plot(report, directory),
        session_plot(report, directory),
        timetravel_plot(report, directory),
        open_loop_plot(report, directory),
        db_latency_plot(report, directory),
        db_latency_open_loop_plot(report, directory),
    ]
    return [path for path in written if path is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("report", nargs="?", type=Path, default=RESULTS_DIR / "latest.json")
    parser.add_argument("--output-dir", type=Path, default=None, help="default: the report's")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    for path in write_plots(report, args.output_dir or args.report.parent):
        print(f"plot written: {path}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
