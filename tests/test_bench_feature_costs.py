"""bench.feature_costs on fixed measurements (nothing timed): each variant switches
what it says, and every ratio is to the bare run of the same service."""

from __future__ import annotations

from bench import feature_costs
from bench.stats import Measurement


def _measured(rate: float) -> Measurement:
    return Measurement(
        name="m", clients=8, window_s=1.0, cycles=int(rate), p50_ms=1, p99_ms=2, mean_ms=1
    )


def test_each_variant_switches_only_its_feature() -> None:
    by_name = {v.name: v for v in feature_costs.VARIANTS}
    assert by_name["bare"].server_args() == ["--access-log", "off"]
    assert by_name["bare"].loadgen_env() == {"SWITCHBOARD_BENCH_REQUEST_IDS": "0"}
    assert by_name["+ access log"].server_args() == []  # the default: --access-log all
    assert by_name["+ access log"].loadgen_env()["SWITCHBOARD_BENCH_REQUEST_IDS"] == "0"
    assert by_name["+ request ids"].server_args() == ["--access-log", "off"]
    assert by_name["+ request ids"].loadgen_env()["SWITCHBOARD_BENCH_REQUEST_IDS"] == "1"
    assert by_name["as deployed"].server_args() == []
    assert by_name["as deployed"].loadgen_env()["SWITCHBOARD_BENCH_REQUEST_IDS"] == "1"


def test_ratios_are_to_the_bare_run_of_the_same_service() -> None:
    bare, logged = _measured(1000), _measured(800)
    costs = [
        feature_costs.Cost("session", feature_costs.VARIANTS[0], bare, bare),
        feature_costs.Cost("session", feature_costs.VARIANTS[1], logged, bare),
    ]
    assert [round(c.ratio, 3) for c in costs] == [1.0, 0.8]
    table = feature_costs.render(costs)
    assert "1.000 x" in table and "0.800 x" in table
    report = feature_costs.report(costs)
    assert [r["ratio_to_bare"] for r in report] == [1.0, 0.8]
    assert report[1]["access_log"] is True and report[1]["request_ids"] is False


def test_the_stream_ceiling_table_compares_each_shape_with_unary_at_the_same_clients() -> None:
    from bench import stream_ceiling

    rows = [
        {"shape": "unary", "clients": 8, "per_s": 2000.0},
        {"shape": "stream", "clients": 8, "per_s": 7000.0},
    ]
    table = stream_ceiling.render(rows)
    assert "1.00 x" in table and "3.50 x" in table


def test_the_stream_ceiling_measures_both_shapes_for_real() -> None:
    from bench import stream_ceiling

    rows = stream_ceiling.measure(seconds=0.5, warmup_s=0.2)
    assert {(r["shape"], r["clients"]) for r in rows} == {
        (shape, clients) for shape in ("unary", "stream") for clients in stream_ceiling.CLIENTS
    }
    assert all(r["per_s"] > 0 for r in rows)


def test_two_processes_are_compared_with_one_of_the_same_service_and_backend() -> None:
    from bench import processes

    points = [
        processes.Point("delivery", "sqlite-full", 1, 400.0, 0, 0.9),
        processes.Point("delivery", "sqlite-full", 2, 300.0, 0, 1.2),
        processes.Point("delivery", "postgres", 1, 200.0, 0, 0.5),
        processes.Point("delivery", "postgres", 2, 300.0, 0, 0.8),
    ]
    table = processes.render(points)
    assert "0.75 x" in table and "1.50 x" in table
