"""How the benchmarks show what they measured: text tables, progress lines, the JSON
report and its PNG plots (matplotlib, Agg backend).

    .venv/bin/python -m bench.report [bench/results/latest.json]   # redraws the plots

Tables are columns of text cells, left-aligned first and last by default; every
section builds its rows from its measurements and calls `table`. The plots are drawn
from the JSON report only (`write_plots`), so a saved report can be drawn again:

- delivery-cycles-vs-clients.png, session-appends-vs-clients.png: operations/s
  against closed-loop clients per backend, with each backend's in-process floor
  (dashed), the no-op gRPC ceiling (dotted) and the in-process peers (dash-dot);
- open-loop-latency.png: p50 / p99 against offered rate, real operations beside
  no-op calls at the same rates;
- timetravel.png: restart and global-rewind time against events and against
  sessions, baselines dashed;
- postgres-throughput-vs-latency.png and postgres-open-loop-latency-vs-rtt.png:
  closed-loop rates and open-loop latency against the round trip added between the
  server and Postgres.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from bench.stats import Measurement

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# -- text ---------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[str]], note: str = "") -> str:
    """Columns as wide as their widest cell: the first and last left-aligned (names and
    remarks), the others right-aligned (figures); `note` under a rule."""
    body = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in body if i < len(row)) for i in range(len(header))]
    last = len(header) - 1

    def line(row: list[str]) -> str:
        cells = [
            cell.ljust(widths[i]) if i in (0, last) else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    lines = [line(body[0]), "-" * len(line(body[0])), *(line(row) for row in body[1:])]
    return "\n".join(lines + ([f"({note})"] if note else []))


def rate(value: float) -> str:
    return f"{value:,.1f}"


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def percent(value: Any) -> str:
    return f"{100 * float(value):.0f}%" if isinstance(value, int | float) else "-"


def ratio(value: float, base: float | None, label: str = "") -> str:
    if base is None or not base > 0:
        return "n/a"
    return f"{value / base:.3f} x{' ' + label if label else ''}"


def describe(m: Measurement, unit: str = "ops") -> str:
    """One measurement as a progress line."""
    server = m.extra.get("server_cpu_util")
    return (
        f"{m.clients} client(s), {m.channels or 1} channel(s): {m.cycles_per_s:,.0f} {unit}/s, "
        f"p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, errors {m.errors}; loadgen CPU "
        f"{percent(m.extra.get('loadgen_cpu_util'))}, server CPU {percent(server)}"
    )


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


# -- plots --------------------------------------------------------------------------------------

#: Colours by backend key (delivery and session alike); the ceiling's; the peers'.
COLOURS = {"sqlite-full": "tab:blue", "sqlite-normal": "tab:orange", "postgres": "tab:green"}
CEILING = "tab:gray"
PEER_COLOURS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:red")
#: The in-process peers drawn on each clients plot (bench/peers keys).
SESSION_PEERS = (
    "openai-agents-add-items-1",
    "openai-agents-add-items-8",
    "adk-database-append",
    "adk-sqlite-append",
    "langgraph-put",
)
DELIVERY_PEERS = ("procrastinate-job-cycle",)


def _section(report: dict[str, Any], key: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = report.get("sections", {}).get(key)
    return found


def _plain(ax: Axes, *, log_x: bool = False) -> None:
    """Log-scale axes labelled with plain numbers, not powers of ten."""
    plain = FuncFormatter(lambda value, _pos: f"{value:,.0f}" if value >= 1 else f"{value:g}")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(NullFormatter())
    if log_x:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", alpha=0.3)


def _save(figure: Figure, directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def _best_by_clients(runs: Iterable[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Per number of clients, the best rate over the channel counts tried."""
    best: dict[int, float] = {}
    for run in runs:
        best[run["clients"]] = max(best.get(run["clients"], 0.0), run["cycles_per_s"])
    clients = sorted(best)
    return clients, [best[c] for c in clients]


