"""Every read answers a state that existed, while rewinds and checkouts race it (issue 21
item 5): two real `switchboard serve session` processes on one database (a Postgres
schema, or one SQLite file).

One racer changes the agent's memory, appends to its session, rewinds and checks out
through replica A, and after each change reads the state back (alone, so that read is
the state that change made): versions never repeat, so a version names one state.
Readers on both replicas meanwhile call the reads of several statements in a loop:
GetAgent (a snapshot and the events after it), GetSessionState, GetHistory and
ListLogEvents (the rows' sizes, then the rows that fit). An answer that pairs a version
with another memory, or lists a history or a page of the log that no state had, is
torn; there must be none. `SWITCHBOARD_CHAOS_ROUNDS` sets how many rounds of
`ROUND_S` seconds run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

import grpc
import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.chaos.common import (
    DEADLINE,
    ROUNDS,
    Processes,
    channel_to,
    join_all,
    rpc_code,
    seeded,
)
from tests.session.conftest import append, create_agent, resolve, user_message, web

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE]

ROUND_S = 3.0
READERS = 4
#: Snapshots often, so that rewinds abandon them (what a torn GetAgent reads).
SNAPSHOT_EVERY = "5"
CALL_TIMEOUT_S = 30.0
MEMORY_VALUE_BYTES = 16 * 1024


@dataclass
class _States:
    """What the racer saw after each of its changes, by what names a state."""

    agents: dict[int, dict[str, str]] = field(default_factory=dict)
    sessions: dict[int, tuple[int, int]] = field(default_factory=dict)
    histories: set[tuple[str, ...]] = field(default_factory=set)
    log_pages: set[tuple[int, ...]] = field(default_factory=set)


@dataclass
class _Answers:
    """What one reader was answered."""

    agents: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    sessions: list[tuple[int, tuple[int, int]]] = field(default_factory=list)
    histories: list[tuple[str, ...]] = field(default_factory=list)
    log_pages: list[tuple[int, ...]] = field(default_factory=list)


class _Reads:
    """The reads of one stub, as the racer records them and the readers check them."""

    def __init__(self, stub: pb_grpc.SessionServiceStub, session_id: str, after: int) -> None:
        self.stub = stub
        self.session_id = session_id
        self.after = after

    def agent(self) -> tuple[int, dict[str, str]]:
        agent = self.stub.GetAgent(pb.GetAgentRequest(name="main"), timeout=CALL_TIMEOUT_S).agent
        return agent.version, dict(agent.memory)

    def session(self) -> tuple[int, tuple[int, int]]:
        request = pb.GetSessionStateRequest(agent="main", session_id=self.session_id)
        session = self.stub.GetSessionState(request, timeout=CALL_TIMEOUT_S).state.session
        return session.version, (session.message_count, session.last_sequence)

    def history(self) -> tuple[str, ...]:
        request = pb.GetHistoryRequest(agent="main", session_id=self.session_id, limit=1000)
        messages = self.stub.GetHistory(request, timeout=CALL_TIMEOUT_S).messages
        return tuple(m.message.content for m in messages)

    def log_page(self) -> tuple[int, ...]:
        request = pb.ListLogEventsRequest(
            after_sequence=self.after, agent="main", branch=pb.LOG_BRANCH_ACTIVE, page_size=1000
        )
        entries = self.stub.ListLogEvents(request, timeout=CALL_TIMEOUT_S).entries
        return tuple(entry.event.sequence for entry in entries)

    def record(self, states: _States, changed: str = "") -> None:
        """Reads back what a change of `changed` ("agent", "session"; "": anything) made."""
        if changed != "session":
            version, memory = self.agent()
            assert states.agents.setdefault(version, memory) == memory, f"agent v{version} twice"
        if changed != "agent":
            version, summary = self.session()
            assert states.sessions.setdefault(version, summary) == summary, f"session v{version}"
            states.histories.add(self.history())
        states.log_pages.add(self.log_page())

    def read_into(self, answers: _Answers) -> None:
        # GetAgent twice as often: a rewind tears it most easily.
        answers.agents.append(self.agent())
        answers.sessions.append(self.session())
        answers.agents.append(self.agent())
        answers.histories.append(self.history())
        answers.log_pages.append(self.log_page())


def _change(
    stub: pb_grpc.SessionServiceStub, session_id: str, rng: Random, marks: list[int]
) -> tuple[int, str]:
    """One change of the racer: its sequence (the log head after it), and what it
    changed ("agent", "session", or "" for anything)."""
    roll = rng.random()
    n = len(marks)
    if roll < 0.3:
        # Large values make a snapshot slow to read: the gap a rewind tears widens.
        value = f"{n}:" + "x" * MEMORY_VALUE_BYTES
        request = pb.PutMemoryRequest(agent="main", key=f"k{n % 7}", value=value)
        return int(stub.PutMemory(request, timeout=CALL_TIMEOUT_S).agent.last_sequence), "agent"
    if roll < 0.5:
        sequence = append(stub, session_id, user_message(f"m{n}")).events[-1].sequence
        return int(sequence), "session"
    target = rng.choice(marks[-20:])
    if roll < 0.8:
        try:
            rewound = stub.Rewind(pb.RewindRequest(sequence=target), timeout=CALL_TIMEOUT_S)
            return int(rewound.record.sequence) or marks[-1], ""
        except grpc.RpcError as error:
            if rpc_code(error) != grpc.StatusCode.FAILED_PRECONDITION:
                raise  # else the target lies on an abandoned branch: check it out instead
    moved = stub.Checkout(pb.CheckoutRequest(sequence=target), timeout=CALL_TIMEOUT_S)
    return int(moved.record.sequence) or marks[-1], ""


def _torn(answered: list[Any], existed: Callable[[Any], bool]) -> list[Any]:
    return [answer for answer in answered if not existed(answer)]


def test_reads_of_several_statements_are_never_torn_by_rewinds(
    database_url: str, processes: Processes
) -> None:
    rng = seeded("torn reads")
    replicas = [
        processes.server(database_url, "--snapshot-every", SNAPSHOT_EVERY, service="session")
        for _ in range(2)
    ]
    with (
        channel_to(replicas[0].address) as racer_channel,
        channel_to(replicas[1].address) as other_channel,
    ):
        channels = (racer_channel, other_channel)
        stub = pb_grpc.SessionServiceStub(racer_channel)
        create_agent(stub)
        session_id = resolve(stub, **web()).session.session_id
        start = append(stub, session_id, user_message("start")).events[-1].sequence
        racer = _Reads(stub, session_id, start)
        states = _States()
        racer.record(states)
        marks = [start]
        stop = threading.Event()
        answers = [_Answers() for _ in range(READERS)]
        failures: list[BaseException] = []

        def reader(index: int) -> None:
            reads = _Reads(pb_grpc.SessionServiceStub(channels[index % 2]), session_id, start)
            try:
                while not stop.is_set():
                    reads.read_into(answers[index])
            except BaseException as error:  # reported by the test, not lost on a thread
                failures.append(error)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
        for thread in threads:
            thread.start()
        try:
            until = time.monotonic() + ROUNDS * ROUND_S
            while time.monotonic() < until and not failures:
                sequence, changed = _change(stub, session_id, rng, marks)
                marks.append(sequence)
                racer.record(states, changed)
        finally:
            stop.set()
            join_all(threads)
    assert not failures, failures
    torn = {
        "GetAgent": _torn(
            [a for r in answers for a in r.agents], lambda a: states.agents.get(a[0]) == a[1]
        ),
        "GetSessionState": _torn(
            [s for r in answers for s in r.sessions], lambda s: states.sessions.get(s[0]) == s[1]
        ),
        "GetHistory": _torn(
            [h for r in answers for h in r.histories], states.histories.__contains__
        ),
        "ListLogEvents": _torn(
            [p for r in answers for p in r.log_pages], states.log_pages.__contains__
        ),
    }
    reads = sum(len(r.log_pages) for r in answers)
    changes = len(marks) - 1
    counts = {name: len(found) for name, found in torn.items()}
    print(f"{changes} changes, {reads} rounds of reads, torn answers: {counts}")
    assert changes > 10 and reads > 10, "the race did not run"
    assert not any(torn.values()), {name: found[:3] for name, found in torn.items() if found}
