"""The bench section `langgraph` at the smoke scale, on each backend: a real server
process, real savers; what is checked is the shape of what it reports (every store,
step count and client count measured, no errors), never a figure."""

from __future__ import annotations

import pytest

from bench import langgraph_checkpoints
from bench.plan import SCALES, Context
from bench.servers import BACKENDS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "backend_key", ["sqlite-full", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_section_measures_the_saver_at_each_length_and_client_count(backend_key: str) -> None:
    backend = next(b for b in BACKENDS if b.key == backend_key)
    section = langgraph_checkpoints.run(Context(SCALES["smoke"], [backend], say=lambda _: None))
    runs = section.data["runs"]
    ours = {(r["steps"], r["clients"]) for r in runs if r["store"] == "SwitchboardSaver"}
    assert ours == {(s, c) for s in section.data["steps"] for c in langgraph_checkpoints.CLIENTS}
    for run in runs:
        for op in ("put", "get_tuple"):
            assert run[op]["cycles"] > 0 and run[op]["errors"] == 0, (run["store"], op)
    assert not [note for note in section.notes if "error" in note]
    assert "get_tuple p50 at" in section.text
    # The no-op RPC on the saver's server, at each client count, beside the in-process saver.
    noops = section.data["no-op"]
    assert [(n["backend"], n["clients"]) for n in noops] == [
        (backend.label, c) for c in langgraph_checkpoints.CLIENTS
    ]
    assert all(n["errors"] == 0 for n in noops), noops
    for clients in langgraph_checkpoints.CLIENTS:
        line = f"no-op RPC (Health/Check), {clients} client{'s' * (clients > 1)}, "
        assert f"{line}{backend.label} server: " in section.text
    if any(r["store"] != "SwitchboardSaver" for r in runs):  # with the bench extra
        assert "x SqliteSaver get_tuple @" in section.text or "x PostgresSaver get_tuple @" in (
            section.text
        )
    else:
        assert "(no in-process default measured beside it)" in section.text
