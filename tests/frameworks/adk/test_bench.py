"""The bench section `adk` at the smoke scale: the adapter against a real server process
beside ADK's own services (or their "skipped" lines when the bench extra is missing).
Only the shape of what it reports is checked; nothing here is timed."""

from __future__ import annotations

import pytest

from bench import adk_adapter
from bench.plan import SCALES, Context
from bench.servers import BACKENDS

pytestmark = pytest.mark.slow


def test_the_adk_section_measures_the_adapter_and_sets_each_adk_service_beside_it() -> None:
    done = adk_adapter.run(Context(SCALES["smoke"], [BACKENDS[0]], say=lambda _line: None))
    assert done.notes == []
    results = {result["key"]: result for result in done.data["results"]}
    for figure in ("append", "get-warm", "get-cold", "noop"):
        measured = results[f"adk-adapter-{figure}-sqlite-full"]["measurement"]
        assert measured["cycles"] > 0 and measured["errors"] == 0
    for peer in ("adk-database", "adk-sqlite"):
        for figure in ("append", "get-session"):
            result = results[f"{peer}-{figure}"]
            assert result["measurement"] or result["skipped"].startswith("skipped (")
    assert set(done.data["ratios"]) == {"sqlite-full/adk-database", "sqlite-full/adk-sqlite"}
    assert "append_event >= 3x ADK DatabaseSessionService" in done.text
    # The no-op RPC on the adapter's server, set beside ADK's database service.
    assert "no-op RPC (Health/Check), 1 client, sqlite-full server: " in done.text
    assert {"noop_over_append", "get_session_over_noop"} <= set(
        done.data["ratios"]["sqlite-full/adk-database"]
    )
