"""The ledger-by-hand example of the gateway guide (`reply.py`) keeps its promises,
on SQLite and on Postgres: two runs for one inbound message post once, a reply held
by a live instance is left to it, and the reply of a holder SIGKILLed mid-send is
redelivered with the marker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from switchboard_client import DeliveryClient
from switchboard_client.gateway import RECOVERED_MARKER

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from tests.docs.blocks import Block
from tests.docs.walk import BLOCK_TIMEOUT_S, DOCS, Run, block_env, blocks_of, run
from tests.harness import EventLoopThread, InProcessDelivery, delivery_server

PAGE = DOCS / "gateway-guide.md"
#: What the example's stand-in platform prints for each post: the test counts sends by it.
POSTED = "slack <- "


def example() -> Block:
    (block,) = [b for b in blocks_of(PAGE) if b.directive("file") == "reply.py"]
    return block


def posts(outcome: Run) -> list[str]:
    return [line for line in outcome.output.splitlines() if line.startswith(POSTED)]


@dataclass
class Example:
    """The example saved as a script, run as often as wanted against one ledger."""

    directory: Path
    delivery: InProcessDelivery

    def run(self) -> Run:
        script = self.directory / "reply.py"
        script.write_text(example().code)
        env = block_env(self.directory, "127.0.0.1:1", self.delivery.address)
        outcome = run([sys.executable, str(script)], self.directory, env)
        assert outcome.returncode == 0 and "Traceback" not in outcome.output, outcome.output
        return outcome


@pytest.fixture
def reply_example(
    database_url: str, loop_thread: EventLoopThread, tmp_path: Path
) -> Iterator[Example]:
    with delivery_server(loop_thread, database_url) as delivery:
        yield Example(tmp_path, delivery)


@pytest.fixture(scope="module")
def example_row(
    loop_thread: EventLoopThread, tmp_path_factory: pytest.TempPathFactory
) -> dpb.Obligation:
    """The row the example records, as a first run on a ledger of its own leaves it."""
    directory = tmp_path_factory.mktemp("example")
    with delivery_server(loop_thread, f"sqlite:///{directory / 'ledger.sqlite3'}") as delivery:
        Example(directory, delivery).run()
        (row,) = DeliveryClient(delivery.address).list()
    return row


def record_like(ledger: DeliveryClient, instance_id: str, row: dpb.Obligation) -> dpb.Obligation:
    """Records the reply the example records, as another instance of its gateway would."""
    return ledger.record(
        instance_id,
        session_key=row.session_key,
        content=row.content,
        platform=row.platform,
        chat_id=row.chat_id,
        message_ref=row.message_ref,
        begin_attempt=True,
    ).obligation


def test_the_example_run_twice_for_one_inbound_message_posts_once(
    reply_example: Example,
) -> None:
    first, second = reply_example.run(), reply_example.run()

    assert len(posts(first)) == 1, first.output
    assert posts(second) == [], second.output
    assert "delivered already" in second.output
    with DeliveryClient(reply_example.delivery.address) as ledger:
        (row,) = ledger.list()
        assert row.state == dpb.OBLIGATION_STATE_DELIVERED
        assert not ledger.instance(row.owner_instance_id).live  # it deregistered on stop


def test_the_example_leaves_a_reply_a_live_instance_is_sending_to_it(
    reply_example: Example, example_row: dpb.Obligation
) -> None:
    with DeliveryClient(reply_example.delivery.address) as ledger:
        other = ledger.register(example_row.gateway_name, ["slack"]).instance_id
        held = record_like(ledger, other, example_row)
        assert held.state == dpb.OBLIGATION_STATE_ATTEMPTING

        outcome = reply_example.run()

        assert posts(outcome) == [], outcome.output
        assert f"live instance {other}" in outcome.output
        assert ledger.get(held.id) == held  # untouched: same state, holder and fence


#: A gateway process that records the example's reply (straight into ATTEMPTING) on a
#: one-second lease, says so, and waits to be SIGKILLed before it sends.
_CRASHING_HOLDER = """
import json, sys, time
from switchboard_client import DeliveryClient
address, gateway, row = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ledger = DeliveryClient(address)
me = ledger.register(gateway, ["slack"], lease_ttl_s=1.0).instance_id
held = ledger.record(me, begin_attempt=True, **row).obligation
print(me, held.id, flush=True)
time.sleep(600)
"""


def crashed_holder(address: str, row: dpb.Obligation) -> tuple[str, str]:
    """Runs `_CRASHING_HOLDER`, SIGKILLs it once it holds the row, and waits until the
    ledger judges it dead (its lease lapsed). Returns its instance id and the row's id."""
    fields = {
        name: getattr(row, name)
        for name in ("session_key", "content", "platform", "chat_id", "message_ref")
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_HOLDER, address, row.gateway_name, json.dumps(fields)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        instance_id, row_id = holder.stdout.readline().split()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=BLOCK_TIMEOUT_S)
    with DeliveryClient(address) as ledger:
        deadline = time.monotonic() + BLOCK_TIMEOUT_S  # a hang guard, not a timing assert
        while ledger.instance(instance_id).live:
            assert time.monotonic() < deadline, f"{instance_id} stayed live after SIGKILL"
            time.sleep(0.2)
    return instance_id, row_id


def test_the_example_redelivers_a_killed_holders_reply_with_the_marker(
    reply_example: Example, example_row: dpb.Obligation
) -> None:
    crashed, row_id = crashed_holder(reply_example.delivery.address, example_row)
    with DeliveryClient(reply_example.delivery.address) as ledger:
        assert ledger.get(row_id).state == dpb.OBLIGATION_STATE_ATTEMPTING

        outcome = reply_example.run()

        (post,) = posts(outcome)
        assert RECOVERED_MARKER.strip() in post and example_row.content in post
        row = ledger.get(row_id)
        assert row.state == dpb.OBLIGATION_STATE_DELIVERED
        assert row.owner_instance_id not in ("", crashed)
