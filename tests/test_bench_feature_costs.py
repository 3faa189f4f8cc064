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
