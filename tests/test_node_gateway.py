"""The Node reference gateway (clients/node/src/gateway.js) against the real services.

Each Node gateway is its own process (clients/node/test/support/gateway-process.js),
driven over stdin/stdout, on a test platform that appends every send to a file
(fsynced, so a SIGKILL loses nothing) and can SIGKILL its process between the
send and MarkDelivered. Crashed Node gateways are recovered by the Python
reference gateway and by another Node gateway, and the other way round: the two
share the marker, obligation ids, session keys and row metadata.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import RECOVERED_MARKER, Gateway, Turn
from switchboard_client.loopback import LoopbackPlatform

from delivery_service.state_machine import LedgerLimits
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.docs.blocks import read_blocks
from tests.harness import EventLoopThread, delivery_server, session_server

ROOT = Path(__file__).resolve().parents[1]
NODE_CLIENT = ROOT / "clients" / "node"
DRIVER = NODE_CLIENT / "test" / "support" / "gateway-process.js"
README = NODE_CLIENT / "README.md"
NODE, NPM = shutil.which("node"), shutil.which("npm")
#: The bot of tests/clients/gateway_process.py: only instances under this name claim its rows.
GATEWAY = "test-gateway"
DM = {"transport": "loopback", "chatType": "CHAT_TYPE_DM", "chatId": "chat-1", "userId": "u1"}
#: The lease of gateways that must stay live (the server's default here is 1 s, for
#: quick recovery of the ones that die): a loaded machine may hold heartbeats up for a while.
LIVE_LEASE_S = 5.0
QUESTION = "what is 6 x 7?"
ANSWER = f"answer to {QUESTION}"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        NODE is None or NPM is None,
        reason="node and npm not on PATH: the Node gateway's tests need Node.js 20+",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def node_modules() -> None:
    """What package-lock.json pins, installed once (tests/test_node_client.py does the same)."""
    lock = json.loads((NODE_CLIENT / "package-lock.json").read_text())
    wanted = {
        path: entry["version"]
        for path, entry in lock["packages"].items()
        if path and "version" in entry
    }
    installed = NODE_CLIENT / "node_modules" / ".package-lock.json"
    if installed.exists():
        have = json.loads(installed.read_text())["packages"]
        if all(have.get(path, {}).get("version") == version for path, version in wanted.items()):
            return
    assert NPM is not None
    result = subprocess.run(
        [NPM, "ci", "--no-audit", "--no-fund", "--prefer-offline"],
        cwd=NODE_CLIENT, capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "npm_config_update_notifier": "false"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@dataclass
class Services:
    sessions: SessionClient
    ledger: DeliveryClient
    session_address: str
    delivery_address: str


@pytest.fixture
def services(database_url: str, loop_thread: EventLoopThread) -> Iterator[Services]:
    # A killed gateway is dead within a second; a failed send is retried 0.2 s later.
    limits = LedgerLimits(lease_ttl_s=1.0, backoff_s=(0.2,))
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url, limits) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main")
        yield Services(sessions, ledger, session.address, delivery.address)


class NodeGateway:
    """One Node gateway process and the file its test platform writes sends to."""

    def __init__(self, services: Services, sends: Path, **config: Any) -> None:
        platform = {"name": "loopback", "file": str(sends), **config.pop("platform", {})}
        config = {
            "sessionAddress": services.session_address,
            "deliveryAddress": services.delivery_address,
            "name": GATEWAY,
            "agent": "main",
            "platforms": [platform],
            "leaseTtlS": LIVE_LEASE_S,
            **config,
        }
        assert NODE is not None
        self.stderr = sends.with_suffix(f".{os.getpid()}.{id(self)}.log")
        with self.stderr.open("w") as log:
            self.process = subprocess.Popen(
                [NODE, str(DRIVER), json.dumps(config)],
                cwd=NODE_CLIENT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                text=True, bufsize=1,
            )  # fmt: skip
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            (self.answers if "id" in message else self.events).put(message)
        self.answers.put({"id": None, "ok": False, "error": "the process exited"})

    def send(self, op: str, **fields: Any) -> int:
        """Sends a command without waiting for its answer; returns its id."""
        self._next_id += 1
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"id": self._next_id, "op": op, **fields}) + "\n")
        self.process.stdin.flush()
        return self._next_id

    def answer(self, command_id: int, timeout_s: float = 60) -> Any:
        message = self.answers.get(timeout=timeout_s)
        assert message["ok"], f"{message['error']}\n--- stderr ---\n{self.log()}"
        assert message["id"] == command_id, message
        return message["result"]

    def call(self, op: str, **fields: Any) -> Any:
        return self.answer(self.send(op, **fields))

    def event(self, timeout_s: float = 60) -> dict[str, Any]:
        try:
            return self.events.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no event from the gateway\n{self.log()}") from None

    def handle(self, text: str, message_ref: str) -> int:
        return self.send("handle", inbound={"source": DM, "text": text, "messageRef": message_ref})

    def wait_killed(self) -> None:
        """The test platform SIGKILLs the process between send and mark."""
        assert self.process.wait(timeout=60) == -signal.SIGKILL, self.log()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.call("stop")
            assert self.process.wait(timeout=30) == 0, self.log()

    def log(self) -> str:
        return self.stderr.read_text()


@pytest.fixture
def node_gateways(tmp_path: Path, services: Services) -> Iterator[Callable[..., NodeGateway]]:
    """Starts Node gateways; every one still running at the end is SIGKILLed."""
    started: list[NodeGateway] = []

    def start(sends: str = "sends.jsonl", **config: Any) -> NodeGateway:
        gateway = NodeGateway(services, tmp_path / sends, **config)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        if gateway.process.poll() is None:
            gateway.kill()


def sends(path: Path) -> list[dict[str, str]]:
    """What a test platform sent, in order (every process appends to the file)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(
    condition: Callable[[], bool], what: str, tick: Callable[[], object] = lambda: None
) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        tick()
        time.sleep(0.05)


