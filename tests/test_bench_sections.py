"""Every section of `python -m bench` at the smoke scale: real server processes, real
databases and the real load generator, a few hundred operations per measurement. What is
checked is the shape of what a section reports (its runs, its JSON, its goal figures,
the goal lines the runner prints); no figure is compared with anything: nothing here is
timed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench import (
    against,
    console,
    db_latency,
    feature_costs,
    open_loop,
    reads,
    runner,
    timetravel,
)
from bench.peers import goals
from bench.plan import SCALES, Context, Section
from bench.servers import BACKENDS, Backend
from tests.harness import postgres_unreachable_reason

pytestmark = pytest.mark.slow

SQLITE_FULL, POSTGRES = BACKENDS[0], BACKENDS[2]
_POSTGRES_DOWN = postgres_unreachable_reason()


@pytest.fixture(params=["sqlite-full", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "postgres" and _POSTGRES_DOWN:
        pytest.skip(_POSTGRES_DOWN)
    return next(b for b in BACKENDS if b.key == request.param)


def smoke(*backends: Backend) -> Context:
    return Context(SCALES["smoke"], backends, say=lambda _line: None)


def _measured(run: dict[str, Any]) -> bool:
    return bool(run["cycles"] > 0 and run["errors"] == 0)


def test_the_runner_measures_both_services_and_prints_every_goal_line(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "latest.json"
    only = "delivery,claim,sessions,peers"
    argv = ["--smoke", "--only", only, "--backends", backend.key, "--output", str(output)]
    assert runner.main(argv) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert len([line for line in lines if line.startswith("goal: ")]) == len(goals.GOALS)
    assert len([line for line in lines if line.startswith("target: ")]) == len(goals.TARGETS)
    issue_25 = [line for line in lines if line.startswith("goal (issue 25): ")]
    assert len(issue_25) == len(goals.GOALS_25)
    streamed = (
        "delivery-8-stream-sqlite" if backend is SQLITE_FULL else "delivery-8-stream-postgres"
    )
    [judged_25] = [g for g in goals.GOALS_25 if g.ours == streamed and g.theirs.startswith("deliv")]
    assert any(line.startswith(f"goal (issue 25): {judged_25.text}: ") for line in issue_25)
    assert any("MET (" in line for line in issue_25 if judged_25.text in line)
    floor_goal = "delivery-8-sqlite" if backend is SQLITE_FULL else "delivery-8-postgres"
    [judged] = [g for g in goals.GOALS if g.ours == floor_goal and g.theirs.startswith("delivery")]
    assert any(line.startswith(f"goal: {judged.text}: ") and "MET (" in line for line in lines)
    saved = json.loads(output.read_text())
    assert saved["scale"] == "smoke" and saved["backends"] == [backend.key]
    [delivery] = saved["sections"]["delivery"]["configurations"]
    assert [run["clients"] for run in delivery["runs"]] == [1, 8]
    assert all(_measured(run) for run in delivery["runs"] + delivery["extras"] + delivery["noop"])
    assert delivery["extras"][0]["rpcs_per_cycle"] == 2  # the begin_attempt cycle
    assert delivery["extras"][-1]["name"].endswith("over CallStream")  # ... carried
    [claimed] = saved["sections"]["claim"]["configurations"]
    assert claimed["claim"]["cycles"] == claimed["floor"]["cycles"] == 300
    assert claimed["claim"]["errors"] == 0
    [sessions] = saved["sections"]["sessions"]["configurations"]
    assert all(_measured(run) for run in sessions["runs"] + sessions["extras"])
    *turns, streamed_appends = sessions["extras"]
    assert [turn["extra"]["events"] for turn in turns] == [1000]
    assert streamed_appends["name"].endswith("over CallStream")
    assert streamed_appends["clients"] == 8 and streamed_appends["channels"] == 1
    assert saved["notes"] == [] or all("busy" in note for note in saved["notes"])
    drawn = {path.name for path in tmp_path.glob("*.png")}
    assert drawn == {"delivery-cycles-vs-clients.png", "session-appends-vs-clients.png"}


def test_a_failing_section_is_a_note_and_the_others_still_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_ctx: Context) -> Section:
        raise RuntimeError("no such table")

    monkeypatch.setitem(runner.SECTIONS, "timetravel", broken)
    argv = ["--smoke", "--only", "timetravel,peers", "--output", str(tmp_path / "r.json")]
    assert runner.main(argv) == 1
    printed = capsys.readouterr().out
    assert "note: section timetravel failed: RuntimeError: no such table" in printed
    assert (
        "target: Restart on a log of 1M events < 10 s: not measured (timetravel failed)" in printed
    )
    assert "In-process peers" in printed


def _run(section: Callable[[Context], Section], *backends: Backend) -> Section:
    done = section(smoke(*backends))
    assert done.notes == []
    return done


def test_open_loop_offers_each_rate_as_no_ops_then_for_real() -> None:
    done = _run(open_loop.run, SQLITE_FULL)
    runs = done.data["runs"]
    assert [(r["service"], r["op"]) for r in runs] == [
        ("delivery", "noop"),
        ("delivery", "work"),
        ("session", "noop"),
        ("session", "work"),
    ]
    assert all(r["measurement"]["extra"]["achieved_rate"] > 0 for r in runs)
    assert "baseline" in done.text and "p50 " in done.text


def test_timetravel_restarts_and_rewinds_every_log_of_both_series() -> None:
    done = _run(timetravel.run, SQLITE_FULL)
    points = [(r["events"], r["sessions"], r["series"]) for r in done.data["rows"]]
    assert points == [
        (200, 10, ["sessions"]),
        (200, 20, ["events", "sessions"]),
        (400, 20, ["events"]),
    ]
    assert all(r["restart_s"] > 0 and r["rewind_s"] > 0 for r in done.data["rows"])
    assert done.sides["rewind-100k"].missing == "not measured (smoke run)"


@pytest.mark.postgres
def test_db_latency_loads_each_service_behind_the_delaying_proxy() -> None:
    if _POSTGRES_DOWN:
        pytest.skip(_POSTGRES_DOWN)
    done = _run(db_latency.run, POSTGRES)
    points = done.data["points"]
    assert [p["added_rtt_ms"] for p in points] == [0.0, 5.0]
    for point in points:
        assert _measured(point["session"]) and _measured(point["delivery"])
        assert set(point["open_loop"]) == {"session", "delivery"}
    assert len(done.text.split("\n\n")) == 2  # the closed loop's table, the open loop's


def test_db_latency_says_why_without_postgres() -> None:
    done = db_latency.run(Context(SCALES["smoke"], [SQLITE_FULL], postgres_reason="refused"))
    assert done.data == {"points": []}
    assert done.notes == ["db-latency: skipped (postgres: refused)"]


def test_feature_costs_measure_every_variant_of_both_services() -> None:
    done = _run(feature_costs.run, SQLITE_FULL)
    found = [(c["service"], c["variant"]) for c in done.data["costs"]]
    assert found == [(s, v.name) for s in ("session", "delivery") for v in feature_costs.VARIANTS]
    assert all(_measured(c["measurement"]) for c in done.data["costs"])
    assert [c["ratio_to_bare"] for c in done.data["costs"]][::4] == [1.0, 1.0]


def test_reads_count_the_statements_of_each_read(backend: Backend) -> None:
    done = _run(reads.run, backend)
    assert [(p["sessions"], p["messages"]) for p in done.data["points"]] == [(20, 5), (20, 10)]
    for point in done.data["points"]:
        for read in ("list", "list_folded", "resolve"):
            assert point[read]["statements"] > 0 and point[read]["p50_ms"] > 0


def test_the_console_renders_every_log_and_feeds_every_browser(backend: Backend) -> None:
    done = _run(console.run, backend)
    [result] = done.data["results"]
    assert [r["events"] for r in result["renders"]] == [300, 600]
    tails = result["live_tail"]
    assert [t["browsers"] for t in tails] == list(console.BROWSERS)
    assert all(t["min_events_received"] == console.APPENDS for t in tails)


def test_against_runs_this_tree_beside_a_revision(backend: Backend) -> None:
    done = against.run("HEAD", smoke(backend))
    pairs = done.data["pairs"]
    assert [(p["workload"], p["backend"]) for p in pairs] == [
        (compared.name, backend.key) for compared in against.COMPARISONS
    ]
    assert [p["figure"] for p in pairs] == ["rate", "rate", "p50", "p99"]
    assert all(_measured(p["current"]) and _measured(p["release"]) for p in pairs)
