"""Optimistic concurrency that holds with many writer threads and several replicas.

Each test races real calls on purpose, through three replicas of the service on one
database (on SQLite three servers on one file, on Postgres three servers with their
own connection pools and writer threads):

- racing appends with one `expected_version`: exactly one wins, the rest are ABORTED;
- inbox posts beside a running turn never abort it and never move its version back;
- versions rise, never repeat and never go back, also across rewinds and checkouts,
  so a version read before a rewind can never match after it (no ABA);
- creations race on unique keys: one agent, one session, one route, one checkpoint.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import grpc
import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import InProcessSession
from tests.session.conftest import StartSession, append, create_agent, resolve, user_message, web

REPLICAS = 3
RACERS = 8
#: Rounds of each race; SWITCHBOARD_RACE_ROUNDS=300 for a long run.
ROUNDS = int(os.environ.get("SWITCHBOARD_RACE_ROUNDS", "25"))


@pytest.fixture
def replicas(start_session: StartSession) -> list[InProcessSession]:
    servers = [start_session() for _ in range(REPLICAS)]
    create_agent(servers[0].stub, "main")
    return servers


def _channels(replicas: Sequence[InProcessSession], count: int) -> list[pb_grpc.SessionServiceStub]:
    """One channel per racer, spread over the replicas: no racer waits on another's HTTP/2
    connection, so the calls really arrive together."""
    stubs = []
    for index in range(count):
        channel = grpc.insecure_channel(replicas[index % len(replicas)].address)
        stubs.append(pb_grpc.SessionServiceStub(channel))
    return stubs


def _race(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Runs the calls at the same moment; each result or the RpcError it raised."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        start.wait()
        try:
            return call()
        except grpc.RpcError as error:
            return error

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _codes(results: Sequence[Any]) -> Counter[grpc.StatusCode]:
    return Counter(
        r.code() if isinstance(r, grpc.RpcError) else grpc.StatusCode.OK for r in results
    )


def _version(stub: pb_grpc.SessionServiceStub, session_id: str) -> int:
    request = pb.GetSessionRequest(agent="main", session_id=session_id)
    return stub.GetSession(request).session.version


def test_racing_appends_with_one_expected_version_have_exactly_one_winner(
    replicas: list[InProcessSession],
) -> None:
    session_id = resolve(replicas[0].stub, **web()).session.session_id
    stubs = _channels(replicas, RACERS)
    winners_per_round = []
    for round_index in range(ROUNDS):
        version = _version(stubs[0], session_id)
        calls = [
            partial(
                append,
                stub,
                session_id,
                user_message(f"r{round_index}-{i}"),
                expected_version=version,
            )
            for i, stub in enumerate(stubs)
        ]
        results = _race(calls)
        codes = _codes(results)
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.ABORTED}, codes
        winners_per_round.append(codes[grpc.StatusCode.OK])
        [won] = [r for r in results if not isinstance(r, grpc.RpcError)]
        assert won.version == version + 1
        assert _version(stubs[-1], session_id) == version + 1
    assert winners_per_round == [1] * ROUNDS
    state = (
        replicas[1]
        .stub.GetSessionState(pb.GetSessionStateRequest(agent="main", session_id=session_id))
        .state
    )
    assert state.session.message_count == ROUNDS


def test_inbox_posts_beside_a_turn_never_abort_it_nor_move_its_version_back(
    replicas: list[InProcessSession],
) -> None:
    session_id = resolve(replicas[0].stub, **web()).session.session_id
    writer, reader, *posters = _channels(replicas, 5)
    appends = 60
    stop = threading.Event()
    seen_versions: list[int] = []

    def post(stub: pb_grpc.SessionServiceStub) -> int:
        posted = 0
        while not stop.is_set():
            message = pb.Message(role=pb.ROLE_USER, content="ping", sender="peer:planner")
            stub.PostToInbox(
                pb.PostToInboxRequest(agent="main", session_id=session_id, message=message)
            )
            posted += 1
        return posted

    def watch_versions() -> None:
        while not stop.is_set():
            seen_versions.append(_version(reader, session_id))

    with ThreadPoolExecutor(len(posters) + 1) as pool:
        posting = [pool.submit(post, stub) for stub in posters]
        pool.submit(watch_versions)
        version = _version(writer, session_id)
        returned = []
        try:
            for index in range(appends):
                answer = append(
                    writer, session_id, user_message(f"turn {index}"), expected_version=version
                )
                version = answer.version
                returned.append(version)
        finally:
            stop.set()
        posts = sum(future.result() for future in posting)
    assert posts > 0
    assert returned == list(range(returned[0], returned[0] + appends))
    assert seen_versions == sorted(seen_versions), "GetSession went back"
    assert _version(reader, session_id) == 1 + appends
    inbox = (
        replicas[2]
        .stub.GetSessionState(pb.GetSessionStateRequest(agent="main", session_id=session_id))
        .state.inbox
    )
    assert len(inbox) == posts


def _watch_session(stub: pb_grpc.SessionServiceStub, session_id: str) -> list[pb.Event]:
    request = pb.WatchEventsRequest(agent="main", session_id=session_id)
    events = []
    call = stub.WatchEvents(request, timeout=3)
    try:
        for response in call:
            events.append(response.event)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return events


def test_a_version_read_before_a_rewind_never_matches_after_it(
    replicas: list[InProcessSession],
) -> None:
    stub = replicas[0].stub
    session_id = resolve(stub, **web()).session.session_id
    target = append(stub, session_id, user_message("one")).events[0].sequence
    stale = append(stub, session_id, user_message("two"), user_message("three")).version
    rewound = replicas[1].stub.Rewind(pb.RewindRequest(sequence=target)).record
    after_rewind = _version(stub, session_id)
    assert after_rewind > stale, "a rewind moves the version forward, never back"
    for text in ("again two", "again three"):
        append(replicas[2].stub, session_id, user_message(text))
    with pytest.raises(grpc.RpcError) as refused:
        append(stub, session_id, user_message("stale writer"), expected_version=stale)
    assert refused.value.code() == grpc.StatusCode.ABORTED
    checkout = stub.Checkout(pb.CheckoutRequest(sequence=rewound.sequence - 1)).record
    assert _version(stub, session_id) > after_rewind + 2
    assert checkout.rewound.checkout
    versions = [
        e.session_version
        for e in _watch_session(stub, session_id)
        if e.WhichOneof("body") not in _UNVERSIONED
    ]
    assert len(versions) == len(set(versions)), f"a version repeated: {versions}"
    assert versions == sorted(versions), f"a version went back: {versions}"


_UNVERSIONED = {"inbox_posted", "permission_checked", "resume_marked", "rewound"}


def test_agent_versions_move_forward_across_a_rewind(replicas: list[InProcessSession]) -> None:
    stub = replicas[0].stub
    before = stub.GetAgent(pb.GetAgentRequest(name="main")).agent
    stub.PutMemory(pb.PutMemoryRequest(agent="main", key="k", value="v"))
    grown = stub.GetAgent(pb.GetAgentRequest(name="main")).agent
    stub.Rewind(pb.RewindRequest(sequence=before.last_sequence))
    rewound = replicas[1].stub.GetAgent(pb.GetAgentRequest(name="main")).agent
    assert "k" not in rewound.memory
    assert rewound.version > grown.version
    # An agent created after the target is gone after the rewind; created again, it
    # starts above every version its first life had.
    head = stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="before-helper")).checkpoint
    first = create_agent(stub, "helper")
    stub.PutMemory(pb.PutMemoryRequest(agent="helper", key="k", value="v"))
    stub.Rewind(pb.RewindRequest(sequence=head.sequence))
    again = create_agent(replicas[2].stub, "helper")
    assert again.version > first.version + 1


def test_appends_racing_a_rewind_land_wholly_before_or_after_it(
    replicas: list[InProcessSession],
) -> None:
    session_id = resolve(replicas[0].stub, **web()).session.session_id
    target = append(replicas[0].stub, session_id, user_message("base")).events[0].sequence
    stubs = _channels(replicas, RACERS)
    calls: list[Callable[[], Any]] = [
        partial(append, stub, session_id, user_message(f"racer {i}"))
        for i, stub in enumerate(stubs[1:])
    ]
    calls.append(partial(stubs[0].Rewind, pb.RewindRequest(sequence=target)))
    results = _race(calls)
    assert _codes(results) == Counter({grpc.StatusCode.OK: RACERS})
    rewind_seq = results[-1].record.sequence
    after = [r for r in results[:-1] if r.events[0].sequence > rewind_seq]
    state = (
        replicas[1]
        .stub.GetSessionState(pb.GetSessionStateRequest(agent="main", session_id=session_id))
        .state
    )
    assert state.session.message_count == 1 + len(after)
    before_versions = [r.version for r in results[:-1] if r.events[0].sequence < rewind_seq]
    assert all(r.version > max(before_versions, default=0) for r in after)


def test_creations_race_on_unique_keys(replicas: list[InProcessSession]) -> None:
    stubs = _channels(replicas, RACERS)

    agents = _race([partial(create_agent, s, "twin") for s in stubs])
    assert _codes(agents) == Counter(
        {grpc.StatusCode.OK: 1, grpc.StatusCode.ALREADY_EXISTS: RACERS - 1}
    )

    spawned = _race(
        [
            partial(s.SpawnSession, pb.SpawnSessionRequest(agent="main", session_id="chosen"))
            for s in stubs
        ]
    )
    assert _codes(spawned) == Counter(
        {grpc.StatusCode.OK: 1, grpc.StatusCode.ALREADY_EXISTS: RACERS - 1}
    )

    resolved = _race([partial(resolve, s, **web("first-contact")) for s in stubs])
    assert _codes(resolved) == Counter({grpc.StatusCode.OK: RACERS})
    assert len({r.session.session_id for r in resolved}) == 1
    assert sum(r.created for r in resolved) == 1

    labels = _race(
        [partial(s.CreateCheckpoint, pb.CreateCheckpointRequest(label="release")) for s in stubs]
    )
    assert _codes(labels) == Counter(
        {grpc.StatusCode.OK: 1, grpc.StatusCode.ALREADY_EXISTS: RACERS - 1}
    )