def history(services: Services) -> list[tuple[int, str]]:
    session = services.sessions.resolve(
        "main", transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1"
    ).session
    messages = services.sessions.history("main", session.session_id, limit=100)
    return [(q.message.role, q.message.content) for q in messages]


def resumable(services: Services) -> list[pb.Session]:
    return list(services.sessions.list_resumable("main").sessions)


def dead(services: Services, instance_id: str) -> bool:
    return not services.ledger.instance(instance_id).live


def crash_node_between_send_and_mark(
    node_gateways: Callable[..., NodeGateway], services: Services, file: Path
) -> dpb.Obligation:
    """A Node gateway sends the reply, then dies before MarkDelivered."""
    crashing = node_gateways(file.name, platform={"mode": "die-after-send"}, leaseTtlS=None)
    crashing.call("start")
    crashing.handle(QUESTION, "m-1")
    crashing.wait_killed()
    [first] = sends(file)
    assert first["text"] == ANSWER, "the first send went out, without marker"
    [owed] = list(services.ledger.list())
    assert owed.state == dpb.OBLIGATION_STATE_ATTEMPTING
    assert owed.id == first["key"], "the obligation id is the idempotency key"
    assert dict(owed.metadata) == {
        "agent": "main",
        "session_id": owed.metadata["session_id"],
        "inbox_through": owed.metadata["inbox_through"],
    }
    return owed


def assert_recovered_once_with_marker(services: Services, owed: dpb.Obligation) -> None:
    row = services.ledger.get(owed.id)
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED
    assert row.attempts == 1, "one claim"
    assert history(services) == [(pb.ROLE_USER, QUESTION), (pb.ROLE_ASSISTANT, ANSWER)], (
        "the turn was completed, not re-run"
    )
    assert resumable(services) == []


