"""The benchmark's goal lines, targets and peers (bench/peers): verdicts and wording on fixed
figures, and peers that cannot run (extra missing, Postgres down, a failing run) become
"skipped" lines instead of a crash. No figure here is measured; nothing is timed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bench import report, runner
from bench.peers import PEERS, Peer, PeerResult, goals, measure_all, render_table
from bench.peers.common import SKIPPED_NO_EXTRA
from bench.plan import SCALES, Context, Section
from bench.stats import Measurement

NOT_INSTALLED = "switchboard_bench_no_such_module"


def _rate(name: str, per_s: float, errors: int = 0) -> Measurement:
    return Measurement(name, 8, 1.0, int(per_s), 1.0, 2.0, 1.2, errors=errors)


def _latency(name: str, p50_ms: float) -> Measurement:
    return Measurement(name, 1, 1.0, 20, p50_ms, p50_ms * 2, p50_ms, rpcs_per_cycle=1)


def _absent_peers() -> list[Peer]:
    """Every registered peer, as if the bench extra were not installed."""
    return [dataclasses.replace(peer, modules=(NOT_INSTALLED,)) for peer in PEERS]


def _measured_peers() -> list[PeerResult]:
    def rate(key: str, per_s: float) -> PeerResult:
        return PeerResult(key, key, "rate", _rate(key, per_s))

    return [
        rate("openai-agents-add-items-1", 3000),
        rate("openai-agents-add-items-8", 3600),
        rate("adk-database-append", 250),
        rate("adk-sqlite-append", 400),
        PeerResult("adk-database-get-session", "adk db get", "latency", _latency("g", 46.0)),
        PeerResult("adk-sqlite-get-session", "adk sqlite get", "latency", _latency("g", 30.0)),
        rate("procrastinate-job-cycle", 500),
    ]


def test_a_goal_at_or_above_its_factor_is_met_and_below_it_is_not() -> None:
    goal = goals.Goal("X >= 2x Y", "ours", "theirs", 2.0)
    assert goals.judge(goal, goals.Side("ours", 200.0), goals.Side("theirs", 100.0)).met is True
    below = goals.judge(goal, goals.Side("ours", 199.0), goals.Side("theirs", 100.0))
    assert below.met is False
    assert below.ratio == 1.99
    assert below.line == "goal: X >= 2x Y: NOT MET (1.99x: ours 199/s vs theirs 100/s)"


def test_a_latency_goal_is_met_at_or_below_its_fraction() -> None:
    goal = goals.Goal("load <= 1/10 of theirs", "ours", "theirs", 0.1, at_least=False)
    fast = goals.judge(goal, goals.Side("ours", 1.5, "ms"), goals.Side("theirs", 46.0, "ms"))
    assert fast.met is True
    assert fast.line == (
        "goal: load <= 1/10 of theirs: MET (0.03x: ours 1.50 ms vs theirs 46.00 ms)"
    )
    slow = goals.judge(goal, goals.Side("ours", 4.7, "ms"), goals.Side("theirs", 46.0, "ms"))
    assert slow.met is False


def test_errors_in_switchboard_figure_fail_a_goal_its_ratio_would_meet() -> None:
    goal = goals.Goal("X >= 1x Y", "ours", "theirs", 1.0)
    verdict = goals.judge(goal, goals.Side("ours", 500.0, errors=3), goals.Side("theirs", 100.0))
    assert verdict.met is False
    assert verdict.line.endswith("(5.00x: ours 500/s vs theirs 100/s, 3 error(s))")


def test_a_missing_figure_prints_its_reason_and_no_verdict() -> None:
    goal = goals.Goal("X >= 1x Y", "ours", "theirs", 1.0)
    verdict = goals.judge(
        goal, goals.Side("ours", 500.0), goals.Side("theirs", missing=SKIPPED_NO_EXTRA)
    )
    assert verdict.met is None and verdict.ratio is None
    assert verdict.line == "goal: X >= 1x Y: skipped (pip install -e '.[bench]')"
    zero = goals.judge(goal, goals.Side("ours", 500.0), goals.Side("theirs", 0.0))
    assert zero.met is None and "not measured" in zero.line


def test_peer_sides_take_the_best_peer_figure() -> None:
    sides = goals.peer_sides(_measured_peers())
    assert sides["openai-agents"].value == 3600  # the faster of 1 and 8 clients
    assert sides["adk-append"].value == 400  # the faster ADK service
    assert sides["adk-get-session"].value == 30.0  # the quicker load
    assert sides["adk-get-session"].unit == "ms"
    assert sides["procrastinate"].value == 500


def test_every_goal_line_of_a_full_run_on_fixed_figures() -> None:
    sides = {
        "appends-1": goals.Side("AppendEvents, 1 client", 1092.0),
        "appends-8": goals.Side("AppendEvents, 8 clients", 2335.0),
        "delivery-8-sqlite": goals.Side("delivery sqlite", 2100.0),
        "delivery-floor-sqlite": goals.Side("sqlite floor", 2542.0),
        "delivery-8-postgres": goals.Side("delivery postgres", 1000.0),
        "delivery-floor-postgres": goals.Side("psycopg2 floor", 1600.0),
        "turn-1000": goals.Side("load", 1.46, "ms"),
        **goals.peer_sides(_measured_peers()),
    }
    verdicts = goals.judge_all(sides)
    assert [v.met for v in verdicts] == [False, False, True, False, True, True]
    assert [round(v.ratio or 0, 3) for v in verdicts] == [0.649, 2.73, 0.826, 0.625, 2.0, 0.049]
    assert all(v.line.startswith("goal: ") for v in verdicts)
    assert all(("NOT MET" in v.line) != bool(v.met) for v in verdicts)


def test_without_the_extra_every_peer_is_skipped_and_so_are_its_goal_lines() -> None:
    said: list[str] = []
    results = measure_all(1.0, 0.5, 5, None, said.append, peers=_absent_peers())
    expected_keys = [key for peer in PEERS for key, _label, _kind in peer.figures]
    assert [r.key for r in results] == expected_keys
    assert all(r.measurement is None and r.skipped == SKIPPED_NO_EXTRA for r in results)
    assert len(said) == len(results)
    assert SKIPPED_NO_EXTRA in render_table(results)
    verdicts = goals.judge_all(goals.peer_sides(results))
    peer_lines = [v.line for v in verdicts if v.goal.theirs in goals.PEER_SIDES]
    assert len(peer_lines) == 4
    assert all(line.endswith("; skipped (pip install -e '.[bench]')") for line in peer_lines)
    # With Switchboard's side measured, the skip is all a peer's goal line says.
    sides = {**goals.peer_sides(results), "appends-8": goals.Side("AppendEvents", 2000.0)}
    assert goals.judge_all(sides)[0].line == (
        f"goal: {goals.GOALS[0].text}: skipped (pip install -e '.[bench]')"
    )


def test_postgres_down_skips_only_the_postgres_peer_with_its_reason() -> None:
    installed = [dataclasses.replace(peer, modules=("json",)) for peer in PEERS]
    needs_postgres = [peer for peer in installed if peer.postgres]
    results = measure_all(1.0, 0.5, 5, "connection refused", lambda _: None, needs_postgres)
    assert [r.skipped for r in results] == ["skipped (postgres: connection refused)"]


def test_a_peer_run_that_fails_is_skipped_with_its_last_words() -> None:
    # A real child process that exits non-zero (no peer of that name exists).
    broken = Peer("no-such-peer", ("json",), (("broken-rate", "broken peer", "rate"),))
    [result] = measure_all(0.1, 0.0, 1, None, lambda _: None, [broken])
    assert result.measurement is None
    assert result.skipped.startswith("skipped (failed, exit 1: ")
    assert "unknown peer 'no-such-peer'" in result.skipped


def test_the_runner_names_what_was_not_selected_or_failed() -> None:
    peers = Section("peers", "", "", {}, goals.peer_sides(_measured_peers()))
    verdicts = runner.judge([peers], ["peers", "delivery"])
    lines = {v.goal.text: v.line for v in verdicts}
    assert lines[goals.GOALS[0].text].endswith(": not measured (sessions not selected)")
    assert lines[goals.GOALS[3].text].endswith(": not measured (delivery failed)")
    without_peers = runner.judge([], ["delivery"])
    theirs = {v.theirs.missing for v in without_peers if v.goal.theirs in goals.PEER_SIDES}
    assert theirs == {"not measured (peers not selected)"}


def test_an_unreachable_postgres_is_named_in_the_figures_it_leaves_out() -> None:
    ctx = Context(SCALES["smoke"], [], postgres_reason="refused")
    assert ctx.missing("postgres") == "skipped (postgres: refused)"
    assert ctx.missing("sqlite-full") == "not measured (sqlite-full not selected)"


def test_targets_are_judged_against_their_fixed_figures() -> None:
    sides = {
        **goals.TARGET_SIDES,
        "delivery-8-sqlite": goals.Side("delivery", 1500.0),
        "appends-8": goals.Side("appends", 2499.0),
        "turn-1000": goals.Side("load", 2.9, "ms"),
        "rewind-100k": goals.Side("rewind", 2.4, "s"),
        "restart-1m": goals.Side("restart", missing="not measured (quick run)"),
    }
    verdicts = goals.judge_all(sides, goals.TARGETS)
    assert [v.met for v in verdicts] == [True, False, True, False, None]
    assert verdicts[3].line.endswith("NOT MET (1.20x: rewind 2.400 s vs target 2.000 s)")
    assert verdicts[4].line.endswith(": not measured (quick run)")


def test_peer_results_survive_the_json_report_and_reach_the_plots(tmp_path: Path) -> None:
    results = [*_measured_peers(), PeerResult("langgraph-put", "lg", "rate", skipped="skipped")]
    again = [PeerResult.from_json(json.loads(json.dumps(r.to_json()))) for r in results]
    assert [(r.key, r.value, r.skipped) for r in again] == [
        (r.key, r.value, r.skipped) for r in results
    ]
    saved: dict[str, Any] = {"sections": {"peers": {"results": [r.to_json() for r in results]}}}
    drawn = report.measured_peers(saved, report.SESSION_PEERS)
    assert [p["key"] for p in drawn] == [
        "openai-agents-add-items-1",
        "openai-agents-add-items-8",
        "adk-database-append",
        "adk-sqlite-append",
    ]  # the skipped LangGraph figure draws no line
    run = _rate("SQLite FULL", 2000).to_json()
    config = {"backend": "sqlite-full", "label": "SQLite FULL", "runs": [run], "noop": []}
    saved["sections"]["sessions"] = {
        "title": "appends",
        "unit": "appends",
        "floors": {},
        "configurations": [config],
    }
    path = report.throughput_plot(saved, "sessions", tmp_path)
    assert path == tmp_path / "session-appends-vs-clients.png"
