"""The db-latency benchmark's open-loop part (bench/db_latency.py): rows, ratios to the +0 ms
point, the table, the JSON entries and the plot, on fixed figures. Nothing is measured or
timed here; `python -m bench --only db-latency --quick` runs the real thing."""

from __future__ import annotations

import json
from pathlib import Path

from bench import db_latency, plots
from bench.latency import OpenLoopPlan
from bench.stats import Measurement

PLAN = OpenLoopPlan(rates=(200.0, 500.0), seconds=2.0, warmup_s=0.5)


def _closed(per_s: float) -> Measurement:
    return Measurement("closed", 8, 1.0, int(per_s), 10.0, 20.0, 12.0, channels=1)


def _open(
    service: str, added_rtt_ms: float, p50_ms: float, p99_ms: float, achieved: float = 100.0
) -> Measurement:
    """An open-loop run as `bench.open_loop` reports it, with the extras the table reads."""
    return Measurement(
        f"postgres +{added_rtt_ms:g} ms open loop",
        0,
        PLAN.seconds,
        int(achieved * PLAN.seconds),
        p50_ms,
        p99_ms,
        p50_ms,
        errors=0 if achieved >= 100.0 else 12,
        channels=1,
        rpcs_per_cycle=1 if service == "session" else 3,
        extra={
            "service": service,
            "op": "work",
            "offered_rate": db_latency.OPEN_LOOP_RATE,
            "achieved_rate": achieved,
            "start_lag_p99_ms": 0.5,
            "max_in_flight": 3,
            "first_error": "" if achieved >= 100.0 else "timed out after 10 s",
            "added_rtt_ms": added_rtt_ms,
        },
    )


def _points() -> list[db_latency.Point]:
    return [
        db_latency.Point(
            0.0,
            _closed(570),
            _closed(380),
            _open("session", 0.0, 5, 10),
            _open("delivery", 0, 8, 16),
        ),
        db_latency.Point(
            5.0,
            _closed(66),
            _closed(134),
            _open("session", 5.0, 25, 60),
            _open("delivery", 5.0, 40, 64),
        ),
        db_latency.Point(
            20.0,
            _closed(18),
            _closed(36),
            _open("session", 20.0, 2000, 9000, achieved=18.0),
            _open("delivery", 20.0, 130, 400),
        ),
    ]


def test_open_rows_are_ratios_to_the_zero_point_of_the_same_service() -> None:
    rows = db_latency.open_rows(_points())
    assert [(m.extra["service"], m.extra["added_rtt_ms"]) for m, _, _ in rows] == [
        ("session", 0.0),
        ("session", 5.0),
        ("session", 20.0),
        ("delivery", 0.0),
        ("delivery", 5.0),
        ("delivery", 20.0),
    ]
    assert [ratio for _, _, ratio in rows] == [
        "p50 1.00 x, p99 1.00 x; achieved 1.00 x offered",
        "p50 5.00 x, p99 6.00 x; achieved 1.00 x offered",
        "p50 400.00 x, p99 900.00 x; achieved 0.18 x offered",
        "p50 1.00 x, p99 1.00 x; achieved 1.00 x offered",
        "p50 5.00 x, p99 4.00 x; achieved 1.00 x offered",
        "p50 16.25 x, p99 25.00 x; achieved 1.00 x offered",
    ]
    assert {label for _, label, _ in rows} == {"AppendEvents (1 RPC)", "delivery cycle (3 RPCs)"}


def test_without_a_zero_point_there_is_no_ratio() -> None:
    rows = db_latency.open_rows(_points()[1:])
    assert all(ratio.startswith("n/a; achieved") for _, _, ratio in rows)


def test_the_table_shows_both_loops_and_the_open_loop_windows() -> None:
    text = db_latency.render(_points(), PLAN)
    closed, opened = text.split("\n\n")
    assert "appends/s" in closed.splitlines()[0]
    lines = opened.splitlines()
    assert lines[0].split()[:3] == ["operation", "added", "RTT"]
    saturated = next(line for line in lines if "+20 ms" in line and "AppendEvents" in line)
    assert saturated.split()[3:10] == ["+20", "ms", "100", "18.0", "2000.00", "9000.00", "0.50"]
    assert saturated.endswith("p50 400.00 x, p99 900.00 x; achieved 0.18 x offered")
    assert "t0 + k/100 s" in lines[-1] and "over 2 s after 0.5 s of warm-up" in lines[-1]
    # Skipping the open loop (runner --skip open-loop) leaves the closed-loop table only.
    assert db_latency.render(_points(), None) == closed


def test_the_json_entries_reach_the_plot(tmp_path: Path) -> None:
    entries = json.loads(json.dumps(db_latency.report(_points(), PLAN)))
    zero, _, twenty = entries
    assert zero["open_loop"]["rate"] == 100.0
    assert zero["open_loop"]["seconds"] == 2.0 and zero["open_loop"]["warmup_s"] == 0.5
    assert twenty["open_loop"]["appends"]["p99_ms"] == 9000
    assert twenty["open_loop"]["appends"]["errors"] == 12
    assert twenty["open_loop"]["cycles"]["ratio"].startswith("p50 16.25 x, p99 25.00 x")
    assert twenty["cycles"]["cycles_per_s"] == 36.0  # the closed-loop figures stay
    report = {"db_latency": entries}
    path = plots.db_latency_open_loop_plot(report, tmp_path)
    assert path == tmp_path / "postgres-open-loop-latency-vs-rtt.png"
    assert path.stat().st_size > 0
    assert path in plots.write_plots(report, tmp_path)


def test_without_the_open_loop_the_entries_say_none_and_nothing_is_drawn(tmp_path: Path) -> None:
    closed_only = [db_latency.Point(p.added_rtt_ms, p.appends, p.cycles) for p in _points()]
    entries = db_latency.report(closed_only, None)
    assert [e["open_loop"] for e in entries] == [None, None, None]
    assert db_latency.open_rows(closed_only) == []
    assert plots.db_latency_open_loop_plot({"db_latency": entries}, tmp_path) is None