# -- a full turn, heartbeats ------------------------------------------------------------


def test_a_full_turn_and_heartbeats_keep_the_gateway_live(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    gateway = node_gateways(leaseTtlS=2.0)
    started = gateway.call("start")
    assert started["connected"] == ["loopback"]
    instance_id = started["instanceId"]
    assert gateway.answer(gateway.handle("hello", "m-1")) == "answer to hello"
    assert gateway.answer(gateway.handle("again", "m-2")) == "answer to again"
    assert [s["text"] for s in sends(tmp_path / "sends.jsonl")] == [
        "answer to hello",
        "answer to again",
    ]
    assert history(services) == [
        (pb.ROLE_USER, "hello"),
        (pb.ROLE_ASSISTANT, "answer to hello"),
        (pb.ROLE_USER, "again"),
        (pb.ROLE_ASSISTANT, "answer to again"),
    ]
    rows = list(services.ledger.list())
    assert [row.state for row in rows] == [dpb.OBLIGATION_STATE_DELIVERED] * 2
    assert {row.owner_instance_id for row in rows} == {instance_id}
    assert [event["last"] for event in (gateway.event(), gateway.event())] == ["hello", "again"]
    assert resumable(services) == []
    # The platform hands "hello" over again (an event retry): no second turn, nothing sent.
    assert gateway.answer(gateway.handle("hello", "m-1")) == ""
    assert gateway.events.empty(), "the agent was not called again"
    assert len(sends(tmp_path / "sends.jsonl")) == 2
    assert len(list(services.ledger.list())) == 2
    assert resumable(services) == []

    # Two leases (2 s each) on, the instance is still live: heartbeats extend it.
    first = services.ledger.instance(instance_id)

    def two_leases_later() -> bool:
        instance = services.ledger.instance(instance_id)
        assert instance.live, "the lease ran out: heartbeats stopped"
        beat = instance.heartbeat_time.ToNanoseconds() - first.register_time.ToNanoseconds()
        return beat > 4_000_000_000

    wait_for(two_leases_later, "no heartbeat two leases after registering")
    assert services.ledger.instance(instance_id).platforms == ["loopback"]
    gateway.stop()
    stopped = services.ledger.instance(instance_id)
    assert not stopped.live and stopped.HasField("deregister_time"), "deregistered on stop"


def test_a_failed_send_is_retried_by_a_periodic_claim_and_the_turn_finished_once(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    gateway = node_gateways(platform={"mode": "fail-once"}, claimEveryMs=200)
    gateway.call("start")
    gateway.answer(gateway.handle("hello", "m-1"))  # a 503, with retry_after 0.2 s
    [row] = list(services.ledger.list())
    wait_for(
        lambda: bool(sends(tmp_path / "sends.jsonl")) and resumable(services) == [],
        "the retried reply did not go out and finish the turn",
    )
    gateway.stop()
    assert [s["text"] for s in sends(tmp_path / "sends.jsonl")] == [
        RECOVERED_MARKER + "answer to hello"
    ]
    delivered = services.ledger.get(row.id)
    assert (delivered.state, delivered.attempts) == (dpb.OBLIGATION_STATE_DELIVERED, 1)
    assert history(services) == [(pb.ROLE_USER, "hello"), (pb.ROLE_ASSISTANT, "answer to hello")], (
        "the reply is in the history once: the failure ended the turn, the retry added nothing"
    )


# -- kill rounds ------------------------------------------------------------------------


def test_a_node_gateway_killed_between_send_and_mark_is_recovered_by_the_python_gateway(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    file = tmp_path / "node.jsonl"
    owed = crash_node_between_send_and_mark(node_gateways, services, file)

    class Offline(LoopbackPlatform):
        def connect(self) -> None:
            raise ConnectionError("the platform is down")

    def python_gateway(platform: LoopbackPlatform) -> Gateway:
        def echo(turn: Turn) -> str:
            return f"answer to {turn.state.state.inbox[-1].message.content}"

        return Gateway(
            GATEWAY, "main", services.sessions, services.ledger, [platform], echo,
            heartbeat_s=0.2, claim_every_s=3600,
        )  # fmt: skip

    offline = Offline()
    down = python_gateway(offline)
    down.start()
    try:
        wait_for(lambda: dead(services, owed.owner_instance_id), "the crashed instance lives on")
        assert down.recover() == 0, "nothing claimed for a platform it has not connected"
    finally:
        down.stop()
    assert offline.sent == []
    assert services.ledger.get(owed.id).attempts == 0, "no attempt spent"

    platform = LoopbackPlatform()
    rescuer = python_gateway(platform)
    rescuer.start()
    try:
        wait_for(lambda: bool(platform.sent), "nothing was redelivered", tick=rescuer.recover)
    finally:
        rescuer.stop()
    assert [(s.text, s.key) for s in platform.sent] == [(RECOVERED_MARKER + ANSWER, owed.id)]
    assert len(sends(file)) == 1, "the crashed gateway sent once"
    assert_recovered_once_with_marker(services, owed)


def test_a_node_gateway_killed_between_send_and_mark_is_recovered_by_another_node_gateway(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    file = tmp_path / "node.jsonl"
    owed = crash_node_between_send_and_mark(node_gateways, services, file)

    down = node_gateways(file.name, platform={"connectFails": True})
    assert down.call("start")["connected"] == []
    wait_for(lambda: dead(services, owed.owner_instance_id), "the crashed instance lives on")
    assert down.call("recover") == 0, "nothing claimed for a platform it has not connected"
    down.stop()
    assert len(sends(file)) == 1
    assert services.ledger.get(owed.id).attempts == 0, "no attempt spent"

    # A plain adapter (name, connect, send): the safe defaults put the marker on.
    rescuer = node_gateways(file.name, platform={"minimal": True})
    rescuer.call("start")
    wait_for(
        lambda: len(sends(file)) >= 2,
        "nothing was redelivered",
        tick=lambda: rescuer.call("recover"),
    )
    rescuer.stop()
    [first, again] = sends(file)
    assert (again["text"], again["key"]) == (RECOVERED_MARKER + ANSWER, owed.id)
    assert again["pid"] != first["pid"]
    assert_recovered_once_with_marker(services, owed)


def test_a_python_gateway_killed_mid_send_is_recovered_by_a_node_gateway(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    command = [
        sys.executable, "-m", "tests.clients.gateway_process",
        services.session_address, services.delivery_address,
    ]  # fmt: skip
    crashed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    [owed] = list(services.ledger.list())
    file = tmp_path / "node.jsonl"
    rescuer = node_gateways(file.name)
    rescuer.call("start")
    wait_for(
        lambda: bool(sends(file)), "nothing was redelivered", tick=lambda: rescuer.call("recover")
    )
    rescuer.stop()
    assert [(s["text"], s["key"]) for s in sends(file)] == [(RECOVERED_MARKER + ANSWER, owed.id)]
    assert_recovered_once_with_marker(services, owed)


def test_two_node_gateways_racing_claim_each_row_once(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    dying = services.ledger.register(GATEWAY, ["loopback"])
    owed = [
        services.ledger.record(
            dying.instance_id, session_key=f"agent:main:loopback:dm:c{n}", content=f"reply {n}",
            platform="loopback", chat_id=f"c{n}", message_ref=f"m-{n}", begin_attempt=True,
        ).obligation.id
        for n in range(20)
    ]  # fmt: skip
    services.ledger.deregister(dying.instance_id)  # its rows are claimable at once
    racers = [node_gateways(f"racer-{n}.jsonl") for n in range(2)]
    starts = [racer.send("start") for racer in racers]  # both boot (and claim) at once
    for racer, start in zip(racers, starts, strict=True):
        racer.answer(start)

    def everything_sent() -> bool:
        return sum(len(sends(tmp_path / f"racer-{n}.jsonl")) for n in range(2)) >= len(owed)

    def both_claim() -> None:
        for command in [(racer, racer.send("recover")) for racer in racers]:
            command[0].answer(command[1])

    wait_for(everything_sent, "not every row was redelivered", tick=both_claim)
    both_claim()  # one more round each: nothing is left to claim twice
    for racer in racers:
        racer.stop()
    sent = [s for n in range(2) for s in sends(tmp_path / f"racer-{n}.jsonl")]
    assert sorted(s["key"] for s in sent) == sorted(owed), "each row sent exactly once"
    assert all(s["text"].startswith(RECOVERED_MARKER) for s in sent)
    states = {services.ledger.get(row).state for row in owed}
    assert states == {dpb.OBLIGATION_STATE_DELIVERED}


def test_a_turn_is_left_to_its_live_holder_and_resumed_once_the_holder_dies(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    # A 2 s lease: live through the booting gateway's look, dead soon after the kill.
    holder = node_gateways("holder.jsonl", callback="hang", leaseTtlS=2.0)
    holder_id = holder.call("start")["instanceId"]
    holder.handle("hello", "m-1")  # never answered: the agent is "thinking"
    assert holder.event()["resumed"] is False
    [marked] = resumable(services)
    assert marked.resume_holder == holder_id

    booting = node_gateways("booting.jsonl", claimEveryMs=200)
    booting.call("start")
    assert booting.call("deferred") == [marked.session_id], "left to its live holder"
    assert booting.events.empty(), "the booting gateway did not run the turn"
    holder.kill()

    resumed = booting.event()  # a periodic claim, once the holder's lease ran out
    assert (resumed["resumed"], resumed["last"]) == (True, "hello")
    file = tmp_path / "booting.jsonl"
    wait_for(lambda: resumable(services) == [], "the resumed turn was not finished")
    booting.stop()
    assert [s["text"] for s in sends(file)] == ["answer to hello"], "a fresh reply: no marker"
    assert sends(tmp_path / "holder.jsonl") == []
    assert history(services) == [(pb.ROLE_USER, "hello"), (pb.ROLE_ASSISTANT, "answer to hello")]
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED
    assert row.message_ref == f"resume:{marked.last_sequence}"


# -- one platform message, one turn -----------------------------------------------------


def test_one_message_given_to_two_node_gateways_runs_one_turn(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    first, second = node_gateways("first.jsonl"), node_gateways("second.jsonl")
    first.call("start")
    second.call("start")
    assert first.answer(first.handle("hello", "m-1")) == "answer to hello"
    assert second.answer(second.handle("hello", "m-1")) == "", "the update reached both"
    assert first.event()["last"] == "hello"
    assert second.events.empty(), "one agent turn"
    first.stop()
    second.stop()
    assert [s["text"] for s in sends(tmp_path / "first.jsonl")] == ["answer to hello"]
    assert sends(tmp_path / "second.jsonl") == []
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED
    assert history(services) == [(pb.ROLE_USER, "hello"), (pb.ROLE_ASSISTANT, "answer to hello")]
    assert resumable(services) == []


def test_a_message_given_twice_to_one_node_gateway_mid_turn_runs_one_turn(
    services: Services, node_gateways: Callable[..., NodeGateway]
) -> None:
    gateway = node_gateways(callback="hang")
    instance_id = gateway.call("start")["instanceId"]
    gateway.handle("hello", "m-1")  # thinking, never answered
    assert gateway.event()["resumed"] is False
    assert gateway.answer(gateway.handle("hello", "m-1")) == "", "the retry runs no turn"
    assert gateway.events.empty(), "the agent was called once"
    [marked] = resumable(services)
    assert marked.resume_holder == instance_id, "the turn is still this instance's"


def test_a_retry_of_a_turn_that_failed_in_a_node_gateway_runs_it_there_once(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    """The agent threw (the platform got no answer and retries): the retry is a
    duplicate post, and the turn it belongs to failed in this very process."""
    gateway = node_gateways(callback="fail-once")
    gateway.call("start")
    command = gateway.handle("hello", "m-1")
    failed = gateway.answers.get(timeout=60)
    assert failed["id"] == command and not failed["ok"] and "the model is down" in failed["error"]
    assert gateway.answer(gateway.handle("hello", "m-1")) == "answer to hello"
    assert [gateway.event()["resumed"] for _ in range(2)] == [False, False]
    gateway.stop()
    assert [s["text"] for s in sends(tmp_path / "sends.jsonl")] == ["answer to hello"]
    assert history(services) == [(pb.ROLE_USER, "hello"), (pb.ROLE_ASSISTANT, "answer to hello")]
    assert resumable(services) == []


def test_a_message_redelivered_to_another_node_gateway_mid_turn_is_resumed_once_its_holder_dies(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    """The platform retries to a second instance while the first thinks: no second
    turn; the first dies; the second resumes the turn once the first's lease ran out."""
    # Booted before the message: only the retry tells it of the turn.
    second = node_gateways("second.jsonl", claimEveryMs=200)
    second.call("start")
    holder = node_gateways("holder.jsonl", callback="hang", leaseTtlS=2.0)
    holder_id = holder.call("start")["instanceId"]
    holder.handle("hello", "m-1")  # never answered: the agent is "thinking"
    assert holder.event()["resumed"] is False
    [marked] = resumable(services)
    assert marked.resume_holder == holder_id

    assert second.answer(second.handle("hello", "m-1")) == ""
    assert second.call("deferred") == [marked.session_id], "left to its live holder"
    assert second.events.empty(), "no second turn"
    [still] = resumable(services)
    assert still.resume_holder == holder_id, "the duplicate left the mark alone"
    holder.kill()

    resumed = second.event()  # a periodic claim, once the holder's lease ran out
    assert (resumed["resumed"], resumed["last"]) == (True, "hello")
    wait_for(lambda: resumable(services) == [], "the resumed turn was not finished")
    second.stop()
    assert [s["text"] for s in sends(tmp_path / "second.jsonl")] == ["answer to hello"]
    assert sends(tmp_path / "holder.jsonl") == []
    assert history(services) == [(pb.ROLE_USER, "hello"), (pb.ROLE_ASSISTANT, "answer to hello")]
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED


# -- the README's examples --------------------------------------------------------------

#: ```js blocks run as written; ```sh blocks are shell commands for people (npm pack, npm ci).
NOT_RUN = {"sh", "text"}


def test_every_js_block_of_the_node_readme_runs_against_the_services(
    services: Services, tmp_path: Path
) -> None:
    found = read_blocks(README)
    unmarked = [block.where for block in found if block.language not in NOT_RUN | {"js"}]
    assert not unmarked, f"blocks neither run nor marked shell or text: {unmarked}"
    blocks = [block.code for block in found if block.language == "js"]
    assert len(blocks) >= 2, "the client example and the gateway example"
    environment = {
        **os.environ,
        "SWITCHBOARD_SESSION_ADDRESS": services.session_address,
        "SWITCHBOARD_DELIVERY_ADDRESS": services.delivery_address,
    }
    for number, block in enumerate(blocks, 1):
        # Inside the package, so that `@switchboard/client` resolves to it by name.
        script = NODE_CLIENT / f".readme-block-{os.getpid()}-{number}.mjs"
        script.write_text(block)
        try:
            assert NODE is not None
            result = subprocess.run(
                [NODE, str(script)], cwd=tmp_path, env=environment,
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
        finally:
            script.unlink()
        assert result.returncode == 0, f"block {number}:\n{block}\n{result.stdout}{result.stderr}"