def measured_peers(report: dict[str, Any], keys: Sequence[str]) -> list[dict[str, Any]]:
    """The peers of `keys` that have a figure in the report."""
    peers = (_section(report, "peers") or {}).get("results", [])
    return [p for p in peers if p["key"] in keys and p.get("value") is not None]


def throughput_plot(report: dict[str, Any], key: str, directory: Path) -> Path | None:
    """Operations/s against clients of the throughput section `key` ("delivery" or
    "sessions"), with floors, the no-op ceiling and the peers."""
    data = _section(report, key)
    if not data or not data["configurations"]:
        return None
    figure = Figure(figsize=(8, 5))
    ax = figure.add_subplot()
    clients: set[int] = set()
    for config in data["configurations"]:
        colour = COLOURS.get(config["backend"], "black")
        xs, ys = _best_by_clients(config["runs"])
        clients.update(xs)
        ax.plot(xs, ys, marker="o", color=colour, label=config["label"])
        floor = data["floors"].get(config["backend"])
        if floor:
            ax.axhline(
                floor["cycles_per_s"],
                color=colour,
                linestyle="--",
                alpha=0.7,
                label=f"{floor['name']} floor",
            )
        if config["noop"]:
            xs, ys = _best_by_clients(config["noop"])
            ax.plot(xs, ys, marker=".", color=CEILING, linestyle=":", label="gRPC no-op ceiling")
    peers = SESSION_PEERS if key == "sessions" else DELIVERY_PEERS
    for colour, peer in zip(PEER_COLOURS, measured_peers(report, peers), strict=False):
        ax.axhline(
            peer["value"],
            color=colour,
            linestyle="-.",
            alpha=0.8,
            label=f"{peer['label']} (in-process)",
        )
    _plain(ax, log_x=True)
    ax.set_xticks(sorted(clients))
    ax.set_xlabel("closed-loop clients")
    ax.set_ylabel(f"{data['unit']}/s")
    ax.set_title(data["title"], fontsize=10)
    ax.legend(fontsize=7, loc="best")
    name = (
        "session-appends-vs-clients.png" if key == "sessions" else "delivery-cycles-vs-clients.png"
    )
    return _save(figure, directory, name)


