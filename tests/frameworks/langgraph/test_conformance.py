"""LangGraph's own checkpointer conformance suite (langgraph-checkpoint-conformance,
the version that goes with langgraph-checkpoint 4.3.2) against `SwitchboardSaver` on a
real server, both backends: every base and every extended capability must pass."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import EXTENDED_CAPABILITIES
from switchboard_client import SessionClient
from switchboard_client.frameworks.langgraph import SwitchboardSaver


def test_the_conformance_suite_passes_every_capability(client: SessionClient) -> None:
    async def fresh_saver() -> AsyncIterator[SwitchboardSaver]:
        # A fresh agent per capability suite: the suite reuses thread ids across suites.
        yield SwitchboardSaver(client, agent=f"lg-{uuid.uuid4().hex[:12]}")

    report = asyncio.run(validate(checkpointer_test(name="SwitchboardSaver")(fresh_saver)))
    report.print_report()
    for name, result in sorted(report.results.items()):
        print(f"{name}: {result.tests_passed} passed, {result.tests_failed} failed")
    failures = {
        name: result.failures for name, result in report.results.items() if not result.passed
    }
    assert report.passed_all_base(), failures
    for capability in EXTENDED_CAPABILITIES:
        result = report.results[capability.value]
        assert result.detected and result.passed, (capability.value, result)
    assert not failures
