"""The benchmarks' arithmetic and wiring on fixed figures, with no server and no timing:
open-loop ratios, the features' costs, the load generator's command line, tables and
plots drawn from a saved report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import feature_costs, loadgen, open_loop, report
from bench.stats import Measurement, Window


def _open(p50_ms: float, p99_ms: float, achieved: float = 100.0) -> Measurement:
    """An open-loop run as `bench.loadgen` reports it."""
    extra = {
        "offered_rate": 100.0,
        "achieved_rate": achieved,
        "start_lag_p99_ms": 0.5,
        "max_in_flight": 3,
    }
    return Measurement("op", 32, 2.0, int(2 * achieved), p50_ms, p99_ms, p50_ms, extra=extra)


def test_open_loop_runs_are_ratios_to_their_baseline() -> None:
    base, slower, behind = _open(5, 10), _open(25, 60), _open(2000, 9000, achieved=18.0)
    assert open_loop.versus(base, None) == "baseline; achieved 1.00 x offered"
    assert open_loop.versus(slower, base) == "p50 5.00 x, p99 6.00 x; achieved 1.00 x offered"
    assert open_loop.versus(behind, base) == "p50 400.00 x, p99 900.00 x; achieved 0.18 x offered"
    # Without a baseline that answered, there is no ratio.
    assert open_loop.latency_ratio(slower, _open(0, 0)) == "n/a"
    row = open_loop.open_row("+20 ms", behind, open_loop.versus(behind, base))
    assert row[2:7] == ("100", "18.0", "2000.00", "9000.00", "0.50")


def _rate(per_s: float) -> Measurement:
    return Measurement("m", 8, 1.0, int(per_s), 1.0, 2.0, 1.0, channels=1)


def test_each_variant_switches_only_its_feature() -> None:
    by_name = {v.name: v for v in feature_costs.VARIANTS}
    assert by_name["bare"].server_args() == ["--access-log", "off"]
    assert by_name["+ access log"].server_args() == []  # the default: --access-log all
    assert by_name["+ request ids"].server_args() == ["--access-log", "off"]
    assert by_name["as deployed"].server_args() == []
    assert [v.request_ids for v in feature_costs.VARIANTS] == [False, False, True, True]


def test_costs_are_ratios_to_the_bare_run_of_the_same_service() -> None:
    bare, logged = feature_costs.VARIANTS[:2]
    found = feature_costs.costs("session", {bare: _rate(1000), logged: _rate(800)})
    assert [c["ratio_to_bare"] for c in found] == [1.0, 0.8]
    assert found[1]["access_log"] is True and found[1]["request_ids"] is False
    table = feature_costs.render(found)
    assert "1.000 x" in table and "0.800 x" in table


def test_a_load_travels_to_the_generator_as_it_was_described() -> None:
    load = loadgen.Load("cycle2", clients=32, channels=2, rate=500.0, request_ids=True)
    arguments = load.arguments()
    assert "--workload=cycle2" in arguments and "--request-ids=1" in arguments
    assert "--warmup-s=1.0" in arguments and "--rate=500.0" in arguments
    built = loadgen.build(load)
    assert built.rpcs_per_op == 2 and built.request_ids


def test_the_request_ids_variable_sets_every_load_s_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SWITCHBOARD_BENCH_REQUEST_IDS", "1")
    assert loadgen.Load("append").request_ids
    monkeypatch.setenv("SWITCHBOARD_BENCH_REQUEST_IDS", "0")
    assert not loadgen.Load("append").request_ids


@pytest.mark.parametrize(
    ("load", "problem"),
    [
        (loadgen.Load("fly"), "workload must be one of"),
        (loadgen.Load("append", clients=0), "clients and channels must be >= 1"),
        (loadgen.Load("turn", events=0), "turn: events must be"),
        (loadgen.Load("claim"), "claim: expect must be >= 1"),
    ],
)
def test_an_impossible_load_is_refused_before_it_runs(load: loadgen.Load, problem: str) -> None:
    assert problem in load.problem()
    with pytest.raises(ValueError, match=problem):
        loadgen.run(None, load)  # type: ignore[arg-type]


def test_a_window_counts_what_ended_inside_it_and_times_what_also_began_there() -> None:
    window = Window(warmup_s=1.0, seconds=2.0, started=100.0)
    assert window.record(100.5, 101.5)  # began in the warm-up: counted, not timed
    assert window.record(101.5, 101.75, items=3)
    assert not window.record(102.5, 103.5)  # ended after the window
    assert (window.completed, window.latencies) == (4, [0.25])


def test_tables_align_figures_right_and_names_left() -> None:
    text = report.table(("name", "rate", "remark"), [("a", "1.0", "x"), ("bb", "10.0", "y")], "n")
    assert text.splitlines() == [
        "name  rate  remark",
        "------------------",
        "a      1.0  x",
        "bb    10.0  y",
        "(n)",
    ]


def test_the_db_latency_plots_are_drawn_from_a_saved_report(tmp_path: Path) -> None:
    def point(added: float, rate: float) -> dict[str, Any]:
        m = _rate(rate).to_json()
        return {
            "added_rtt_ms": added,
            "session": m,
            "delivery": m,
            "open_loop": {"session": _open(5, 9).to_json(), "delivery": _open(8, 16).to_json()},
        }

    saved = json.loads(
        json.dumps(
            {
                "sections": {
                    "db-latency": {"open_loop_rate": 100.0, "points": [point(0, 570), point(5, 66)]}
                }
            }
        )
    )
    drawn = report.write_plots(saved, tmp_path)
    assert drawn == [
        tmp_path / "postgres-throughput-vs-latency.png",
        tmp_path / "postgres-open-loop-latency-vs-rtt.png",
    ]
    assert all(path.stat().st_size > 0 for path in drawn)
    # A report without the section draws nothing.
    assert report.write_plots({"sections": {}}, tmp_path / "none") == []
