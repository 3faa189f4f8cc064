"""The bench section `openai-agents` at the smoke scale: both stores measured on each
operation and client count, no errors, the ratio table rendered. Nothing is timed."""

from __future__ import annotations

import pytest

from bench import openai_agents_session
from bench.plan import SCALES, Context
from bench.servers import BACKENDS
from tests.harness import postgres_unreachable_reason

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "backend_key", ["sqlite-full", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_section_measures_both_stores(backend_key: str) -> None:
    if backend_key == "postgres" and (down := postgres_unreachable_reason()):
        pytest.skip(down)
    backend = next(b for b in BACKENDS if b.key == backend_key)
    done = openai_agents_session.run(Context(SCALES["smoke"], [backend], say=lambda _: None))

    assert set(done.data) == {"SQLiteSession", f"Switchboard {backend.label}", "no-op"}
    noops = done.data.pop("no-op")
    # The no-op RPC on the adapter's server at each client count, beside SQLiteSession.
    assert [(n["server"], n["clients"]) for n in noops] == [
        (backend.label, clients) for clients in openai_agents_session.CLIENTS
    ]
    assert all(n["errors"] == 0 for n in noops), noops
    for clients in openai_agents_session.CLIENTS:
        line = f"no-op RPC (Health/Check), {clients} client{'s' * (clients > 1)}, "
        assert f"{line}{backend.label} server: " in done.text
    assert "x SQLiteSession get_items" in done.text
    for runs in done.data.values():
        found = [(run["name"].split()[-1], run["clients"]) for run in runs]
        assert found == [
            (op, clients)
            for op in openai_agents_session.OPERATIONS
            for clients in openai_agents_session.CLIENTS
        ]
        # No count is asserted: a smoke window on a busy machine may close before an
        # operation does (a failed operation would have raised).
        assert all(run["errors"] == 0 for run in runs), runs
    assert "get_items, 8 clients" in done.text and "x)" in done.text