def open_loop_plot(report: dict[str, Any], directory: Path) -> Path | None:
    """p50 and p99 against offered rate, per service, beside the no-op at the same rates."""
    data = _section(report, "open-loop")
    if not data or not data["runs"]:
        return None
    figure = Figure(figsize=(8, 5))
    ax = figure.add_subplot()
    for index, service in enumerate(sorted({r["service"] for r in data["runs"]})):
        colour = PEER_COLOURS[index]
        for op, style in (("work", "-"), ("noop", "--")):
            runs = sorted(
                (r for r in data["runs"] if r["service"] == service and r["op"] == op),
                key=lambda r: r["measurement"]["extra"]["offered_rate"],
            )
            rates = [r["measurement"]["extra"]["offered_rate"] for r in runs]
            for pct, marker in (("p50_ms", "o"), ("p99_ms", "^")):
                ax.plot(
                    rates,
                    [r["measurement"][pct] for r in runs],
                    linestyle=style,
                    marker=marker,
                    color=colour,
                    label=f"{r_label(service, op)} {pct.split('_')[0]}",
                )
    _plain(ax, log_x=True)
    ax.set_xlabel("offered operations/s (open loop)")
    ax.set_ylabel("latency from scheduled start, ms")
    ax.set_title("Latency under a fixed open-loop load (SQLite FULL)", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return _save(figure, directory, "open-loop-latency.png")


def r_label(service: str, op: str) -> str:
    what = "delivery cycle" if service == "delivery" else "AppendEvents"
    return what if op == "work" else f"no-op ({what})"


def timetravel_plot(report: dict[str, Any], directory: Path) -> Path | None:
    """Restart and rewind time against events and against sessions, baselines dashed."""
    data = _section(report, "timetravel")
    if not data or not data["rows"]:
        return None
    figure = Figure(figsize=(11, 4.5))
    for index, (series, x) in enumerate((("events", "events"), ("sessions", "sessions"))):
        ax = figure.add_subplot(1, 2, index + 1)
        rows = sorted((r for r in data["rows"] if series in r["series"]), key=lambda r: r[x])
        xs = [r[x] for r in rows]
        ax.plot(xs, [r["restart_s"] for r in rows], marker="o", label="restart")
        ax.axhline(
            data["baseline_restart_s"],
            linestyle="--",
            color="tab:blue",
            alpha=0.6,
            label="restart, empty log",
        )
        ax.plot(xs, [r["rewind_s"] for r in rows], marker="o", color="tab:red", label="rewind")
        ax.plot(
            xs,
            [r["rewind_baseline_s"] for r in rows],
            linestyle="--",
            color="tab:red",
            alpha=0.6,
            label="rewind, one-event sessions",
        )
        _plain(ax, log_x=True)
        ax.set_xticks(xs)
        ax.set_xlabel(x)
        ax.set_ylabel("seconds")
        ax.legend(fontsize=7)
    figure.suptitle("Restart and global rewind (SQLite FULL)", fontsize=10)
    return _save(figure, directory, "timetravel.png")


def db_latency_plots(report: dict[str, Any], directory: Path) -> list[Path]:
    """Closed-loop rates, and open-loop latency, against the added round trip."""
    data = _section(report, "db-latency")
    if not data or not data["points"]:
        return []
    points = data["points"]
    added = [p["added_rtt_ms"] for p in points]
    figure = Figure(figsize=(8, 5))
    ax = figure.add_subplot()
    for service, colour in (("session", "tab:blue"), ("delivery", "tab:green")):
        ax.plot(
            added,
            [p[service]["cycles_per_s"] for p in points],
            marker="o",
            color=colour,
            label=r_label(service, "work") + "s/s, 8 clients",
        )
    _plain(ax)
    ax.set_xlabel("round trip added between the server and Postgres, ms")
    ax.set_ylabel("operations/s")
    ax.set_title("Postgres: throughput against database round trip", fontsize=10)
    ax.legend(fontsize=7)
    paths = [_save(figure, directory, "postgres-throughput-vs-latency.png")]
    if all(p.get("open_loop") for p in points):
        figure = Figure(figsize=(8, 5))
        ax = figure.add_subplot()
        for service, colour in (("session", "tab:blue"), ("delivery", "tab:green")):
            for pct, style in (("p50_ms", "-"), ("p99_ms", "--")):
                ax.plot(
                    added,
                    [p["open_loop"][service][pct] for p in points],
                    marker="o",
                    linestyle=style,
                    color=colour,
                    label=f"{r_label(service, 'work')} {pct.split('_')[0]}",
                )
        _plain(ax)
        ax.set_xlabel("round trip added between the server and Postgres, ms")
        ax.set_ylabel("latency from scheduled start, ms")
        ax.set_title(f"Postgres: open-loop latency at {data['open_loop_rate']:g}/s", fontsize=10)
        ax.legend(fontsize=7)
        paths.append(_save(figure, directory, "postgres-open-loop-latency-vs-rtt.png"))
    return paths


def write_plots(report: dict[str, Any], directory: Path = RESULTS_DIR) -> list[Path]:
    """Every plot the report has figures for; the files written."""
    drawn = [
        throughput_plot(report, "delivery", directory),
        throughput_plot(report, "sessions", directory),
        open_loop_plot(report, directory),
        timetravel_plot(report, directory),
        *db_latency_plots(report, directory),
    ]
    return [path for path in drawn if path is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("report", nargs="?", type=Path, default=RESULTS_DIR / "latest.json")
    args = parser.parse_args(argv)
    for path in write_plots(json.loads(args.report.read_text()), args.report.parent):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
