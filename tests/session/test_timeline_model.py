"""Hypothesis: random appends, checkpoints, rewinds, checkouts and restarts; the service's
state always equals an independent model that keeps a copy of the world per sequence."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from session_service import timeline
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import EventLoopThread, InProcessSession, postgres_schema, session_server
from tests.session.conftest import append, create_agent, resolve, user_message, web

SESSIONS = ("tab-a", "tab-b")


@dataclass
class World:
    """What the service should show: each tab's session and its history, and memory."""

    sessions: dict[str, str] = field(default_factory=dict)  # tab -> session id
    histories: dict[str, list[str]] = field(default_factory=dict)  # session id -> texts
    memory: dict[str, str] = field(default_factory=dict)


class TimelineMachine(RuleBasedStateMachine):
    """The model keeps the whole world after every sequence (no interval arithmetic), so
    a rewind or checkout to N is simply "the world as it was at N"."""

    #: Opens a fresh, empty database for one example and returns its URL.
    fresh_database: Callable[[ExitStack], str]
    loop: EventLoopThread

    def __init__(self) -> None:
        super().__init__()
        self.databases = ExitStack()
        self.url = type(self).fresh_database(self.databases)
        self.stack = ExitStack()
        self.world = World()
        self.world_at: dict[int, World] = {}
        self.on_branch: set[int] = set()  # sequences whose event is active now
        self.active_at: dict[int, set[int]] = {}
        self.ever_created: set[str] = set()
        self.checkpoints: dict[str, int] = {}
        self.head = 0
        self.counter = 0

    def _start(self) -> None:
        self.server: InProcessSession = self.stack.enter_context(
            session_server(self.loop, self.url)
        )

    def _record(self, seq: int) -> None:
        self.head = seq
        self.on_branch.add(seq)
        self.world_at[seq] = copy.deepcopy(self.world)
        self.active_at[seq] = set(self.on_branch)

    @initialize()
    def setup(self) -> None:
        self._start()
        created = create_agent(self.server.stub)
        self._record(created.last_sequence)

    def teardown(self) -> None:
        self.stack.close()
        self.databases.close()

    @rule(tab=st.sampled_from(SESSIONS), count=st.integers(1, 3))
    def append_messages(self, tab: str, count: int) -> None:
        resolved = resolve(self.server.stub, **web(tab))
        session_id = resolved.session.session_id
        if tab in self.world.sessions:
            assert (session_id, resolved.created) == (self.world.sessions[tab], False)
        else:
            assert resolved.created, "a tab without a session in this world gets a new one"
            self.world.sessions[tab] = session_id
            self.world.histories[session_id] = []
            self.ever_created.add(session_id)
            self._record(resolved.session.last_sequence)
        texts = [f"m{self.counter + i}" for i in range(count)]
        self.counter += count
        events = append(self.server.stub, session_id, *map(user_message, texts)).events
        for text, event in zip(texts, events, strict=True):
            self.world.histories[session_id].append(text)
            self._record(event.sequence)

    @rule(key=st.sampled_from(["a", "b"]))
    def put_memory(self, key: str) -> None:
        self.counter += 1
        agent = self.server.stub.PutMemory(
            pb.PutMemoryRequest(agent="main", key=key, value=f"v{self.counter}")
        ).agent
        self.world.memory[key] = f"v{self.counter}"
        self._record(agent.last_sequence)

    @rule(data=st.data())
    def rewind(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(sorted(self.on_branch)))
        record = self.server.stub.Rewind(pb.RewindRequest(sequence=target)).record
        self._move(target, record.sequence)

    @rule()
    def checkpoint(self) -> None:
        label = f"cp{len(self.checkpoints)}"
        made = self.server.stub.CreateCheckpoint(pb.CreateCheckpointRequest(label=label))
        # A move's RewindApplied records follow its rewind record; they change no state.
        assert made.checkpoint.sequence >= self.head
        self._record(made.checkpoint.sequence)
        self.checkpoints[label] = self.head

    @rule(data=st.data())
    def rewind_to_checkpoint(self, data: st.DataObject) -> None:
        usable = sorted(label for label, seq in self.checkpoints.items() if seq in self.on_branch)
        if not usable:
            return
        label = data.draw(st.sampled_from(usable))
        record = self.server.stub.Rewind(pb.RewindRequest(checkpoint=label)).record
        self._move(self.checkpoints[label], record.sequence)

    @rule(data=st.data())
    def checkout(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(sorted(self.world_at)))
        record = self.server.stub.Checkout(pb.CheckoutRequest(sequence=target)).record
        self._move(target, record.sequence)

    def _move(self, target: int, record: int) -> None:
        if record <= self.head:
            return  # an idempotent repeat: nothing was appended
        self.world = copy.deepcopy(self.world_at[target])
        self.on_branch = set(self.active_at[target])
        self._record(record)

    @rule(data=st.data())
    def rewind_into_abandoned_is_refused(self, data: st.DataObject) -> None:
        abandoned = sorted(set(self.world_at) - self.on_branch)
        if not abandoned:
            return
        target = data.draw(st.sampled_from(abandoned))
        with pytest.raises(grpc.RpcError) as refused:
            self.server.stub.Rewind(pb.RewindRequest(sequence=target))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    @rule()
    def restart(self) -> None:
        self.stack.close()
        self.stack = ExitStack()
        self._start()

    @invariant()
    def service_matches_the_model(self) -> None:
        stub = self.server.stub
        for session_id in self.ever_created:
            request = pb.GetHistoryRequest(agent="main", session_id=session_id, limit=1000)
            if session_id in self.world.histories:
                history = stub.GetHistory(request).messages
                expected = self.world.histories[session_id]
                assert [m.message.content for m in history] == expected
            else:
                with pytest.raises(grpc.RpcError) as gone:
                    stub.GetHistory(request)
                assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        agent = stub.GetAgent(pb.GetAgentRequest(name="main")).agent
        assert dict(agent.memory) == self.world.memory


def test_timeline_matches_the_model(
    database_url: str, loop_thread: EventLoopThread, tmp_path: Path
) -> None:
    examples = itertools.count()

    def fresh_database(stack: ExitStack) -> str:
        if database_url.startswith("sqlite:///"):
            return f"sqlite:///{tmp_path / f'example-{next(examples)}.sqlite3'}"
        return stack.enter_context(postgres_schema())

    TimelineMachine.fresh_database = staticmethod(fresh_database)
    TimelineMachine.loop = loop_thread
    run_state_machine_as_test(
        TimelineMachine,
        settings=settings(
            max_examples=10,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_interval_arithmetic_examples() -> None:
    # events 1..10; rewind to 5 at 11; checkout to 8 at 20 undoes it.
    rewound = timeline.Timeline.from_records([(11, 5)])
    assert [rewound.is_active(s) for s in (5, 6, 10, 11, 12)] == [True, False, False, True, True]
    undone = timeline.Timeline.from_records([(11, 5), (20, 8)])
    assert [undone.is_active(s) for s in (6, 8, 9, 11, 19, 20)] == [
        True, True, False, False, False, True,
    ]  # fmt: skip
